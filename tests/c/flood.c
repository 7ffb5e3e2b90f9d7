/* A tenant that floods its device with CPU-bound kernels, for the fairness tests.
 * flood ITERS INFLIGHT: prints "ready" once a kernel ran, then keeps INFLIGHT kernels enqueued
 * (one more as soon as the oldest completes), so the tenant is never idle. Each line on stdin ("mark") prints the kernels
 * completed so far and the time (CLOCK_MONOTONIC, s); EOF ends it. Throughput between two
 * marks is their difference, with both tenants busy throughout. */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

static const char *SRC =
    "__kernel void spin(__global float *out, int iters) {\n"
    "    float x = (float)get_global_id(0), y = 1.0f;\n"
    "    for (int i = 0; i < iters; i++) { y = y * 0.999f + x; x = x * 0.5f + 1.0f; }\n"
    "    out[get_global_id(0)] = x + y;\n"
    "}\n";

static atomic_long completed;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *marks(void *arg) {
    (void)arg;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        printf("%ld %.6f\n", atomic_load(&completed), now());
        fflush(stdout);
    }
    exit(0);
}

int main(int argc, char **argv) {
    EXPECT(argc == 3);
    cl_int iters = atoi(argv[1]);
    int inflight = atoi(argv[2]);
    EXPECT(inflight >= 1 && inflight <= 64);
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_program prog = build(ctx, dev, SRC);
    cl_kernel k = clCreateKernel(prog, "spin", &err);
    CHECK(err);
    size_t global = 16;
    cl_mem out = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, global * sizeof(float), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    CHECK(clSetKernelArg(k, 1, sizeof iters, &iters));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    printf("ready\n");
    fflush(stdout);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, marks, NULL) == 0);
    cl_event ev[64];
    for (int i = 0; i < inflight; i++)
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &ev[i]));
    for (int i = 0;; i = (i + 1) % inflight) {
        CHECK(clWaitForEvents(1, &ev[i]));
        CHECK(clReleaseEvent(ev[i]));
        atomic_fetch_add(&completed, 1);
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &ev[i]));
    }
}
