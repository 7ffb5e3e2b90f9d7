/* A device's primary context through its life, as a program sees it: its state before anything
 * retained it, the first retain (its time on stderr), memory in it, the last release ending
 * it, a release too many, flags set before it exists and while it is active, a reset. Through Wormhole a standby worker
 * may have made that context in advance (`warm_device`): the program must see what it sees
 * natively. */
#include <cuda.h>
#include <stdio.h>
#include <time.h>

#define CHECK(x)                                                                    \
    do {                                                                            \
        CUresult r_ = (x);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                   \
            printf("%s -> %d\n", #x, (int)r_);                                      \
            return 1;                                                               \
        }                                                                           \
    } while (0)

static CUdevice dev;

static void state(const char *when) {
    unsigned flags = 99;
    int active = 99;
    CUresult r = cuDevicePrimaryCtxGetState(dev, &flags, &active);
    printf("%s: state -> %d, flags %u, active %d\n", when, (int)r, flags, active);
}

static double ms_since(struct timespec t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
}

int main(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    /* Nothing before the first retain touches the context: through Wormhole that retain
     * finds the warm one (where the standby made it). */
    state("before any retain");
    CUcontext ctx = NULL;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    fprintf(stderr, "first retain: %.1f ms\n", ms_since(t0));
    state("retained");
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 1 << 20));
    CHECK(cuMemsetD8(p, 7, 1 << 20));
    CHECK(cuCtxSynchronize());
    printf("release -> %d\n", (int)cuDevicePrimaryCtxRelease(dev));
    state("after the last release");
    printf("a release too many -> %d\n", (int)cuDevicePrimaryCtxRelease(dev));
    /* Flags set before the context exists apply at its creation. */
    printf("set flags before it exists -> %d\n",
           (int)cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_BLOCKING_SYNC));
    state("after setting flags");
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    state("retained again");
    CHECK(cuCtxSetCurrent(ctx));
    unsigned ctx_flags = 0;
    CHECK(cuCtxGetFlags(&ctx_flags));
    printf("the context's flags: %u\n", ctx_flags);
    printf("set flags while it is active -> %d\n",
           (int)cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_SPIN));
    state("flags changed while active");
    printf("reset -> %d\n", (int)cuDevicePrimaryCtxReset(dev));
    state("after a reset");
    printf("release after the reset -> %d\n", (int)cuDevicePrimaryCtxRelease(dev));
    state("at the end");
    return 0;
}
