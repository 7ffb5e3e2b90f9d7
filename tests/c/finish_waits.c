/* clFinish and clWaitForEvents return only once what they wait for is done, and with the
 * driver's own status, however the server learns that (Wormhole answers them from the
 * driver's completion callbacks): work gated on a user event that another thread sets later;
 * several queues of one context finished from several threads at once; a gate set to a
 * failure, whose outcome is printed for the test to compare with native; waits on an event
 * already complete, on several events, on no queue. */
#include "common.h"
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static const char *SRC = "__kernel void put(__global int *x, int v) { x[get_global_id(0)] = v; }\n";

static cl_context ctx;
static cl_device_id dev;
static cl_program prog;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

struct gate {
    cl_event ev;
    cl_int status;
    int delay_ms;
};

static void *open_gate(void *arg) {
    struct gate *g = arg;
    usleep(g->delay_ms * 1000);
    CHECK(clSetUserEventStatus(g->ev, g->status));
    return NULL;
}

/* Enqueues `put(v)` over n ints of a new buffer, gated on `wait` (may be NULL). */
static cl_mem put(cl_command_queue q, int n, int v, cl_event *wait, cl_event *done) {
    cl_int err;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(int), NULL, &err);
    CHECK(err);
    cl_kernel k = clCreateKernel(prog, "put", &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
    size_t gws = n;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gws, NULL, wait ? 1 : 0, wait, done));
    CHECK(clReleaseKernel(k));
    return b;
}

static void gated_finish(cl_command_queue q) {
    cl_int err;
    struct gate g = {clCreateUserEvent(ctx, &err), CL_COMPLETE, 150};
    CHECK(err);
    cl_mem b = put(q, 1024, 7, &g.ev, NULL);
    pthread_t t;
    double t0 = now();
    pthread_create(&t, NULL, open_gate, &g);
    CHECK(clFinish(q));
    double waited = now() - t0;
    EXPECT(waited > 0.1);
    /* Finished means done: a non-blocking read is complete once the next finish returns,
     * and the kernel's values are there. */
    int out[1024] = {0};
    CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, sizeof out, out, 0, NULL, NULL));
    CHECK(clFinish(q));
    for (int i = 0; i < 1024; i++) EXPECT(out[i] == 7);
    pthread_join(t, NULL);
    CHECK(clReleaseEvent(g.ev));
    CHECK(clReleaseMemObject(b));
    printf("gated finish waited %s\n", waited > 0.1 ? "for the gate" : "too little");
}

struct worker {
    cl_command_queue q;
    int v;
    int ok;
};

static void *finish_many(void *arg) {
    struct worker *w = arg;
    w->ok = 1;
    for (int round = 0; round < 200; round++) {
        cl_mem b = put(w->q, 64, w->v + round, NULL, NULL);
        int out[64];
        CHECK(clEnqueueReadBuffer(w->q, b, CL_FALSE, 0, sizeof out, out, 0, NULL, NULL));
        CHECK(clFinish(w->q));
        for (int i = 0; i < 64; i++) w->ok &= out[i] == w->v + round;
        CHECK(clReleaseMemObject(b));
    }
    return NULL;
}

static void threads_finishing(void) {
    /* With the gates, 9 threads: over a guest region (8 lanes) the last gate shares main's
     * lane while main waits for that gate (see README, "Threads beyond the lanes"). */
    enum { N = 4 };
    struct worker w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        cl_int err;
        w[i].q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
        CHECK(err);
        w[i].v = 1000 * (i + 1);
        pthread_create(&t[i], NULL, finish_many, &w[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        EXPECT(w[i].ok);
        CHECK(clReleaseCommandQueue(w[i].q));
    }
    printf("%d threads finished 200 rounds each\n", N);
}

static void failed_gate(cl_command_queue q) {
    cl_int err;
    struct gate g = {clCreateUserEvent(ctx, &err), -1, 50};
    CHECK(err);
    cl_event done;
    cl_mem b = put(q, 16, 3, &g.ev, &done);
    pthread_t t;
    pthread_create(&t, NULL, open_gate, &g);
    cl_int finished = clFinish(q);
    pthread_join(t, NULL);
    cl_int st = 0;
    CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    /* What the driver answers here is its own: the test compares it with native. */
    printf("finish after a failed gate: %d, the gated kernel: %s\n", finished, st < 0 ? "failed" : "ran");
    CHECK(clReleaseEvent(done));
    CHECK(clReleaseEvent(g.ev));
    CHECK(clReleaseMemObject(b));
    /* The queue goes on. */
    cl_mem c = put(q, 16, 5, NULL, NULL);
    int out[16];
    CHECK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    EXPECT(out[15] == 5);
    CHECK(clFinish(q));
    CHECK(clReleaseMemObject(c));
}

static void event_waits(cl_command_queue q) {
    cl_int err;
    /* One event, gated on another thread's user event. */
    struct gate g = {clCreateUserEvent(ctx, &err), CL_COMPLETE, 150};
    CHECK(err);
    cl_event done;
    cl_mem b = put(q, 256, 9, &g.ev, &done);
    CHECK(clFlush(q));
    pthread_t t;
    double t0 = now();
    pthread_create(&t, NULL, open_gate, &g);
    CHECK(clWaitForEvents(1, &done));
    double waited = now() - t0;
    EXPECT(waited > 0.1);
    cl_int st = 1;
    CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_COMPLETE);
    pthread_join(t, NULL);
    /* Already complete: at once. Twice the same, and two events: the ordinary path. */
    CHECK(clWaitForEvents(1, &done));
    cl_event both[2] = {done, done};
    CHECK(clWaitForEvents(2, both));
    int out[256] = {0};
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    for (int i = 0; i < 256; i++) EXPECT(out[i] == 9);
    CHECK(clReleaseEvent(done));
    CHECK(clReleaseEvent(g.ev));
    CHECK(clReleaseMemObject(b));
    printf("event wait waited %s\n", waited > 0.1 ? "for the gate" : "too little");
    /* A failed gate: the driver's answer, printed. */
    struct gate f = {clCreateUserEvent(ctx, &err), -1, 50};
    CHECK(err);
    cl_mem c = put(q, 16, 4, &f.ev, &done);
    CHECK(clFlush(q));
    pthread_create(&t, NULL, open_gate, &f);
    cl_int waitst = clWaitForEvents(1, &done);
    pthread_join(t, NULL);
    printf("wait for a kernel behind a failed gate: %d\n", waitst);
    printf("wait for the failed gate itself: %d\n", clWaitForEvents(1, &f.ev));
    printf("wait for no event: %d\n", clWaitForEvents(1, NULL));
    CHECK(clFinish(q));
    CHECK(clReleaseEvent(done));
    CHECK(clReleaseEvent(f.ev));
    CHECK(clReleaseMemObject(c));
}

int main(void) {
    cl_command_queue q;
    open_queue(&dev, &ctx, &q);
    prog = build(ctx, dev, SRC);
    gated_finish(q);
    threads_finishing();
    failed_gate(q);
    event_waits(q);
    printf("finish on no queue: %d\n", clFinish(NULL));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseContext(ctx));
    printf("finish_waits OK\n");
    return 0;
}
