/* Two threads hand work to each other: one makes a call it waits for, then a kernel (a kind
 * of kernel made before: sent without waiting), and tells the other, which asks about the
 * kernel (waited for). Natively the kernel exists by then, so the query succeeds; through
 * Wormhole the query's lane must first let the other lane run the kernel's creation, even
 * when that lane has only just answered the waited call (CTS math_brute_force saw
 * CL_INVALID_KERNEL there). Rounds: argv[1] (default 3000). */
#include "common.h"
#include <pthread.h>

static cl_context ctx;
static cl_command_queue q;
static cl_program prog;
static cl_event done_marker;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static cl_kernel handed;
static int rounds;
static cl_device_id dev;

static void *asker(void *arg) {
    (void)arg;
    for (int r = 0; r < rounds; r++) {
        pthread_mutex_lock(&mu);
        while (!handed) pthread_cond_wait(&cv, &mu);
        cl_kernel k = handed;
        handed = NULL;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        size_t wg = 0;
        cl_int st = clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
        if (st != CL_SUCCESS) {
            fprintf(stderr, "round %d: clGetKernelWorkGroupInfo of a kernel made before -> %d\n", r, st);
            exit(1);
        }
        CHECK(clReleaseKernel(k));
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atoi(argv[1]) : 3000;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    prog = build(ctx, dev, "__kernel void k(__global int *a, int v) { a[0] = v; }");
    CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &done_marker));
    CHECK(clFinish(q));
    /* The kind of kernel is known from here on: later ones are made without waiting. */
    cl_kernel first = clCreateKernel(prog, "k", &err);
    CHECK(err);
    CHECK(clReleaseKernel(first));
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, asker, NULL) == 0);
    for (int r = 0; r < rounds; r++) {
        cl_int status;
        CHECK(clGetEventInfo(done_marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
        cl_kernel k = clCreateKernel(prog, "k", &err);
        CHECK(err);
        pthread_mutex_lock(&mu);
        while (handed) pthread_cond_wait(&cv, &mu);
        handed = k;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
    }
    EXPECT(pthread_join(t, NULL) == 0);
    CHECK(clReleaseEvent(done_marker));
    printf("order after reply OK\n");
    return 0;
}
