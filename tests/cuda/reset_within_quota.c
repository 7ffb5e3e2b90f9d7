/* A program that resets its device and allocates again (cudaDeviceReset does the same): the
   reset frees what the context held, so the second allocation fits wherever the first did. A
   tenant whose quota holds one allocation but not two must succeed both times, as natively;
   then the same with a destroyed context of its own. */
#include <cuda.h>
#include <stdio.h>

#define MIB (1024ull * 1024ull)

static int round_of(CUdevice dev, size_t bytes) {
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
    if (r == CUDA_SUCCESS) r = cuMemAlloc(&p, bytes);
    /* Left allocated: the reset frees it. */
    CUresult reset = cuDevicePrimaryCtxReset(dev);
    return r != CUDA_SUCCESS ? (int)r : (int)reset;
}

int main(void) {
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
        printf("no device\n");
        return 1;
    }
    size_t bytes = 600 * MIB;
    int first = round_of(dev, bytes);
    int second = round_of(dev, bytes);
    printf("allocate 600 MiB and reset, twice: %d %d\n", first, second);

    CUcontext own = NULL;
    CUdeviceptr p = 0;
    int made = (int)cuCtxCreate(&own, NULL, 0, dev);
    int alloc = made == 0 ? (int)cuMemAlloc(&p, bytes) : -1;
    int destroyed = made == 0 ? (int)cuCtxDestroy(own) : -1;
    CUcontext ctx = NULL;
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    int again = (int)cuMemAlloc(&p, bytes);
    printf("in a context of its own, then destroyed: %d %d %d; again: %d\n", made, alloc, destroyed, again);
    return first || second || made || alloc || destroyed || again;
}
