/* Several threads enqueue on their own queues at once, each checking its own results. */
#include "common.h"
#include <pthread.h>

static const char *SRC =
    "__kernel void scale(__global int *x, int f) { size_t i = get_global_id(0); x[i] = x[i] * f + (int)i; }\n";

enum { THREADS = 6, N = 4096, ROUNDS = 50 };
static cl_context ctx;
static cl_device_id dev;
static cl_program prog;

static void *worker(void *arg) {
    int id = (int)(size_t)arg;
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_kernel k = clCreateKernel(prog, "scale", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    CHECK(err);
    int host[N];
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N; i++) host[i] = id * 1000 + r;
        CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL));
        int f = id + 2;
        CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
        CHECK(clSetKernelArg(k, 1, sizeof f, &f));
        size_t g = N;
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
        int out[N];
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
        for (int i = 0; i < N; i++) EXPECT(out[i] == (id * 1000 + r) * f + i);
    }
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseCommandQueue(q);
    return NULL;
}

int main(void) {
    cl_platform_id p;
    first_device(&p, &dev);
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    prog = build(ctx, dev, SRC);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    printf("multithread: %d threads x %d rounds OK\n", THREADS, ROUNDS);
    clReleaseProgram(prog);
    clReleaseContext(ctx);
    return 0;
}
