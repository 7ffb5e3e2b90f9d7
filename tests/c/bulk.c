/* Large transfers, which Wormhole moves through mapped driver buffers: contents at offsets,
 * non-blocking and blocking mixed, wait lists gated by a user event, and the native error
 * codes for out-of-range and host-access-restricted buffers. Prints "bulk OK". */
#include "common.h"
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define MIB (1u << 20)

static cl_event gate;
static void *open_gate(void *arg) {
    (void)arg;
    usleep(100 * 1000);
    clSetUserEventStatus(gate, CL_COMPLETE);
    return NULL;
}

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    size_t size = 8 * MIB;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    unsigned char *a = malloc(size), *b = malloc(size);
    memset(a, 0x11, size);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, size, a, 0, NULL, NULL));
    for (size_t i = 0; i < 3 * MIB; i++) a[MIB + i] = (unsigned char)(i * 131 + 7);
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, MIB, 3 * MIB, a + MIB, 0, NULL, NULL));
    /* a non-blocking write with an event, then a blocking read behind it */
    unsigned char *c = malloc(MIB);
    for (size_t i = 0; i < MIB; i++) c[i] = (unsigned char)(i ^ 0x5a);
    cl_event wrote;
    CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 6 * MIB, MIB, c, 0, NULL, &wrote));
    memcpy(a + 6 * MIB, c, MIB);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, b, 1, &wrote, NULL));
    EXPECT(memcmp(a, b, size) == 0);
    /* a blocking read at an offset gated by a user event another thread completes */
    gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    pthread_t t;
    pthread_create(&t, NULL, open_gate, NULL);
    memset(b, 0, size);
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 2 * MIB, 2 * MIB, b, 1, &gate, NULL));
    pthread_join(t, NULL);
    EXPECT(memcmp(a + 2 * MIB, b, 2 * MIB) == 0);
    /* errors, as natively */
    EXPECT(clEnqueueWriteBuffer(q, buf, CL_TRUE, 7 * MIB, 2 * MIB, a, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadBuffer(q, buf, CL_TRUE, 7 * MIB, 2 * MIB, b, 0, NULL, NULL) == CL_INVALID_VALUE);
    cl_mem ro = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY, 2 * MIB, NULL, &err);
    CHECK(err);
    EXPECT(clEnqueueWriteBuffer(q, ro, CL_TRUE, 0, 2 * MIB, a, 0, NULL, NULL) == CL_INVALID_OPERATION);
    cl_mem wo = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_WRITE_ONLY, 2 * MIB, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, wo, CL_TRUE, 0, 2 * MIB, a, 0, NULL, NULL));
    EXPECT(clEnqueueReadBuffer(q, wo, CL_TRUE, 0, 2 * MIB, b, 0, NULL, NULL) == CL_INVALID_OPERATION);
    /* the buffer is still intact after the failed calls */
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, b, 0, NULL, NULL));
    EXPECT(memcmp(a, b, size) == 0);
    printf("bulk OK\n");
    return 0;
}
