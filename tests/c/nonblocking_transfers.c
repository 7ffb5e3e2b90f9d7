/* Non-blocking reads and writes of a buffer keep their place in the queue: behind a kernel
 * still running they see (or overwrite) what it wrote, on an idle queue they take effect at
 * once, and one after a kernel enqueued since the queue was last seen idle waits for it.
 * Through Wormhole, large buffers of a CPU device are copied by the client itself when their
 * queue is idle (`arena::direct`), so each case runs where that applies and where it must not.
 * Reads land in the application's memory at synchronisation points: a later read into the
 * same memory must stay, and a write from memory a read fills must send what the read
 * brought (as natively, where the driver reads that memory when the write runs).
 *
 * Usage: nonblocking_transfers [hold]. Prints "nonblocking transfers OK"; with "hold", then
 * waits for stdin to close (the session stays open for a look at the server's status). */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void slow_fill(__global int *b, int v, int spin) {\n"
    "    int x = get_global_id(0);\n"
    "    for (int i = 0; i < spin; i++) x = x * 1103515245 + 12345;\n"
    "    b[get_global_id(0)] = x == 0x7fffffff ? -1 : v;\n"
    "}\n";

static cl_command_queue q;
static cl_kernel k;
static int round_; /* for the messages */

/* A kernel that sets every one of `n` ints of `b` to `v`, some tens of ms after it starts. */
static void slow_fill(cl_mem b, size_t n, int v) {
    int spin = (int)((64u << 20) / n);
    CHECK(clSetKernelArg(k, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
    CHECK(clSetKernelArg(k, 2, sizeof spin, &spin));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clFlush(q));
}

static void expect_all(const int *h, size_t n, int v, const char *what, size_t bytes) {
    for (size_t i = 0; i < n; i++) {
        if (h[i] != v) {
            fprintf(stderr, "%zu bytes, round %d, %s: [%zu] = %d, expected %d\n", bytes, round_,
                    what, i, h[i], v);
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    cl_device_id dev;
    cl_context ctx;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    k = clCreateKernel(prog, "slow_fill", &err);
    CHECK(err);
    size_t sizes[] = {4 << 10, 256 << 10, 4 << 20};
    for (int s = 0; s < 3; s++) {
        size_t bytes = sizes[s], n = bytes / sizeof(int);
        cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        CHECK(err);
        cl_mem b2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        CHECK(err);
        int *h = malloc(bytes), *got = malloc(bytes);
        EXPECT(h && got);
        for (int round = 0; round < 3; round++) {
            round_ = round;
            /* A write behind a running kernel lands after it. */
            slow_fill(b, n, 1);
            for (size_t i = 0; i < n; i++) h[i] = 2;
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, NULL));
            CHECK(clFinish(q));
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
            expect_all(got, n, 2, "write behind a kernel", bytes);
            /* A read behind a running kernel sees what it wrote. */
            slow_fill(b, n, 3);
            memset(got, 0, bytes);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, got, 0, NULL, NULL));
            CHECK(clFinish(q));
            expect_all(got, n, 3, "read behind a kernel", bytes);
            /* On an idle queue (just finished): a write, then a read of it, in order. */
            for (size_t i = 0; i < n; i++) h[i] = 4;
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, NULL));
            memset(got, 0, bytes);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, got, 0, NULL, NULL));
            CHECK(clFinish(q));
            expect_all(got, n, 4, "read after a write", bytes);
            /* The queue was idle after that write; a kernel enqueued since makes it busy. */
            for (size_t i = 0; i < n; i++) h[i] = 5;
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, NULL));
            slow_fill(b, n, 6);
            memset(got, 0, bytes);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, got, 0, NULL, NULL));
            for (size_t i = 0; i < n; i++) h[i] = 7;
            CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, NULL));
            CHECK(clFinish(q));
            expect_all(got, n, 6, "read behind a kernel after a write", bytes);
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
            expect_all(got, n, 7, "write behind a read", bytes);
            /* Reads into the same memory land in queue order: the later one's bytes stay. */
            slow_fill(b, n, 8);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, got, 0, NULL, NULL));
            slow_fill(b, n, 9);
            CHECK(clEnqueueReadBuffer(q, b, round == 0, 0, bytes, got, 0, NULL, NULL));
            CHECK(clFinish(q));
            expect_all(got, n, 9, "read after a read into the same memory", bytes);
            /* A write from memory a read before it fills sends what the read brought. */
            slow_fill(b, n, 10);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, NULL));
            CHECK(clEnqueueWriteBuffer(q, b, round == 0, 0, bytes, h, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
            expect_all(got, n, 10, "write from a read's memory", bytes);
            /* The same on another queue, ordered by the read's event (a copy between devices
             * through the host), and from memory two reads fill. */
            slow_fill(b, n, 11);
            cl_event read_done;
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes, h, 0, NULL, &read_done));
            CHECK(clEnqueueWriteBuffer(q2, b2, CL_FALSE, 0, bytes, h, 1, &read_done, NULL));
            CHECK(clFinish(q2));
            CHECK(clReleaseEvent(read_done));
            CHECK(clEnqueueReadBuffer(q2, b2, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
            expect_all(got, n, 11, "write on another queue after a read", bytes);
            slow_fill(b, n, 12);
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, bytes / 2, h, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, bytes / 2, bytes / 2, (char *)h + bytes / 2, 0, NULL, NULL));
            CHECK(clEnqueueWriteBuffer(q, b2, round == 0, 0, bytes, h, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, b2, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
            expect_all(got, n, 12, "write from two reads' memory", bytes);
        }
        free(h);
        free(got);
        CHECK(clReleaseMemObject(b));
        CHECK(clReleaseMemObject(b2));
    }
    printf("nonblocking transfers OK\n");
    fflush(stdout);
    hold_if_asked(argc, argv);
    return 0;
}
