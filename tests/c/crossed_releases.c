/* Two threads drop their references to one event at the same moment. Natively either may
 * drop the last, and the event goes once both are done. Through Wormhole both releases are
 * sent without waiting, each on its thread's lane, and neither waits for the other (nothing
 * orders them), so the release the client counted as the last may reach the server first:
 * the server must still forget the event only after both (a bench loop that releases an
 * event while its callback's hold goes away saw the other release refused, CL_INVALID_EVENT
 * at the next clFinish), nor keep it after both (argv[2] "hold": say so and wait for a line
 * on stdin, so that a test can count the session's events). Rounds: argv[1] (default
 * 20000). */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>

static cl_event shared;
static atomic_int arrived[2];
static int rounds;

/* Both threads in round r: spin, so that both release at once. */
static void meet(int side, int r) {
    atomic_store(&arrived[side], r + 1);
    while (atomic_load(&arrived[!side]) < r + 1) {}
}

static void *other(void *arg) {
    (void)arg;
    for (int r = 0; r < rounds; r++) {
        meet(1, 2 * r);
        CHECK(clReleaseEvent(shared));
        meet(1, 2 * r + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atoi(argv[1]) : 20000;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&dev, &ctx, &q);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, other, NULL) == 0);
    for (int r = 0; r < rounds; r++) {
        CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &shared));
        CHECK(clRetainEvent(shared));
        meet(0, 2 * r);
        CHECK(clReleaseEvent(shared));
        meet(0, 2 * r + 1);
        /* A refused release shows at the next synchronisation point. */
        if (r % 500 == 499) {
            cl_int st = clFinish(q);
            if (st != CL_SUCCESS) {
                fprintf(stderr, "round %d: clFinish -> %d after crossed releases\n", r, st);
                return 1;
            }
        }
    }
    EXPECT(pthread_join(t, NULL) == 0);
    CHECK(clFinish(q));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("crossed releases: %d rounds\n", rounds);
    if (argc > 2) {
        fflush(stdout);
        char line[8];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    return 0;
}
