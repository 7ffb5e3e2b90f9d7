/* Non-blocking writes that repeat one the driver accepted (the same buffer and queue, no wait
 * list, in range) keep their place in the queue and their data: each round writes a new
 * pattern behind a kernel still running, adds to it with another kernel, and reads it back
 * without blocking, for buffers of 4 to 64 KiB and a sub-buffer (what a pipelined write
 * carries is bounded by the transport's ring); the reads land by the finish. Through
 * Wormhole such writes are sent without waiting; what the driver refuses is still refused at
 * the call, writes and reads alike (a range past the end, a buffer the host may not write or
 * read, a NULL pointer), and an event of one completes with its data there.
 * Rounds: argv[1] (default 100). Prints "pipelined transfers OK". */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void slow_add(__global int *b, int v, int spin) {\n"
    "    int x = get_global_id(0);\n"
    "    for (int i = 0; i < spin; i++) x = x * 1103515245 + 12345;\n"
    "    b[get_global_id(0)] += x == 0x7fffffff ? -1 : v;\n"
    "}\n";

enum { SLOTS = 4 };

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_program prog = build(ctx, dev, SRC);
    cl_kernel k = clCreateKernel(prog, "slow_add", &err);
    CHECK(err);
    size_t sizes[] = {4 << 10, 16 << 10, 64 << 10};
    for (int s = 0; s < 4; s++) {
        /* The fourth case: the second half of a 64 KiB buffer, as a sub-buffer. */
        int sub = s == 3;
        size_t bytes = sub ? 32 << 10 : sizes[s], n = bytes / sizeof(int);
        cl_mem parent = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sub ? 2 * bytes : bytes, NULL, &err);
        CHECK(err);
        cl_mem b = parent;
        if (sub) {
            cl_buffer_region region = {bytes, bytes};
            b = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
            CHECK(err);
        }
        /* Host memory of SLOTS rounds in flight: a write's source and a read's destination
         * are not touched until the finish that covers them. */
        int *src[SLOTS], *dst[SLOTS];
        for (int i = 0; i < SLOTS; i++) {
            src[i] = malloc(bytes);
            dst[i] = malloc(bytes);
            EXPECT(src[i] && dst[i]);
        }
        int spin = (int)((4u << 20) / n);
        CHECK(clSetKernelArg(k, 0, sizeof b, &b));
        CHECK(clSetKernelArg(k, 2, sizeof spin, &spin));
        for (int r = 0; r < rounds; r++) {
            int slot = r % SLOTS, v = 7 + r;
            for (size_t i = 0; i < n; i++) src[slot][i] = (int)(i * 31 + r);
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, src[slot], 0, NULL, NULL));
            CHECK(clSetKernelArg(k, 1, sizeof v, &v));
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, dst[slot], 0, NULL, NULL));
            if (slot == SLOTS - 1 || r == rounds - 1) {
                CHECK(clFinish(q));
                for (int d = r - slot; d <= r; d++) {
                    for (size_t i = 0; i < n; i++) {
                        int want = (int)(i * 31 + d) + 7 + d;
                        if (dst[d % SLOTS][i] != want) {
                            fprintf(stderr, "%zu bytes%s, round %d: [%zu] = %d, expected %d\n", bytes,
                                    sub ? " (sub-buffer)" : "", d, i, dst[d % SLOTS][i], want);
                            return 1;
                        }
                    }
                }
            }
        }
        /* Refused at the call, however many transfers of the buffer went before. */
        EXPECT(clEnqueueWriteBuffer(q, b, CL_FALSE, 4, bytes, src[0], 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, NULL, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadBuffer(q, b, CL_FALSE, 4, bytes, dst[0], 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, NULL, 0, NULL, NULL) == CL_INVALID_VALUE);
        /* A write, then a read, with events: each completes with its transfer, the read's
         * bytes there once its event says so. */
        cl_event ev;
        for (size_t i = 0; i < n; i++) src[0][i] = (int)(i ^ 0x5a5a);
        CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, src[0], 0, NULL, &ev));
        CHECK(clWaitForEvents(1, &ev));
        cl_int status = 1;
        CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
        EXPECT(status == CL_COMPLETE);
        CHECK(clReleaseEvent(ev));
        memset(dst[1], 0, bytes);
        CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, dst[1], 0, NULL, &ev));
        CHECK(clWaitForEvents(1, &ev));
        CHECK(clReleaseEvent(ev));
        for (size_t i = 0; i < n; i++) EXPECT(dst[1][i] == (int)(i ^ 0x5a5a));
        for (int i = 0; i < SLOTS; i++) {
            free(src[i]);
            free(dst[i]);
        }
        if (sub) CHECK(clReleaseMemObject(b));
        CHECK(clReleaseMemObject(parent));
    }
    /* A buffer the host may only read: every write is refused, the tenth as the first, while
     * reads go; and the other way round. */
    int host[16] = {0};
    cl_mem ro = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY, sizeof host, NULL, &err);
    CHECK(err);
    cl_mem wo = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_WRITE_ONLY, sizeof host, NULL, &err);
    CHECK(err);
    for (int i = 0; i < 10; i++) {
        EXPECT(clEnqueueWriteBuffer(q, ro, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL) == CL_INVALID_OPERATION);
        CHECK(clEnqueueReadBuffer(q, ro, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL));
        EXPECT(clEnqueueReadBuffer(q, wo, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL) == CL_INVALID_OPERATION);
        CHECK(clEnqueueWriteBuffer(q, wo, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL));
        CHECK(clFinish(q));
    }
    CHECK(clReleaseMemObject(ro));
    CHECK(clReleaseMemObject(wo));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("pipelined transfers OK\n");
    return 0;
}
