/* A blocking write larger than a TCP lane's queue bound (64 MiB) whose wait list holds a user
 * event that another thread sets only later, through the same session. Over TCP every lane
 * shares one stream: the worker's reader must take the whole write's data, chunk by chunk,
 * while the write's lane waits for the event, or the other thread's clSetUserEventStatus,
 * queued behind that data, could never arrive. Also: the data lands whole, and a large
 * blocking read gets it back. */
#include "common.h"
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define SIZE ((size_t)96 << 20)

static cl_event gate;

static void *open_gate(void *arg) {
    (void)arg;
    usleep(300 * 1000);
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    return NULL;
}

int main(void) {
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, SIZE, NULL, &err);
    CHECK(err);
    gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    unsigned char *host = malloc(SIZE), *back = malloc(SIZE);
    EXPECT(host && back);
    for (size_t i = 0; i < SIZE; i++) host[i] = (unsigned char)(i * 7 + (i >> 20));
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, open_gate, NULL) == 0);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, SIZE, host, 1, &gate, NULL));
    cl_int status = 0;
    CHECK(clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    EXPECT(status == CL_COMPLETE);
    EXPECT(pthread_join(t, NULL) == 0);
    memset(back, 0, SIZE);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, SIZE, back, 0, NULL, NULL));
    EXPECT(memcmp(host, back, SIZE) == 0);
    CHECK(clReleaseEvent(gate));
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    free(host);
    free(back);
    printf("gated_write OK\n");
    return 0;
}
