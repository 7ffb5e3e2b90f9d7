/* Blocking transfers as a discrete GPU's go through Wormhole (pinned staging, in pieces through
 * two slots): contents across many pieces at odd offsets and sizes, an out-of-order queue whose
 * wait list another thread opens after a call of its own, two threads transferring at once in
 * one context, transfers after the application released its context, and what the application
 * can see of the worker's staging: nothing (the context's reference count, even with another
 * thread creating objects meanwhile and a third reading it while the staging is made; its
 * destructor callback after the last release).
 * With "hold", after the main thread's own transfers (7 blocking reads and 6 blocking writes of
 * 64 KiB or more, in the first context) it prints "main OK" and waits for a line on stdin (the
 * session's status can be read meanwhile). Prints "staged OK", then "context destroyed". */
#include "common.h"
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static cl_context ctx;
static cl_device_id dev;

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u) >> 13 ^ seed);
}

/* Writes and reads back `size` bytes at `offset` of `buf`, blocking, and compares. */
static void round_trip(cl_command_queue q, cl_mem buf, size_t offset, size_t size, unsigned seed) {
    unsigned char *a = malloc(size), *b = malloc(size);
    fill(a, size, seed);
    memset(b, 0, size);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, offset, size, a, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, offset, size, b, 0, NULL, NULL));
    EXPECT(memcmp(a, b, size) == 0);
    free(a);
    free(b);
}

static cl_event gate;
static void *open_gate(void *arg) {
    (void)arg;
    usleep(100 * 1000);
    /* a call that needs its answer while the read waits for the gate */
    cl_int status;
    CHECK(clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    EXPECT(status == CL_SUBMITTED);
    clSetUserEventStatus(gate, CL_COMPLETE);
    return NULL;
}

/* Creates and releases buffers of the first context while the main thread transfers. */
static volatile int churning = 1;

/* Reads the first context's reference count meanwhile: never below what the application
 * holds, even while the worker makes its staging. */
static cl_uint least_seen = ~0u;
static cl_uint context_refs(void);
static void *watch_refs(void *arg) {
    (void)arg;
    while (churning) {
        cl_uint n = context_refs();
        if (n < least_seen) least_seen = n;
    }
    return NULL;
}
static void *churn(void *arg) {
    (void)arg;
    while (churning) {
        cl_int err;
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
        CHECK(err);
        CHECK(clReleaseMemObject(m));
    }
    return NULL;
}

struct worker {
    cl_mem buf;
    unsigned seed;
};

static void *transfer_loop(void *arg) {
    struct worker *w = arg;
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    for (unsigned i = 0; i < 12; i++) round_trip(q, w->buf, i * 4096, 6 * MIB + i * 977, w->seed + i);
    CHECK(clReleaseCommandQueue(q));
    return NULL;
}

static volatile int destroyed = 0;
static void CL_CALLBACK on_destroyed(cl_context c, void *user) {
    (void)c;
    *(volatile int *)user = 1;
}

static cl_uint context_refs(void) {
    cl_uint n = 0;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL));
    return n;
}

/* The count once what the driver releases a moment late has gone (PoCL drops a finished
 * command's references, and a released queue's, after the call that ended it returns): the
 * least of 20 looks 10 ms apart. */
static cl_uint settled_refs(void) {
    cl_uint least = context_refs();
    for (int i = 0; i < 20; i++) {
        usleep(10 * 1000);
        cl_uint n = context_refs();
        if (n < least) least = n;
    }
    return least;
}

/* Whether the context's count comes down to `want` within 5 s (looks 10 ms apart): on a loaded
 * machine PoCL may drop the last finished command's references later than settled_refs looks. */
static int refs_settle_to(cl_uint want) {
    for (int i = 0; i < 500; i++) {
        if (context_refs() == want) return 1;
        usleep(10 * 1000);
    }
    fprintf(stderr, "context references: %u, expected %u\n", context_refs(), want);
    return 0;
}

int main(int argc, char **argv) {
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    size_t size = 40 * MIB + 123;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    cl_uint refs = settled_refs();

    /* many pieces, odd sizes and offsets; small transfers stay in their frames; the worker
     * makes its staging during the first, while another thread creates and releases buffers */
    pthread_t churner, watcher;
    pthread_create(&churner, NULL, churn, NULL);
    pthread_create(&watcher, NULL, watch_refs, NULL);
    round_trip(q, buf, 0, size, 1);
    churning = 0;
    pthread_join(churner, NULL);
    pthread_join(watcher, NULL);
    EXPECT(least_seen >= refs);
    round_trip(q, buf, 12345, 20 * MIB + 7, 2);
    round_trip(q, buf, 3, 64 * 1024 + 1, 3);
    round_trip(q, buf, 0, 1000, 4);
    /* bytes around a transfer stay as they were */
    unsigned char *all = malloc(size), *part = malloc(3 * MIB), *back = malloc(size);
    fill(all, size, 5);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, size, all, 0, NULL, NULL));
    fill(part, 3 * MIB, 6);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 7 * MIB + 11, 3 * MIB, part, 0, NULL, NULL));
    memcpy(all + 7 * MIB + 11, part, 3 * MIB);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, back, 0, NULL, NULL));
    EXPECT(memcmp(all, back, size) == 0);

    /* a sub-buffer: its own offsets, its parent's bytes */
    cl_uint align_bits = 0;
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    size_t origin = ((3 * MIB) / (align_bits / 8) + 1) * (align_bits / 8);
    cl_buffer_region region = {origin, 2 * MIB + 5};
    cl_mem sub = clCreateSubBuffer(buf, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK(err);
    fill(part, 2 * MIB + 5, 9);
    CHECK(clEnqueueWriteBuffer(q, sub, CL_TRUE, 0, 2 * MIB + 5, part, 0, NULL, NULL));
    memcpy(all + origin, part, 2 * MIB + 5);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, back, 0, NULL, NULL));
    EXPECT(memcmp(all, back, size) == 0);
    memset(back, 0, size);
    CHECK(clEnqueueReadBuffer(q, sub, CL_TRUE, 1, 2 * MIB + 4, back, 0, NULL, NULL));
    EXPECT(memcmp(all + origin + 1, back, 2 * MIB + 4) == 0);
    CHECK(clReleaseMemObject(sub));

    /* the worker's staging is not the application's: the count before any transfer */
    EXPECT(refs_settle_to(refs) && settled_refs() == refs);

    /* an out-of-order queue: each piece waits for the wait list, which another thread opens */
    cl_queue_properties ooo[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, ooo, &err);
    if (err == CL_SUCCESS) {
        gate = clCreateUserEvent(ctx, &err);
        CHECK(err);
        cl_event wrote;
        fill(part, 3 * MIB, 7);
        /* a non-blocking write held by the gate, then a blocking read that waits for it */
        CHECK(clEnqueueWriteBuffer(q2, buf, CL_FALSE, 5 * MIB, 3 * MIB, part, 1, &gate, &wrote));
        pthread_t t;
        pthread_create(&t, NULL, open_gate, NULL);
        memset(back, 0, size);
        CHECK(clEnqueueReadBuffer(q2, buf, CL_TRUE, 4 * MIB, 5 * MIB, back, 1, &wrote, NULL));
        pthread_join(t, NULL);
        memcpy(all + 5 * MIB, part, 3 * MIB);
        EXPECT(memcmp(all + 4 * MIB, back, 5 * MIB) == 0);
        CHECK(clReleaseEvent(wrote));
        CHECK(clReleaseEvent(gate));
        CHECK(clReleaseCommandQueue(q2));
    }

    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        printf("main OK\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) { /* the test closed stdin: go on */
        }
    }

    /* a context the application released before its last transfers (its objects keep it) */
    cl_context ctx2 = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q3 = clCreateCommandQueueWithProperties(ctx2, dev, NULL, &err);
    CHECK(err);
    cl_mem buf2 = clCreateBuffer(ctx2, CL_MEM_READ_WRITE, 4 * MIB, NULL, &err);
    CHECK(err);
    static volatile int destroyed2 = 0;
    CHECK(clSetContextDestructorCallback(ctx2, on_destroyed, (void *)&destroyed2));
    CHECK(clReleaseContext(ctx2));
    round_trip(q3, buf2, 0, 4 * MIB, 8);
    CHECK(clReleaseMemObject(buf2));
    CHECK(clReleaseCommandQueue(q3));
    for (int i = 0; i < 200 && !destroyed2; i++) usleep(10 * 1000);
    EXPECT(destroyed2);

    /* two threads of one context at once (one may find the staging taken) */
    struct worker w1 = {clCreateBuffer(ctx, CL_MEM_READ_WRITE, 8 * MIB, NULL, &err), 100};
    CHECK(err);
    struct worker w2 = {clCreateBuffer(ctx, CL_MEM_READ_WRITE, 8 * MIB, NULL, &err), 200};
    CHECK(err);
    pthread_t t1, t2;
    pthread_create(&t1, NULL, transfer_loop, &w1);
    pthread_create(&t2, NULL, transfer_loop, &w2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK(clReleaseMemObject(w1.buf));
    CHECK(clReleaseMemObject(w2.buf));

    /* errors, as natively */
    EXPECT(clEnqueueWriteBuffer(q, buf, CL_TRUE, size - MIB, 2 * MIB, all, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadBuffer(q, buf, CL_TRUE, size - MIB, 2 * MIB, back, 0, NULL, NULL) == CL_INVALID_VALUE);

    printf("staged OK\n");
    fflush(stdout);
    /* after the last release the context goes, and says so */
    CHECK(clSetContextDestructorCallback(ctx, on_destroyed, (void *)&destroyed));
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    for (int i = 0; i < 200 && !destroyed; i++) usleep(10 * 1000);
    EXPECT(destroyed);
    free(all);
    free(part);
    free(back);
    printf("context destroyed\n");
    return 0;
}
