/* Work one thread enqueued before it told another comes before what the other then does:
 * thread A launches a kernel many times on a shared in-order queue (each launch writes its
 * round's number; repeats of an accepted launch are pipelined by Wormhole), then tells thread
 * B, which launches it once more (writing -1), finishes the queue and reads the buffer: the
 * in-order queue ran B's launch after all of A's, so B reads -1, as natively (OpenCL queues
 * are shared between threads; the application's own signal orders the calls). */
#include "common.h"
#include <pthread.h>

static const char *SRC = "__kernel void put(__global int *x, int v) { x[0] = v; }\n";

enum { ROUNDS = 3000 };

static cl_command_queue q;
static cl_kernel k;
static cl_mem buf;
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int launched;

static void *launcher(void *arg) {
    (void)arg;
    size_t one = 1;
    for (int v = 1; v <= ROUNDS; v++) {
        CHECK(clSetKernelArg(k, 1, sizeof v, &v));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, &one, 0, NULL, NULL));
    }
    pthread_mutex_lock(&m);
    launched = 1;
    pthread_cond_signal(&c);
    pthread_mutex_unlock(&m);
    return NULL;
}

static void *reader(void *arg) {
    int *out = arg;
    pthread_mutex_lock(&m);
    while (!launched) pthread_cond_wait(&c, &m);
    pthread_mutex_unlock(&m);
    /* Pipelined like A's launches: the in-order queue runs it after all of them. */
    size_t one = 1;
    int last = -1;
    CHECK(clSetKernelArg(k, 1, sizeof last, &last));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, &one, 0, NULL, NULL));
    CHECK(clFinish(q));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof *out, out, 0, NULL, NULL));
    return NULL;
}

int main(void) {
    cl_device_id dev;
    cl_context ctx;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, NULL, NULL, NULL));
    k = clCreateKernel(prog, "put", &err);
    CHECK(err);
    buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    int bad = 0, out = 0;
    for (int round = 0; round < 5; round++) {
        launched = 0;
        pthread_t a, b;
        pthread_create(&b, NULL, reader, &out);
        pthread_create(&a, NULL, launcher, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        if (out != -1) {
            fprintf(stderr, "round %d: read %d, expected -1 (the reader's own launch, after the launcher's %d)\n", round, out, ROUNDS);
            bad++;
        }
    }
    printf("the reader saw the launcher's last round in %d of 5 tries\n", 5 - bad);
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return bad ? 1 : 0;
}
