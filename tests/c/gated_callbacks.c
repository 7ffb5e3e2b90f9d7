/* Commands gated by a user event, each with CL_SUBMITTED, CL_RUNNING and CL_COMPLETE callbacks
 * (the conformance suite's events/callbacks): a kernel, a non-blocking read, write, map and an
 * unmap, of 64 MiB and small buffers, plain and CL_MEM_ALLOC_HOST_PTR. Every callback must fire,
 * clWaitForEvents and clFinish must return (a non-blocking map once waited for the gate on the
 * server: a hang), and the data read or mapped must be the buffer's. argv[1]: the large size. */
#include "common.h"
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static atomic_int fired[3];
static atomic_int wrong_status;
static const cl_int kinds[3] = {CL_SUBMITTED, CL_RUNNING, CL_COMPLETE};

static void CL_CALLBACK on_status(cl_event e, cl_int status, void *ud) {
    (void)e;
    int k = (int)(size_t)ud;
    /* The status passed is the one asked for (or an error, which is a failure here). */
    if (status != kinds[k]) atomic_store(&wrong_status, 1);
    atomic_fetch_add(&fired[k], 1);
}

static int all_fired(void) {
    for (int i = 0; i < 100; i++) {
        if (atomic_load(&fired[0]) && atomic_load(&fired[1]) && atomic_load(&fired[2])) return 1;
        usleep(100000);
    }
    return 0;
}

enum { KERNEL, READ, WRITE, MAP, UNMAP, ACTIONS };
static const char *names[ACTIONS] = {"kernel", "read", "write", "map", "unmap"};

static int check_bytes(const char *what, const unsigned char *p, size_t n, unsigned char want) {
    for (size_t i = 0; i < n; i += 4093)
        if (p[i] != want) {
            fprintf(stderr, "%s: byte %zu is %d, not %d\n", what, i, p[i], want);
            return 0;
        }
    if (n && p[n - 1] != want) {
        fprintf(stderr, "%s: last byte is %d, not %d\n", what, p[n - 1], want);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    size_t sizes[2] = {argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)64 << 20, 1000};
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_program prog = build(ctx, d,
                            "__kernel void k(__global int *a) { int i = get_global_id(0);"
                            " for (int j = 0; j < 1000; j++) a[i] = a[i] * 3 + j; }");
    cl_kernel k = clCreateKernel(prog, "k", &err);
    CHECK(err);
    /* Large plain buffers live in the session's arena over shared memory; host-pointer ones
     * and small ones keep driver storage: both kinds of path. */
    const cl_mem_flags kinds_of_buffer[2] = {CL_MEM_ALLOC_HOST_PTR, 0};
    for (int f = 0; f < 2; f++)
    for (int s = 0; s < 2; s++)
    for (int a = 0; a < ACTIONS; a++) {
        size_t size = sizes[s];
        unsigned char *host = malloc(size);
        EXPECT(host != NULL);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | kinds_of_buffer[f], size, NULL, &err);
        CHECK(err);
        /* The buffer holds 5, the host 7: a read or map must bring 5, a write leave 7. */
        memset(host, 5, size);
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, size, host, 0, NULL, NULL));
        memset(host, 7, size);
        void *mapped = NULL;
        if (a == UNMAP) {
            mapped = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ, 0, size, 0, NULL, NULL, &err);
            CHECK(err);
        }
        cl_event gate = clCreateUserEvent(ctx, &err);
        CHECK(err);
        cl_event ev = NULL;
        switch (a) {
        case KERNEL: {
            size_t n = size / 4 < 1000 ? size / 4 : 1000;
            CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 1, &gate, &ev));
            break;
        }
        case READ:
            CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, size, host, 1, &gate, &ev));
            break;
        case WRITE:
            CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, size, host, 1, &gate, &ev));
            break;
        case MAP:
            mapped = clEnqueueMapBuffer(q, buf, CL_FALSE, CL_MAP_READ, 0, size, 1, &gate, &ev, &err);
            CHECK(err);
            break;
        case UNMAP:
            CHECK(clEnqueueUnmapMemObject(q, buf, mapped, 1, &gate, &ev));
            mapped = NULL;
            break;
        }
        for (int i = 0; i < 3; i++) {
            atomic_store(&fired[i], 0);
            CHECK(clSetEventCallback(ev, kinds[i], on_status, (void *)(size_t)i));
        }
        CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
        CHECK(clWaitForEvents(1, &ev));
        if (a == READ && !check_bytes("read", host, size, 5)) return 1;
        if (a == MAP && !check_bytes("map", mapped, size, 5)) return 1;
        if (!all_fired()) {
            fprintf(stderr, "%s: callbacks fired: submitted %d running %d complete %d\n", names[a],
                    atomic_load(&fired[0]), atomic_load(&fired[1]), atomic_load(&fired[2]));
            return 1;
        }
        CHECK(clFinish(q));
        if (mapped) CHECK(clEnqueueUnmapMemObject(q, buf, mapped, 0, NULL, NULL));
        CHECK(clFinish(q));
        if (a == WRITE) {
            memset(host, 0, size);
            CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, host, 0, NULL, NULL));
            if (!check_bytes("write", host, size, 7)) return 1;
        }
        for (int i = 0; i < 3; i++) EXPECT(atomic_load(&fired[i]) == 1);
        CHECK(clReleaseEvent(ev));
        CHECK(clReleaseEvent(gate));
        CHECK(clReleaseMemObject(buf));
        free(host);
        printf("%s of %zu bytes: all callbacks\n", names[a], size);
    }
    EXPECT(!atomic_load(&wrong_status));

    /* Non-blocking SVM map and copy to the host behind a gate: they return at once, and the
     * bytes are there once the event completes. */
    cl_device_svm_capabilities caps = 0;
    clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL);
    if (caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER) {
        size_t n = sizes[0];
        unsigned char *svm = clSVMAlloc(ctx, CL_MEM_READ_WRITE, n, 0);
        EXPECT(svm != NULL);
        unsigned char *host = malloc(n);
        EXPECT(host != NULL);
        memset(host, 9, n);
        CHECK(clEnqueueSVMMemcpy(q, CL_TRUE, svm, host, n, 0, NULL, NULL));
        memset(host, 0, n);
        for (int copy = 0; copy < 2; copy++) {
            cl_event gate = clCreateUserEvent(ctx, &err), ev;
            CHECK(err);
            if (copy)
                CHECK(clEnqueueSVMMemcpy(q, CL_FALSE, host, svm, n, 1, &gate, &ev));
            else
                CHECK(clEnqueueSVMMap(q, CL_FALSE, CL_MAP_READ, svm, n, 1, &gate, &ev));
            CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
            CHECK(clWaitForEvents(1, &ev));
            if (!check_bytes(copy ? "svm copy" : "svm map", copy ? host : svm, n, 9)) return 1;
            if (!copy) CHECK(clEnqueueSVMUnmap(q, svm, 0, NULL, NULL));
            CHECK(clFinish(q));
            CHECK(clReleaseEvent(ev));
            CHECK(clReleaseEvent(gate));
        }
        /* A blocking SVM copy is a synchronisation point: a non-blocking read before it on
         * the queue has landed when it returns (it was collected only at the next clFinish). */
        cl_mem src = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
        CHECK(err);
        unsigned char eights[4096];
        memset(eights, 8, sizeof eights);
        CHECK(clEnqueueWriteBuffer(q, src, CL_TRUE, 0, sizeof eights, eights, 0, NULL, NULL));
        unsigned char landed[4096] = {0};
        CHECK(clEnqueueReadBuffer(q, src, CL_FALSE, 0, sizeof landed, landed, 0, NULL, NULL));
        CHECK(clEnqueueSVMMemcpy(q, CL_TRUE, host, svm, 16, 0, NULL, NULL));
        if (!check_bytes("read before a blocking SVM copy", landed, sizeof landed, 8)) return 1;
        CHECK(clReleaseMemObject(src));
        clSVMFree(ctx, svm);
        free(host);
        printf("svm map and copy: gated, data OK\n");
    }

    /* A writing map unmapped before it was waited for leaves the buffer as it was (the client
     * sent back memory that never received the buffer's bytes). */
    {
        size_t n = 64 << 10;
        unsigned char *bytes = malloc(n);
        EXPECT(bytes != NULL);
        memset(bytes, 3, n);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
        CHECK(err);
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, n, bytes, 0, NULL, NULL));
        cl_event gate = clCreateUserEvent(ctx, &err);
        CHECK(err);
        void *m = clEnqueueMapBuffer(q, buf, CL_FALSE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 1, &gate, NULL, &err);
        CHECK(err);
        CHECK(clEnqueueUnmapMemObject(q, buf, m, 0, NULL, NULL));
        CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
        memset(bytes, 0, n);
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, bytes, 0, NULL, NULL));
        if (!check_bytes("unwaited writing map", bytes, n, 3)) return 1;
        CHECK(clReleaseEvent(gate));
        CHECK(clReleaseMemObject(buf));
        free(bytes);
        printf("unwaited writing map: buffer kept\n");
    }
    printf("OK\n");
    return 0;
}
