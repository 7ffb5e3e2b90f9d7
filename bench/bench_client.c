/* Wormhole's benchmark client: plain OpenCL, run natively and through Wormhole by `wh bench`.
 * Prints one "key value" line per measurement. Usage: bench_client MODE
 *   calls   round trips, tiny kernels, pipelined enqueues, a kernel object per operation,
 *           transfers, CPU time
 *   start   time from process start to the first kernel result (measured by the caller)
 *   idle    connect, create a context, then stay idle for WH_IDLE_SECONDS (default 5)
 *   flood   keep the device busy with heavy kernels for WH_FLOOD_SECONDS (default 5)
 *   light   a latency-sensitive tenant: 300 tiny kernels + finish, 2 ms apart
 *   builds  10 programs no cache has seen (a nonce in each source), each built, one of its
 *           two kernels run and read back: what a test suite of one-off programs waits for
 *   rtt     WH_RTT_CALLS (default 1000) synchronous round trips only. In a benchmark guest
 *           (WH_CTL_TTY set, see tests/guest.py) the calls are bracketed as the phase
 *           WH_PHASE, so that the host counts the device events of exactly these calls. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdatomic.h>
#include "bench_measure.h"

#define CHECK(x)                                                                   \
    do {                                                                           \
        cl_int e_ = (x);                                                           \
        if (e_ != CL_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, e_);      \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* One handshake line with the benchmark host ("B name" / "E"), answered by one line. */
static void phase_mark(int tty, const char *line) {
    if (tty < 0) return;
    if (write(tty, line, strlen(line)) < 0) { perror("phase tty"); exit(1); }
    char c;
    while (read(tty, &c, 1) == 1 && c != '\n') {}
}

static const char *SRC =
    "__kernel void tiny(__global int *x, int v) { if (get_global_id(0) == 0) x[0] = v; }\n"
    "__kernel void heavy(__global float *x) { size_t i = get_global_id(0); float a = x[i];\n"
    "  for (int k = 0; k < 2000; k++) a = a * 0.999f + 0.001f; x[i] = a; }\n";

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;
static cl_kernel k;
static cl_mem buf;

static cl_program prog;

/* The platform measured: the first, or the first whose name contains $WH_PLATFORM (a machine
 * with several ICDs lists them in an order of the loader's choosing; through Wormhole the
 * names are the server's, prefixed). */
static cl_platform_id pick_platform(void) {
    cl_platform_id all[16];
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(16, all, &n));
    const char *want = getenv("WH_PLATFORM");
    for (cl_uint i = 0; want && *want && i < n && i < 16; i++) {
        char name[256] = "";
        CHECK(clGetPlatformInfo(all[i], CL_PLATFORM_NAME, sizeof name, name, NULL));
        if (strstr(name, want)) return all[i];
    }
    if (want && *want) {
        fprintf(stderr, "no OpenCL platform named like \"%s\" among %u\n", want, n);
        exit(3);
    }
    return all[0];
}

static void setup(void) {
    cl_platform_id p = pick_platform();
    cl_int err;
    CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    k = clCreateKernel(prog, "tiny", &err);
    CHECK(err);
    buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    int v = 0;
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
}

static atomic_int completions;
static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *user) {
    (void)e;
    (void)user;
    if (status == CL_COMPLETE) atomic_fetch_add(&completions, 1);
}

static void calls(void) {
    enum { RT = 20000, TINY = 2000, PIPE = 100000 };
    static double lat[RT];
    size_t one = 1;
    /* synchronous round trip: status of a completed event */
    cl_event done;
    CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &done));
    CHECK(clFinish(q));
    for (int i = 0; i < RT; i++) {
        cl_int st;
        double t = now();
        CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
        lat[i] = now() - t;
    }
    stats("roundtrip", lat, RT);
    /* tiny kernel + finish */
    for (int i = 0; i < TINY; i++) {
        double t = now();
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        CHECK(clFinish(q));
        lat[i] = now() - t;
    }
    stats("tiny_kernel", lat, TINY);
    /* pipelined: set an argument and enqueue, many times, then one finish. PoCL's own rate
     * swings by 2x from one batch to the next on a shared 2-core machine, so the figure is the
     * median of PIPE_REPS batches. */
    enum { PIPE_REPS = 5 };
    double rate[PIPE_REPS];
    double cpu0 = cpu_seconds();
    for (int rep = 0; rep < PIPE_REPS; rep++) {
        double t = now();
        for (int i = 0; i < PIPE; i++) {
            CHECK(clSetKernelArg(k, 1, sizeof i, &i));
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        }
        CHECK(clFinish(q));
        rate[rep] = 2.0 * PIPE / (now() - t);
    }
    qsort(rate, PIPE_REPS, sizeof *rate, cmp);
    printf("pipelined_calls_per_s %.0f\n", rate[PIPE_REPS / 2]);
    printf("pipelined_client_cpu_s %.3f\n", (cpu_seconds() - cpu0) / PIPE_REPS);
    int last = -1;
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof last, &last, 0, NULL, NULL));
    if (last != PIPE - 1) {
        fprintf(stderr, "pipelined result %d, expected %d\n", last, PIPE - 1);
        exit(1);
    }
    /* blocking and non-blocking transfers */
    size_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
    for (int s = 0; s < 5; s++) {
        size_t n = sizes[s];
        cl_int err;
        cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
        CHECK(err);
        char *host = malloc(n);
        memset(host, s + 1, n);
        int reps = (int)((512u << 20) / n);
        if (reps > 2000) reps = 2000;
        if (reps < 3) reps = 3;
        CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, n, host, 0, NULL, NULL));
        double tw = now();
        for (int i = 0; i < reps; i++) CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, n, host, 0, NULL, NULL));
        tw = now() - tw;
        double tr = now();
        for (int i = 0; i < reps; i++) CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, n, host, 0, NULL, NULL));
        tr = now() - tr;
        printf("write_%zuKiB_GBps %.3f\nread_%zuKiB_GBps %.3f\n", n >> 10, n * (double)reps / tw / 1e9, n >> 10, n * (double)reps / tr / 1e9);
        /* non-blocking transfers, reps of them then clFinish (the queue idle before) */
        if (s >= 1 && s <= 3) {
            tw = now();
            for (int i = 0; i < reps; i++) CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, n, host, 0, NULL, NULL));
            CHECK(clFinish(q));
            tw = now() - tw;
            tr = now();
            for (int i = 0; i < reps; i++) CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, n, host, 0, NULL, NULL));
            CHECK(clFinish(q));
            tr = now() - tr;
            printf("nbwrite_%zuKiB_GBps %.3f\nnbread_%zuKiB_GBps %.3f\n", n >> 10, n * (double)reps / tw / 1e9, n >> 10, n * (double)reps / tr / 1e9);
        }
        free(host);
        clReleaseMemObject(b);
    }
    /* A kernel object per operation, as OpenCV makes them: made by name, its two arguments
     * set, launched with an event, a completion callback asked for, both released; then one
     * finish. The median of PIPE_REPS batches, in operations per second. It runs last: the small
     * transfers' rows swung more in runs that had it before them. */
    enum { PER_OP = 5000 };
    for (int rep = 0; rep < PIPE_REPS; rep++) {
        double t = now();
        for (int i = 0; i < PER_OP; i++) {
            cl_int err;
            cl_kernel kk = clCreateKernel(prog, "tiny", &err);
            CHECK(err);
            CHECK(clSetKernelArg(kk, 0, sizeof buf, &buf));
            CHECK(clSetKernelArg(kk, 1, sizeof i, &i));
            cl_event ev;
            CHECK(clEnqueueNDRangeKernel(q, kk, 1, NULL, &one, NULL, 0, NULL, &ev));
            CHECK(clSetEventCallback(ev, CL_COMPLETE, on_complete, NULL));
            CHECK(clReleaseEvent(ev));
            CHECK(clReleaseKernel(kk));
        }
        CHECK(clFinish(q));
        rate[rep] = PER_OP / (now() - t);
    }
    qsort(rate, PIPE_REPS, sizeof *rate, cmp);
    printf("kernel_per_op_per_s %.0f\n", rate[PIPE_REPS / 2]);
    /* Callbacks run after their commands complete, on a thread of the driver's. */
    for (int t = 0; t < 1000 && atomic_load(&completions) < PER_OP * PIPE_REPS; t++) usleep(10000);
    if (atomic_load(&completions) != PER_OP * PIPE_REPS) {
        fprintf(stderr, "%d completion callbacks, expected %d\n", atomic_load(&completions), PER_OP * PIPE_REPS);
        exit(1);
    }
    printf("client_cpu_s %.3f\n", cpu_seconds());
}

/* Ten one-off programs: built, a kernel run, the result read. The sources carry this run's
 * nonce in a kernel name (comments do not survive the preprocessor), so no cache (the driver's, Wormhole's) has them; the figure is the wall time. */
static void builds(void) {
    enum { PROGRAMS = 10 };
    struct timespec t0, t1;
    unsigned long nonce = (unsigned long)getpid() * 1000003ul ^ (unsigned long)time(NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < PROGRAMS; i++) {
        char src[1024];
        snprintf(src, sizeof src,
                 "__kernel void poly_%lu_%d(__global float *x) { size_t i = get_global_id(0);\n"
                 "  float a = x[i]; for (int k = 0; k < %d; k++) a = a * 0.5f + sin(a);\n"
                 "  x[i] = a; }\n"
                 "__kernel void add(__global int *x, int v) { x[get_global_id(0)] += v; }\n",
                 nonce, i, i + 2);
        const char *s = src;
        cl_int err;
        cl_program p = clCreateProgramWithSource(ctx, 1, &s, NULL, &err);
        CHECK(err);
        CHECK(clBuildProgram(p, 1, &dev, "", NULL, NULL));
        cl_kernel kk = clCreateKernel(p, "add", &err);
        CHECK(err);
        int v = i + 1, out = 0;
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
        CHECK(clSetKernelArg(kk, 0, sizeof buf, &buf));
        CHECK(clSetKernelArg(kk, 1, sizeof v, &v));
        size_t one = 1;
        CHECK(clEnqueueNDRangeKernel(q, kk, 1, NULL, &one, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
        if (out != v) {
            fprintf(stderr, "builds: program %d gave %d, not %d\n", i, out, v);
            exit(1);
        }
        CHECK(clReleaseKernel(kk));
        CHECK(clReleaseProgram(p));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("oneoff_builds_s %.3f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "calls";
    if (!strcmp(mode, "platform")) {
        /* Which OpenCL the client reached (the GPU machine has several loaders and ICDs). */
        cl_platform_id p = pick_platform();
        char pname[256] = "", dname[256] = "";
        CHECK(clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof pname, pname, NULL));
        CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
        CHECK(clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL));
        printf("platform: %s, device: %s\n", pname, dname);
        return 0;
    }
    setup();
    if (!strcmp(mode, "start")) {
        size_t one = 1;
        int v = 42, out = 0;
        CHECK(clSetKernelArg(k, 1, sizeof v, &v));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
        printf("start_result %d\n", out);
        return out == 42 ? 0 : 1;
    }
    if (!strcmp(mode, "builds")) {
        builds();
        return 0;
    }
    if (!strcmp(mode, "flood")) {
        const char *s = getenv("WH_FLOOD_SECONDS");
        double until = now() + (s ? atof(s) : 5.0);
        cl_int err;
        cl_kernel h = clCreateKernel(prog, "heavy", &err);
        CHECK(err);
        size_t n = 1 << 16;
        cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
        CHECK(err);
        float zero = 0;
        CHECK(clEnqueueFillBuffer(q, big, &zero, sizeof zero, 0, n * sizeof(float), 0, NULL, NULL));
        CHECK(clSetKernelArg(h, 0, sizeof big, &big));
        printf("flood_ready 1\n");
        fflush(stdout);
        long launches = 0;
        while (now() < until) {
            for (int i = 0; i < 4; i++) CHECK(clEnqueueNDRangeKernel(q, h, 1, NULL, &n, NULL, 0, NULL, NULL));
            CHECK(clFinish(q));
            launches += 4;
        }
        printf("flood_launches %ld\n", launches);
        return 0;
    }
    if (!strcmp(mode, "light")) {
        enum { L = 300 };
        static double lat[L];
        size_t one = 1;
        for (int i = 0; i < L; i++) {
            double t = now();
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
            CHECK(clFinish(q));
            lat[i] = now() - t;
            usleep(2000);
        }
        stats("light", lat, L);
        return 0;
    }
    if (!strcmp(mode, "rtt")) {
        const char *s = getenv("WH_RTT_CALLS");
        int n = s ? atoi(s) : 1000;
        if (n < 1) n = 1;
        double *lat = calloc(n, sizeof *lat);
        cl_event done;
        CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &done));
        CHECK(clFinish(q));
        cl_int st;
        CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
        const char *tty_path = getenv("WH_CTL_TTY");
        int tty = tty_path && *tty_path ? open(tty_path, O_RDWR | O_NOCTTY) : -1;
        char mark[128];
        snprintf(mark, sizeof mark, "B %s\n", getenv("WH_PHASE") ? getenv("WH_PHASE") : "rtt");
        phase_mark(tty, mark);
        double t0 = now();
        for (int i = 0; i < n; i++) {
            double t = now();
            CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
            lat[i] = now() - t;
        }
        double total = now() - t0;
        phase_mark(tty, "E\n");
        printf("rtt_calls %d\n", n);
        stats("roundtrip", lat, n);
        printf("rtt_total_s %.6f\n", total);
        return st == CL_COMPLETE ? 0 : 1;
    }
    if (!strcmp(mode, "idle")) {
        const char *s = getenv("WH_IDLE_SECONDS");
        printf("idle_ready 1\n");
        fflush(stdout);
        sleep(s ? atoi(s) : 5);
        return 0;
    }
    calls();
    return 0;
}
