/* Builds that the server's program cache may serve must behave as compiled ones: the right
 * code for the options given, the program's own source and build log, reference counts,
 * rebuilds with other options, build callbacks, and build errors.
 *
 * Steps (the test counts the cache's hits and misses per step):
 *   a) P from source, built with -DSCALE=3, run;
 *   b) P's kernel released, P rebuilt with -DSCALE=5, run;
 *   c) a program with an error: CL_BUILD_PROGRAM_FAILURE and a log naming the error;
 *   d) Q from the same source, built with -DSCALE=3 and a callback, run.
 * With "hold" it then prints "ready" and waits for a line on stdin (so the session's status
 * can be read). */
#include "common.h"
#include <string.h>
#include <time.h>

static const char *SRC =
    "#warning \"wormhole-cache-test\"\n"
    "__kernel void scale(__global int *a) { a[get_global_id(0)] *= SCALE; }\n";
static const char *BAD_SRC = "__kernel void broken(__global int *a) { a[0] = undefined_name; }\n";

#define N 64

static void run_scale(cl_context ctx, cl_command_queue q, cl_program prog, int factor) {
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "scale", &err);
    CHECK(err);
    int data[N];
    for (int i = 0; i < N; i++) data[i] = i + 1;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof data, data, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(data[i] == (i + 1) * factor);
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseKernel(k));
}

static void expect_source_and_log(cl_program prog, cl_device_id dev) {
    size_t n = 0;
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_SOURCE, 0, NULL, &n));
    EXPECT(n == strlen(SRC) + 1);
    char src[1024];
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_SOURCE, sizeof src, src, NULL));
    EXPECT(strcmp(src, SRC) == 0);
    char log[16384];
    CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
    EXPECT(strstr(log, "wormhole-cache-test") != NULL);
    cl_build_status st;
    CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_BUILD_SUCCESS);
    cl_program_binary_type bt;
    CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
    EXPECT(bt == CL_PROGRAM_BINARY_TYPE_EXECUTABLE);
    char kernels[256];
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_KERNEL_NAMES, sizeof kernels, kernels, NULL));
    EXPECT(strcmp(kernels, "scale") == 0);
}

static cl_uint refcount(cl_program p) {
    cl_uint n = 0;
    CHECK(clGetProgramInfo(p, CL_PROGRAM_REFERENCE_COUNT, sizeof n, &n, NULL));
    return n;
}

/* Rebuilds a program whose kernels the application has all released. A finished launch may
 * still hold its kernel for a moment: PoCL 3.1 counts a command done (clFinish returns, the
 * next command of the queue starts) before it drops the command's kernel reference
 * (pocl_update_event_finished: the queue's count and the broadcast come before
 * pocl_free_event_node), so the rebuild can meet CL_INVALID_OPERATION natively too. Any other
 * answer, or that one for 2 s, is the build's. */
static cl_int rebuild_once_kernels_are_gone(cl_program p, cl_device_id dev, const char *options) {
    cl_int st = CL_INVALID_OPERATION;
    for (int i = 0; i < 200 && st == CL_INVALID_OPERATION; i++) {
        if (i > 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        st = clBuildProgram(p, 1, &dev, options, NULL, NULL);
    }
    return st;
}

static volatile int notified = 0;
static void CL_CALLBACK on_built(cl_program p, void *user) {
    (void)p;
    *(volatile int *)user = 1;
}

int main(int argc, char **argv) {
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);

    /* a) with an extra reference the application holds across the build */
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clRetainProgram(p));
    CHECK(clBuildProgram(p, 1, &dev, "-DSCALE=3", NULL, NULL));
    EXPECT(refcount(p) == 2);
    CHECK(clReleaseProgram(p));
    EXPECT(refcount(p) == 1);
    expect_source_and_log(p, dev);
    run_scale(ctx, q, p, 3);
    printf("a ok\n");

    /* b) a kernel attached: the rebuild fails as natively; without it, other options count */
    cl_kernel k = clCreateKernel(p, "scale", &err);
    CHECK(err);
    EXPECT(clBuildProgram(p, 1, &dev, "-DSCALE=5", NULL, NULL) == CL_INVALID_OPERATION);
    CHECK(clReleaseKernel(k));
    CHECK(rebuild_once_kernels_are_gone(p, dev, "-DSCALE=5"));
    expect_source_and_log(p, dev);
    run_scale(ctx, q, p, 5);
    CHECK(clReleaseProgram(p));
    printf("b ok\n");

    /* c) build errors are never cached: same error and log every time */
    cl_program bad = clCreateProgramWithSource(ctx, 1, &BAD_SRC, NULL, &err);
    CHECK(err);
    EXPECT(clBuildProgram(bad, 1, &dev, "", NULL, NULL) == CL_BUILD_PROGRAM_FAILURE);
    char log[16384];
    CHECK(clGetProgramBuildInfo(bad, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
    EXPECT(strstr(log, "undefined_name") != NULL);
    CHECK(clReleaseProgram(bad));
    printf("c ok\n");

    /* d) the build callback fires for a build the cache serves, too */
    cl_program q2 = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(q2, 0, NULL, "-DSCALE=3", on_built, (void *)&notified));
    for (int i = 0; i < 500 && !notified; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    EXPECT(notified);
    expect_source_and_log(q2, dev);
    run_scale(ctx, q, q2, 3);
    CHECK(clReleaseProgram(q2));
    printf("d ok\n");

    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 0;
    }
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
