/* Threads started one after another, as a program that makes a thread per task does: each
 * writes and reads its own buffer on the one queue, then ends. Then two at once. With "hold",
 * it prints "threads OK" and waits for stdin before it releases anything (the test then counts
 * the worker's lane threads). */
#include "common.h"
#include <pthread.h>
#include <string.h>

enum { SEQUENTIAL = 40, N = 256 };
static cl_context ctx;
static cl_command_queue q;

static void *task(void *arg) {
    int id = (int)(size_t)arg;
    cl_int err;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    CHECK(err);
    int in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = id * 1000 + i;
    CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, sizeof in, in, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    EXPECT(memcmp(in, out, sizeof in) == 0);
    CHECK(clReleaseMemObject(buf));
    return NULL;
}

int main(int argc, char **argv) {
    cl_device_id d;
    open_queue(&d, &ctx, &q);
    for (int i = 0; i < SEQUENTIAL; i++) {
        pthread_t t;
        EXPECT(pthread_create(&t, NULL, task, (void *)(size_t)i) == 0);
        EXPECT(pthread_join(t, NULL) == 0);
    }
    pthread_t two[2];
    for (int i = 0; i < 2; i++) EXPECT(pthread_create(&two[i], NULL, task, (void *)(size_t)(100 + i)) == 0);
    for (int i = 0; i < 2; i++) EXPECT(pthread_join(two[i], NULL) == 0);
    printf("threads OK\n");
    fflush(stdout);
    if (argc > 1 && !strcmp(argv[1], "hold")) {
        char line[8];
        (void)!fgets(line, sizeof line, stdin);
    }
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
