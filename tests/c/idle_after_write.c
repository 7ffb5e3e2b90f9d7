/* A blocking write leaves its in-order queue idle: a small non-blocking read after it has
 * nothing to wait for. Through Wormhole over TCP a blocking write of 2 MiB or more goes into
 * the driver's mapping as its bytes arrive (a streamed write); the queue must be known idle
 * after it too, so that the read runs at once and its bytes come with its reply (no later
 * collection).
 * Each round makes the queue busy first (a marker), so only the blocking write can make it
 * idle.
 *
 * Usage: idle_after_write [hold]. Prints "idle after write OK"; with "hold", then waits for
 * stdin to close (the session stays open for a look at the server's status). */
#include "common.h"
#include <string.h>

#define ROUNDS 5

int main(int argc, char **argv) {
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    const size_t n = 1 << 20, bytes = n * sizeof(int);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    CHECK(err);
    int *h = malloc(bytes), got[16];
    EXPECT(h);
    for (int round = 0; round < ROUNDS; round++) {
        /* busy: a command enqueued since the queue was last seen idle */
        CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, NULL));
        /* a blocking write of the whole buffer, after it in the queue */
        for (size_t i = 0; i < n; i++) h[i] = (int)i + round;
        CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, bytes, h, 0, NULL, NULL));
        /* a small non-blocking read of its middle */
        memset(got, 0, sizeof got);
        CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, (n / 2) * sizeof(int), sizeof got, got, 0,
                                  NULL, NULL));
        CHECK(clFinish(q));
        for (int i = 0; i < 16; i++) {
            if (got[i] != (int)(n / 2) + i + round) {
                fprintf(stderr, "round %d: [%d] = %d, expected %d\n", round, i, got[i],
                        (int)(n / 2) + i + round);
                return 1;
            }
        }
    }
    free(h);
    CHECK(clReleaseMemObject(b));
    printf("idle after write OK\n");
    fflush(stdout);
    hold_if_asked(argc, argv);
    return 0;
}
