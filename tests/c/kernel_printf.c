/* A kernel's printf: kernels print lines that identify their work-items, and the host prints
 * its own line after each synchronisation point (every kind: clFinish, clWaitForEvents, a
 * blocking read, a blocking map, polling the event's status, an event callback). Run natively
 * and through Wormhole, stdout must be the same, line for line.
 *   kernel_printf            the sequence above
 *   kernel_printf async      a kernel is flushed, the host sleeps without synchronising, then
 *                            prints: the kernel's lines come first (as natively)
 *   kernel_printf file PATH  the sequence, with the application's stdout redirected to PATH */
#include "common.h"
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static const char *SRC =
    "__kernel void hello(int k, __global float *out) {\n"
    "    int i = get_global_id(0);\n"
    "    out[i] = k * 10.0f + i * 0.5f;\n"
    "    printf(\"kernel %d item %d of %d: %.2f\\n\", k, i, (int)get_global_size(0), out[i]);\n"
    "    if (i == 0) printf(\"kernel %d says %s\\n\", k, \"hello\");\n"
    "}\n";

static atomic_int called;

static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *ud) {
    (void)e;
    (void)ud;
    printf("host: callback, status %d\n", status);
    atomic_store(&called, 1);
}

static cl_context ctx;
static cl_command_queue q;
static cl_kernel kern;
static cl_mem out;

/* Enqueues kernel k over `items` work-items in one work-group (so its lines come in order). */
static cl_event launch(int k, size_t items) {
    cl_event ev;
    CHECK(clSetKernelArg(kern, 0, sizeof k, &k));
    CHECK(clEnqueueNDRangeKernel(q, kern, 1, NULL, &items, &items, 0, NULL, &ev));
    return ev;
}

static void sequence(void) {
    float got[16];
    cl_event ev = launch(0, 4);
    CHECK(clFinish(q));
    printf("host: after clFinish\n");
    clReleaseEvent(ev);

    ev = launch(1, 3);
    CHECK(clWaitForEvents(1, &ev));
    printf("host: after clWaitForEvents\n");
    clReleaseEvent(ev);

    ev = launch(2, 5);
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
    printf("host: after a blocking read, item 4 = %.2f\n", got[4]);
    clReleaseEvent(ev);

    ev = launch(3, 2);
    cl_int err;
    float *m = clEnqueueMapBuffer(q, out, CL_TRUE, CL_MAP_READ, 0, sizeof got, 0, NULL, NULL, &err);
    CHECK(err);
    printf("host: after a blocking map, item 1 = %.2f\n", m[1]);
    CHECK(clEnqueueUnmapMemObject(q, out, m, 0, NULL, NULL));
    CHECK(clFinish(q));
    clReleaseEvent(ev);

    ev = launch(4, 4);
    CHECK(clFlush(q));
    cl_int st = CL_QUEUED;
    while (st != CL_COMPLETE) {
        CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
        EXPECT(st >= 0);
    }
    printf("host: after the event's status said complete\n");
    clReleaseEvent(ev);

    ev = launch(5, 16);
    CHECK(clSetEventCallback(ev, CL_COMPLETE, on_complete, NULL));
    CHECK(clFlush(q));
    for (int i = 0; i < 1000 && !atomic_load(&called); i++) usleep(10000);
    EXPECT(atomic_load(&called));
    printf("host: after the callback\n");
    CHECK(clFinish(q));
    clReleaseEvent(ev);
}

int main(int argc, char **argv) {
    /* Unbuffered, so the host's lines land where it prints them (the driver writes its own
     * straight to fd 1). */
    setvbuf(stdout, NULL, _IONBF, 0);
    cl_device_id d;
    open_queue(&d, &ctx, &q);
    cl_program prog = build(ctx, d, SRC);
    cl_int err;
    kern = clCreateKernel(prog, "hello", &err);
    CHECK(err);
    out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16 * sizeof(float), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(kern, 1, sizeof out, &out));
    const char *mode = argc > 1 ? argv[1] : "sync";
    if (!strcmp(mode, "async")) {
        cl_event ev = launch(7, 3);
        CHECK(clFlush(q));
        /* No synchronisation: the kernel's lines arrive by themselves, as natively. */
        sleep(2);
        printf("host: after sleeping\n");
        clReleaseEvent(ev);
    } else if (!strcmp(mode, "file") && argc > 2) {
        printf("host: writing to %s\n", argv[2]);
        EXPECT(freopen(argv[2], "w", stdout) != NULL);
        setvbuf(stdout, NULL, _IONBF, 0);
        sequence();
    } else {
        sequence();
    }
    clReleaseMemObject(out);
    clReleaseKernel(kern);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    fprintf(stderr, "kernel_printf %s done\n", mode);
    return 0;
}
