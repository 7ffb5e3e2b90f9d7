/* The CUDA driver API used directly, as a program that loads its own kernels does: device
 * queries, a context, a module from a fatbin file (argv[1]), functions, memory, copies both
 * ways, memsets, launches with parameters of several kinds (by kernelParams and by the extra
 * buffer), streams and events, libraries (how cudart loads its kernels) and module variables.
 * Prints what it computed; through Wormhole the output must be
 * the native one. Exit 0 when every result is right; 2 with the failing call's status. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                            \
            const char *name = NULL;                                                         \
            cuGetErrorName(r_, &name);                                                       \
            printf("error: %s -> %d %s\n", #call, (int)r_, name ? name : "?");               \
            return 2;                                                                        \
        }                                                                                    \
    } while (0)

struct Affine { float scale; int offset; double bias; };
struct Quad { int v[4]; };

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*len + 1);
    if (fread(p, 1, *len, f) != *len) { fclose(f); free(p); return NULL; }
    ((char *)p)[*len] = 0;
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) { printf("usage: driver_api KERNELS.fatbin\n"); return 1; }
    size_t image_len = 0;
    void *image = read_file(argv[1], &image_len);
    if (!image) { printf("cannot read %s\n", argv[1]); return 1; }

    CHECK(cuInit(0));
    int version = 0, count = 0;
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&count));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    char name[256];
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    int major = 0, minor = 0, sms = 0;
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    size_t total = 0;
    CHECK(cuDeviceTotalMem(&total, dev));
    printf("device: %s, sm_%d%d, %d SMs, memory %s\n", name, major, minor, sms, total > 0 ? "yes" : "no");

    CUcontext ctx, current;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuCtxGetCurrent(&current));
    printf("primary context current: %s\n", current == ctx ? "yes" : "no");

    CUmodule module;
    CHECK(cuModuleLoadData(&module, image));
    CUfunction vadd, affine;
    CHECK(cuModuleGetFunction(&vadd, module, "vadd"));
    CHECK(cuModuleGetFunction(&affine, module, "affine"));
    CUfunction missing;
    CUresult nf = cuModuleGetFunction(&missing, module, "no_such_kernel");
    printf("missing kernel: %d\n", (int)nf);

    const int n = 1 << 16;
    const size_t bytes = n * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    for (int i = 0; i < n; i++) { ha[i] = (float)i; hb[i] = 0.5f * i; }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, ha, bytes));
    CHECK(cuMemcpyHtoD(db, hb, bytes));
    CHECK(cuMemsetD32(dc, 0, n));

    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent start, stop;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(start, stream));
    int nn = n;
    void *args[] = {&da, &db, &dc, &nn};
    CHECK(cuLaunchKernel(vadd, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, args, NULL));
    CHECK(cuEventRecord(stop, stream));
    CHECK(cuStreamSynchronize(stream));
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, start, stop));
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    long bad = 0;
    for (int i = 0; i < n; i++) bad += hc[i] != 1.5f * i;
    printf("vadd: %ld wrong, timed: %s\n", bad, ms >= 0 ? "yes" : "no");

    /* Parameters of several kinds, by kernelParams. */
    struct Affine t = {2.0f, 3, 0.25};
    struct Quad q = {{1, 2, 3, 4}};
    char tag = 5;
    void *args2[] = {&dc, &t, &q, &tag, &nn};
    CHECK(cuLaunchKernel(affine, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args2, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    bad = 0;
    for (int i = 0; i < n; i++) bad += hc[i] != (1.5f * i) * 2.0f + 3 + 0.25f + (float)(i % 4 + 1) + 5;
    printf("affine (kernelParams): %ld wrong\n", bad);

    /* The same launch by the extra buffer, laid out as the driver reports the parameters. */
    size_t offsets[5], sizes[5], size = 0;
    for (int i = 0; i < 5; i++) {
        CHECK(cuFuncGetParamInfo(affine, i, &offsets[i], &sizes[i]));
        if (offsets[i] + sizes[i] > size) size = offsets[i] + sizes[i];
    }
    unsigned char *buffer = calloc(1, size);
    void *values[] = {&dc, &t, &q, &tag, &nn};
    for (int i = 0; i < 5; i++) memcpy(buffer + offsets[i], values[i], sizes[i]);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    CHECK(cuMemcpyHtoD(dc, hc, bytes));
    CHECK(cuLaunchKernel(affine, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuCtxSynchronize());
    float *hd = malloc(bytes);
    CHECK(cuMemcpyDtoH(hd, dc, bytes));
    bad = 0;
    for (int i = 0; i < n; i++) bad += hd[i] != hc[i] * 2.0f + 3 + 0.25f + (float)(i % 4 + 1) + 5;
    printf("affine (extra buffer): %ld wrong\n", bad);

    /* Stream-ordered copies and memsets (sent without waiting, but for the copy back):
     * memset, copy in, copy across, copy back, on one stream. */
    unsigned *hu = malloc(bytes);
    CHECK(cuMemsetD32Async(db, 0xdeadbeef, n, stream));
    CHECK(cuMemsetD8Async(dc, 0x11, bytes / 2, stream));
    CHECK(cuMemsetD16Async(dc + bytes / 2, 0x2233, bytes / 4, stream));
    CHECK(cuMemcpyHtoDAsync(da, ha, bytes / 4, stream));
    CHECK(cuMemcpyDtoDAsync(db + bytes / 2, da, bytes / 4, stream));
    CHECK(cuMemcpyDtoHAsync(hu, db, bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    bad = 0;
    for (int i = 0; i < n / 2; i++) bad += hu[i] != 0xdeadbeefu;
    for (int i = 0; i < n / 4; i++) bad += ((float *)hu)[n / 2 + i] != ha[i];
    for (int i = n / 2 + n / 4; i < n; i++) bad += hu[i] != 0xdeadbeefu;
    CHECK(cuMemcpyDtoH(hu, dc, bytes));
    for (int i = 0; i < n / 2; i++) bad += hu[i] != 0x11111111u;
    for (int i = n / 2; i < n; i++) bad += hu[i] != 0x22332233u;
    printf("async memsets and copies: %ld wrong\n", bad);

    /* What the driver says of addresses: device memory and the program's own. */
    unsigned mtype = 0;
    CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, da + 64));
    CUcontext owner = NULL;
    CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, da));
    CUdeviceptr base = 0;
    size_t range = 0;
    CHECK(cuMemGetAddressRange(&base, &range, da + 100));
    printf("device pointer: type %u, own context %s, range from its start %s, %zu bytes\n", mtype,
           owner == ctx ? "yes" : "no", base == da ? "yes" : "no", range);
    printf("host pointer, one attribute: %d\n",
           (int)cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ha));
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned htype = 99;
    CUdeviceptr hdev = 1;
    size_t hsize = 1;
    void *hdata[] = {&htype, &hdev, &hsize};
    CUresult hr = cuPointerGetAttributes(3, which, hdata, (CUdeviceptr)ha);
    printf("host pointer, three attributes: %d, type %u, device pointer %s, range %zu\n", (int)hr, htype,
           hdev ? "set" : "NULL", hsize);
    printf("address range of a host pointer: %d\n", (int)cuMemGetAddressRange(&base, &range, (CUdeviceptr)ha));
    /* Copies between plain addresses: the driver works out the direction. */
    float *hx = malloc(bytes);
    CHECK(cuMemcpy(db, (CUdeviceptr)ha, bytes));
    CHECK(cuMemcpy(dc, db, bytes));
    /* A device-to-device cuMemcpy may still run when it returns, and `stream` does not wait
     * for the NULL stream (CU_STREAM_NON_BLOCKING): natively the copy back raced it. */
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyAsync((CUdeviceptr)hx, dc, bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    bad = 0;
    for (int i = 0; i < n; i++) bad += hx[i] != ha[i];
    printf("cuMemcpy by address: %ld wrong\n", bad);
    free(hx);
    /* db holds hb again: the launches below add ha and hb. */
    CHECK(cuMemcpyHtoD(db, hb, bytes));

    /* Copies larger than one request carries (Wormhole sends them in 64 MiB pieces). */
    const size_t big = (150u << 20) + 12;
    unsigned char *hbig = malloc(big), *hback = malloc(big);
    for (size_t i = 0; i < big; i++) hbig[i] = (unsigned char)(i * 7 + (i >> 20));
    CUdeviceptr dbig;
    CHECK(cuMemAlloc(&dbig, big));
    CHECK(cuMemcpyHtoD(dbig, hbig, big));
    CHECK(cuMemcpyDtoH(hback, dbig, big));
    printf("150 MiB round trip: %s\n", memcmp(hbig, hback, big) == 0 ? "equal" : "different");
    /* Asynchronous copies of pageable memory (Wormhole stages those from 256 KiB through
     * page-locked memory, in 4 MiB pieces), in stream order after a memset: on a stream and
     * on the NULL stream. */
    const size_t mid = (9u << 20) + 12;
    for (int s = 0; s < 2; s++) {
        CUstream on = s ? NULL : stream;
        memset(hback, 0, mid + 8192);
        CHECK(cuMemsetD8Async(dbig, 0x5a, mid + 8192, on));
        CHECK(cuMemcpyHtoDAsync(dbig + 4096, hbig, mid, on));
        CHECK(cuMemcpyDtoHAsync(hback, dbig, mid + 8192, on));
        CHECK(cuStreamSynchronize(on));
        long wrong = memcmp(hback + 4096, hbig, mid) != 0;
        for (size_t i = 0; i < 4096; i++) wrong += hback[i] != 0x5a;
        for (size_t i = 4096 + mid; i < mid + 8192; i++) wrong += hback[i] != 0x5a;
        printf("async pageable copies on %s: %ld wrong\n", s ? "the NULL stream" : "a stream", wrong);
    }
    /* free(NULL) semantics, which runtimes rely on (cudart forwards cudaFree(0), and cuBLAS's
     * start fails on its error): not statuses of their own, the driver's. */
    printf("freeing NULL: device %d, page-locked host %d\n", (int)cuMemFree(0), (int)cuMemFreeHost(NULL));
    CHECK(cuMemFree(dbig));
    free(hbig);
    free(hback);

    /* What runtimes and frameworks ask of streams and functions. */
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    CHECK(cuStreamIsCapturing(stream, &capturing));
    unsigned int sflags = 0;
    int spriority = -1, blocks = 0;
    CHECK(cuStreamGetFlags(stream, &sflags));
    CHECK(cuStreamGetPriority(stream, &spriority));
    CUcontext sctx = NULL;
    CHECK(cuStreamGetCtx(stream, &sctx));
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vadd, 256, 0));
    CHECK(cuFuncSetAttribute(affine, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
    CHECK(cuEventRecordWithFlags(stop, stream, CU_EVENT_RECORD_DEFAULT));
    CHECK(cuEventSynchronize(stop));
    printf("stream: capturing %d, flags %u, priority %d, its context the current one: %s; vadd: %d blocks of 256 per SM\n",
           (int)capturing, sflags, spriority, sctx == ctx ? "yes" : "no", blocks);
    /* Stream memory operations (PyTorch calls cuStreamWaitValue32 itself) and a stream's
       device: a value written in stream order, waited for, read back. */
    {
        CUdeviceptr flag = 0;
        unsigned int seen = 0;
        CUdevice sdev = -1;
        CHECK(cuMemAlloc(&flag, 16));
        CHECK(cuMemsetD8Async(flag, 0, 16, stream));
        CHECK(cuStreamWriteValue32(stream, flag, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
        CHECK(cuStreamWaitValue32(stream, flag, 7, CU_STREAM_WAIT_VALUE_EQ));
        CHECK(cuStreamWriteValue64(stream, flag + 8, 0x1122334455667788ull, CU_STREAM_WRITE_VALUE_DEFAULT));
        CHECK(cuStreamWaitValue64(stream, flag + 8, 0x1122334455667788ull, CU_STREAM_WAIT_VALUE_GEQ));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemcpyDtoH(&seen, flag, sizeof seen));
        CHECK(cuStreamGetDevice(stream, &sdev));
        char bus[32] = "";
        CUdevice by_bus = -1;
        CHECK(cuDeviceGetPCIBusId(bus, sizeof bus, dev));
        CHECK(cuDeviceGetByPCIBusId(&by_bus, bus));
        printf("stream memory operations: written %u; the stream's device the first: %s, found "
               "by its PCI address: %s\n", seen, sdev == dev ? "yes" : "no", by_bus == dev ? "yes" : "no");
        CHECK(cuMemFree(flag));
    }
    /* CUDA 13's headers name cuStreamGetCtx_v2 (with a green context) and cuCtxCreate_v4 (with
       creation parameters, here none: a plain context, pushed on the thread's stack). */
    CUcontext sctx2 = NULL, created = NULL, popped = NULL;
    CUgreenCtx green = (CUgreenCtx)&sctx2;
    CHECK(cuStreamGetCtx_v2(stream, &sctx2, &green));
    CHECK(cuCtxCreate(&created, NULL, 0, dev));
    CHECK(cuCtxGetCurrent(&current));
    int created_current = current == created && created != ctx;
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxDestroy(created));
    CHECK(cuCtxGetCurrent(&current));
    printf("stream's context (v2): the current one %s, no green context %s; a created context "
           "current %s, popped %s, the primary current again %s\n",
           sctx2 == ctx ? "yes" : "no", green == NULL ? "yes" : "no", created_current ? "yes" : "no",
           popped == created ? "yes" : "no", current == ctx ? "yes" : "no");

    /* Libraries, as cudart loads its kernels: a kernel launched as itself and as its
     * function, its parameters, a variable found through the library and through its
     * module, and a module read from the file by the driver API. */
    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel kvadd, kbump;
    CHECK(cuLibraryGetKernel(&kvadd, lib, "vadd"));
    CHECK(cuLibraryGetKernel(&kbump, lib, "bump"));
    unsigned int kernels = 0;
    CHECK(cuLibraryGetKernelCount(&kernels, lib));
    size_t poff = 0, psize = 0;
    CHECK(cuKernelGetParamInfo(kvadd, 3, &poff, &psize));
    int kthreads = 0;
    CHECK(cuKernelGetAttribute(&kthreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kvadd, dev));
    int kblocks = 0, kregs = -1;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&kblocks, (CUfunction)kvadd, 256, 0));
    /* Not cuFuncGetAttribute of the kernel cast to a function: driver 580 answers
     * CUDA_ERROR_INVALID_HANDLE there (the cast holds for launches and occupancy). */
    CHECK(cuKernelGetAttribute(&kregs, CU_FUNC_ATTRIBUTE_NUM_REGS, kvadd, dev));
    printf("library: %u kernels, vadd's n at %zu (%zu bytes), up to %d threads a block\n", kernels,
           poff, psize, kthreads);
    printf("a kernel as a function: %d blocks of 256 per SM (as the module's: %s), registers known: %s\n",
           kblocks, kblocks == blocks ? "yes" : "no", kregs > 0 ? "yes" : "no");
    CUfunction fvadd;
    CHECK(cuKernelGetFunction(&fvadd, kvadd));
    /* Where functions and kernels come from, and whether they are loaded (lazy loading). */
    CUmodule fmod = NULL;
    CUlibrary klib = NULL;
    CUfunctionLoadingState loaded = CU_FUNCTION_LOADING_STATE_MAX;
    CHECK(cuFuncGetModule(&fmod, vadd));
    CHECK(cuKernelGetLibrary(&klib, kvadd));
    CHECK(cuFuncLoad(vadd));
    CHECK(cuFuncIsLoaded(&loaded, vadd));
    printf("a function's module, a kernel's library: %s, %s; loaded: %d\n", fmod == module ? "its own" : "another",
           klib == lib ? "its own" : "another", (int)loaded);
    CHECK(cuMemsetD32(dc, 0, n));
    CHECK(cuLaunchKernel((CUfunction)kvadd, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    int lib_ok = 1;
    for (int i = 0; i < n; i++) lib_ok &= hc[i] == ha[i] + hb[i];
    CHECK(cuMemsetD32(dc, 0, n));
    CHECK(cuLaunchKernel(fvadd, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    for (int i = 0; i < n; i++) lib_ok &= hc[i] == ha[i] + hb[i];
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = spriority;
    CUlaunchConfig config = {(n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, &attr, 1};
    CHECK(cuMemsetD32(dc, 0, n));
    CHECK(cuLaunchKernelEx(&config, fvadd, args, NULL));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    for (int i = 0; i < n; i++) lib_ok &= hc[i] == ha[i] + hb[i];
    printf("library kernel, as itself, as a function and by cuLaunchKernelEx: %s\n", lib_ok ? "right" : "wrong");
    const char *fname = NULL, *kname = NULL;
    CHECK(cuFuncGetName(&fname, vadd));
    CHECK(cuKernelGetName(&kname, kvadd));
    printf("names: function %s, kernel %s\n", fname, kname);
    CUdeviceptr gcounter, mcounter;
    size_t gsize = 0, msize = 0;
    CHECK(cuLibraryGetGlobal(&gcounter, &gsize, lib, "counter"));
    int start_value = 40, by = 2, counted = 0;
    CHECK(cuMemcpyHtoD(gcounter, &start_value, sizeof start_value));
    void *bump_args[] = {&by};
    CHECK(cuLaunchKernel((CUfunction)kbump, 1, 1, 1, 32, 1, 1, 0, NULL, bump_args, NULL));
    CHECK(cuMemcpyDtoH(&counted, gcounter, sizeof counted));
    CUmodule lmod;
    CHECK(cuLibraryGetModule(&lmod, lib));
    CHECK(cuModuleGetGlobal(&mcounter, &msize, lmod, "counter"));
    printf("library variable: %zu bytes, %d after a bump, the module's the same: %s\n", gsize,
           counted, mcounter == gcounter && msize == gsize ? "yes" : "no");
    CHECK(cuLibraryUnload(lib));
    CUmodule from_file;
    CHECK(cuModuleLoad(&from_file, argv[1]));
    CUdeviceptr fcounter;
    CHECK(cuModuleGetGlobal(&fcounter, NULL, from_file, "counter"));
    CHECK(cuMemcpyDtoH(&counted, fcounter, sizeof counted));
    printf("a module from the file has its own variable: %d\n", counted);
    CHECK(cuModuleUnload(from_file));
    CUmodule nofile;
    printf("module from a missing file: %d\n", (int)cuModuleLoad(&nofile, "/nonexistent/kernels.fatbin"));

    /* Page-locked host memory: allocated and registered, copied to and from, asked about. */
    float *pinned = NULL, *registered = malloc(bytes);
    CHECK(cuMemHostAlloc((void **)&pinned, bytes, CU_MEMHOSTALLOC_PORTABLE));
    CHECK(cuMemHostRegister(registered, bytes, 0));
    for (int i = 0; i < n; i++) pinned[i] = 3.0f * i;
    CHECK(cuMemcpyHtoDAsync(dc, pinned, bytes, stream));
    CHECK(cuMemcpyDtoHAsync(registered, dc, bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    unsigned int hflags = 0, ptype = 0;
    CHECK(cuMemHostGetFlags(&hflags, pinned));
    CHECK(cuPointerGetAttribute(&ptype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(pinned + 5)));
    printf("page-locked: copies %s, flags %u, memory type %u, register twice: %d\n",
           memcmp(pinned, registered, bytes) == 0 ? "equal" : "different", hflags, ptype,
           (int)cuMemHostRegister(registered, bytes, 0));
    CHECK(cuMemHostUnregister(registered));
    printf("unregister twice: %d, free of NULL: %d\n", (int)cuMemHostUnregister(registered),
           (int)cuMemFreeHost(NULL));
    CHECK(cuMemFreeHost(pinned));
    free(registered);

    /* Mapped page-locked memory: the device reads and writes it at its host address (unified
     * addressing); copies into it complete with their stream; a partial range copies too. */
    {
        float *in = NULL, *out = NULL;
        CHECK(cuMemHostAlloc((void **)&in, bytes, CU_MEMHOSTALLOC_DEVICEMAP));
        CHECK(cuMemAllocHost((void **)&out, bytes));
        for (int i = 0; i < n; i++) { in[i] = 1.0f + i; out[i] = -1.0f; }
        CUdeviceptr din = 0, dout = 0, attr_ptr = 0;
        CHECK(cuMemHostGetDevicePointer(&din, in, 0));
        CHECK(cuMemHostGetDevicePointer(&dout, out, 0));
        CHECK(cuPointerGetAttribute(&attr_ptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)in));
        printf("mapped: device pointer is the host pointer: %s, attribute agrees: %s\n",
               din == (CUdeviceptr)in && dout == (CUdeviceptr)out ? "yes" : "no",
               attr_ptr == din ? "yes" : "no");
        /* out = in + hb, computed by the device straight from and into host memory. */
        void *zargs[] = {&din, &db, &dout, (void *)&n};
        CHECK(cuLaunchKernel(vadd, n / 256, 1, 1, 256, 1, 1, 0, stream, zargs, NULL));
        CHECK(cuStreamSynchronize(stream));
        int zero_copy_ok = 1;
        for (int i = 0; i < n; i++) zero_copy_ok &= out[i] == in[i] + 0.5f * i;
        /* Through the device: an async copy lands when the stream is done, a sync one at once. */
        for (int i = 0; i < n; i++) out[i] = 0.0f;
        CHECK(cuMemcpyHtoDAsync(dc, in, bytes, stream));
        CHECK(cuMemcpyDtoHAsync(out, dc, bytes, stream));
        CHECK(cuStreamSynchronize(stream));
        int async_ok = memcmp(in, out, bytes) == 0;
        for (int i = 0; i < n; i++) out[i] = 0.0f;
        CHECK(cuMemcpyDtoH(out + 100, dc + 100 * sizeof(float), 1000 * sizeof(float)));
        int part_ok = out[99] == 0.0f && out[100] == in[100] && out[1099] == in[1099] && out[1100] == 0.0f;
        in[7] = 42.0f;
        CHECK(cuMemcpyHtoD(dc, in, bytes));
        float seven = 0;
        CHECK(cuMemcpyDtoH(&seven, dc + 7 * sizeof(float), sizeof seven));
        printf("mapped: kernel on host memory %s, async copies %s, part of a range %s, sync copy %s\n",
               zero_copy_ok ? "right" : "wrong", async_ok ? "right" : "wrong",
               part_ok ? "right" : "wrong", seven == 42.0f ? "right" : "wrong");
        /* Host to host from page-locked memory, in stream order: after the device's copy into
           it on the same stream (the program's own buffer is never written by the device). */
        float *plain = malloc(bytes);
        for (int i = 0; i < n; i++) { out[i] = -2.0f; plain[i] = 0.0f; }
        CHECK(cuMemcpyDtoHAsync(out, dc, bytes, stream));
        CHECK(cuMemcpyAsync((CUdeviceptr)plain, (CUdeviceptr)out, bytes, stream));
        CHECK(cuStreamSynchronize(stream));
        printf("host to host after the device's copy, in stream order: %s\n",
               memcmp(plain, in, bytes) == 0 ? "right" : "wrong");
        free(plain);
        CHECK(cuMemFreeHost(in));
        CHECK(cuMemFreeHost(out));
    }

    /* Cluster occupancy (CUTLASS sizes persistent Hopper kernels with it): clusters of 2. */
    {
        CUlaunchAttribute cl;
        memset(&cl, 0, sizeof cl);
        cl.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        cl.value.clusterDim.x = 2;
        cl.value.clusterDim.y = 1;
        cl.value.clusterDim.z = 1;
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = 64;
        cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 256;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = stream;
        cfg.attrs = &cl;
        cfg.numAttrs = 1;
        int clusters = -1, size = -1;
        CHECK(cuOccupancyMaxActiveClusters(&clusters, vadd, &cfg));
        cfg.numAttrs = 0;
        CHECK(cuOccupancyMaxPotentialClusterSize(&size, vadd, &cfg));
        printf("cluster occupancy: %d active clusters of 2, potential cluster size %d\n", clusters, size);
    }

    /* Tensor maps (cuBLASLt's Hopper GEMMs make them): a 2D float tensor over device
     * memory, made at two addresses, one moved to the other's, and one the driver refuses. */
    {
        CUtensorMap m1, m2, m3;
        cuuint64_t gdim[2] = {256, 256}, gstride[1] = {256 * sizeof(float)};
        /* A 128-byte swizzle takes a box whose inner dimension is at most 128 bytes. */
        cuuint32_t box[2] = {32, 32}, estride[2] = {1, 1};
        CUdeviceptr tens;
        CHECK(cuMemAlloc(&tens, 2 * 256 * 256 * sizeof(float)));
        CUdeviceptr other = tens + 256 * 256 * sizeof(float);
        CHECK(cuTensorMapEncodeTiled(&m1, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)tens, gdim, gstride, box,
                                     estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
        CHECK(cuTensorMapEncodeTiled(&m2, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)other, gdim, gstride, box,
                                     estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
        cuuint32_t big_box[2] = {512, 64};
        CUresult refused = cuTensorMapEncodeTiled(&m3, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)tens, gdim,
                                                  gstride, big_box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        CUtensorMap m4 = m1;
        CHECK(cuTensorMapReplaceAddress(&m4, (void *)other));
        printf("tensor maps: moved equals made there: %s, a 512-wide box: %d\n",
               memcmp(&m2, &m4, sizeof m2) == 0 ? "yes" : "no", (int)refused);
        CHECK(cuMemFree(tens));
    }

    /* A pitched allocation (cudaMallocPitch): the driver picks the pitch. */
    {
        CUdeviceptr pitched_alloc;
        size_t pitch = 0;
        CHECK(cuMemAllocPitch(&pitched_alloc, &pitch, 1000, 10, 4));
        printf("pitched allocation: pitch %zu for rows of 1000 bytes\n", pitch);
        CHECK(cuMemsetD8(pitched_alloc, 7, pitch * 10));
        /* 2D memsets: 250 words per row, then 100 halves of the last row, on a stream. */
        CHECK(cuMemsetD2D32(pitched_alloc, pitch, 0x01020304u, 250, 10));
        CHECK(cuMemsetD2D16Async(pitched_alloc + pitch * 9, pitch, 0xabcd, 100, 1, stream));
        CHECK(cuStreamSynchronize(stream));
        unsigned int first_row[250], last_row[250];
        CHECK(cuMemcpyDtoH(first_row, pitched_alloc, sizeof first_row));
        CHECK(cuMemcpyDtoH(last_row, pitched_alloc + pitch * 9, sizeof last_row));
        printf("2D memsets: %s\n", first_row[249] == 0x01020304u && last_row[0] == 0xabcdabcdu &&
                                        last_row[50] == 0x01020304u ? "right" : "wrong");
        CHECK(cuMemFree(pitched_alloc));
    }

    /* 2D copies: 100 rows of 64 floats into a pitched device area and back, and host to
     * host (cudart's cudaMemcpy between two host buffers comes this way). */
    {
        enum { W = 64, H = 100, PITCH = 512 };
        float *rows = malloc(W * H * sizeof(float)), *back = calloc(W * H, sizeof(float));
        for (int i = 0; i < W * H; i++) rows[i] = (float)(i % 977);
        CUdeviceptr pitched;
        CHECK(cuMemAlloc(&pitched, PITCH * H));
        CUDA_MEMCPY2D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = rows;
        c.srcPitch = W * sizeof(float);
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = pitched;
        c.dstPitch = PITCH;
        c.WidthInBytes = W * sizeof(float);
        c.Height = H;
        CHECK(cuMemcpy2D(&c));
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.srcDevice = pitched;
        c.srcPitch = PITCH;
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = back;
        c.dstPitch = W * sizeof(float);
        c.WidthInBytes = W * sizeof(float);
        c.Height = H;
        CHECK(cuMemcpy2DAsync(&c, stream));
        CHECK(cuStreamSynchronize(stream));
        int same = memcmp(rows, back, W * H * sizeof(float)) == 0;
        memset(back, 0, W * H * sizeof(float));
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = rows;
        c.srcPitch = W * sizeof(float);
        CHECK(cuMemcpy2DUnaligned(&c));
        printf("2D copies: through the device %s, host to host %s\n", same ? "equal" : "different",
               memcmp(rows, back, W * H * sizeof(float)) == 0 ? "equal" : "different");
        CHECK(cuMemFree(pitched));
        free(rows);
        free(back);
    }

    /* Stream attributes: set, read back, copied to another stream. */
    {
        CUstreamAttrValue v;
        memset(&v, 0, sizeof v);
        v.syncPolicy = CU_SYNC_POLICY_YIELD;
        CUresult set = cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v);
        CUstreamAttrValue back;
        memset(&back, 0xff, sizeof back);
        CUresult get = cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &back);
        CUstream other;
        CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
        CUresult copy = cuStreamCopyAttributes(other, stream);
        CUstreamAttrValue copied;
        memset(&copied, 0, sizeof copied);
        CUresult get2 = cuStreamGetAttribute(other, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &copied);
        printf("stream attributes: set %d, get %d (%d), copy %d (%d %d)\n", (int)set, (int)get,
               (int)back.syncPolicy, (int)copy, (int)get2, (int)copied.syncPolicy);
        CHECK(cuStreamDestroy(other));
    }

    /* The current context's scheduling flags, changed and restored (cudaSetDeviceFlags on an
       active device). */
    {
        unsigned before = 0, during = 0;
        CHECK(cuCtxGetFlags(&before));
        CUresult set = cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC);
        CHECK(cuCtxGetFlags(&during));
        CUresult restored = cuCtxSetFlags(before);
        printf("context flags: set %d, blocking sync %s, restored %d\n", (int)set,
               (during & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC ? "yes" : "no",
               (int)restored);
    }

    /* The device's default memory pool, as programs using cudaMallocAsync configure it. */
    {
        CUmemoryPool pool, current;
        CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
        CHECK(cuDeviceGetMemPool(&current, dev));
        cuuint64_t threshold = UINT64_MAX, back = 0, reserved = 0, trimmed = 1;
        CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
        CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &back));
        struct {
            int value, guard;
        } reuse = {-1, 0x5a5a5a5a};
        CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse.value));
        CUdeviceptr pooled;
        CHECK(cuMemAllocAsync(&pooled, 1 << 20, stream));
        CHECK(cuMemFreeAsync(pooled, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
        CHECK(cuMemPoolTrimTo(pool, 0));
        CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &trimmed));
        threshold = 0;
        CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
        printf("default pool: current %s, threshold %s, reuse %d, int written alone %s, kept after "
               "free %s, after trim %llu, bad attribute %d\n",
               pool == current ? "yes" : "no", back == UINT64_MAX ? "kept" : "lost", reuse.value,
               reuse.guard == 0x5a5a5a5a ? "yes" : "no", reserved > 0 ? "yes" : "no",
               (unsigned long long)trimmed,
               (int)cuMemPoolGetAttribute(pool, (CUmemPool_attribute)99, &back));
    }

    /* Peer copies (on one device, where cudaMemcpyPeer still works) and peer access to
       oneself. */
    {
        float *src = malloc(bytes);
        CHECK(cuMemsetD32(dc, 0, n));
        CHECK(cuMemcpyPeer(dc, ctx, da, ctx, bytes));
        CHECK(cuMemcpyDtoH(hc, dc, bytes));
        CHECK(cuMemcpyDtoH(src, da, bytes));
        int same = memcmp(hc, src, bytes) == 0;
        CHECK(cuMemsetD32(dc, 0, n));
        CHECK(cuMemcpyPeerAsync(dc, ctx, db, ctx, bytes, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemcpyDtoH(hc, dc, bytes));
        CHECK(cuMemcpyDtoH(src, db, bytes));
        printf("peer copies: %s, async %s, peer access to itself %d, disable %d\n",
               same ? "equal" : "different", memcmp(hc, src, bytes) == 0 ? "equal" : "different",
               (int)cuCtxEnablePeerAccess(ctx, 0), (int)cuCtxDisablePeerAccess(ctx));
        free(src);
    }

    /* The deprecated shared memory bank configuration (old libraries still set it). */
    {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        CUsharedconfig config = 0;
        CUresult got = cuCtxGetSharedMemConfig(&config);
        CUresult set = cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE);
        CUresult fset = cuFuncSetSharedMemConfig(vadd, CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE);
#pragma GCC diagnostic pop
        printf("shared memory config: %d (%d), set %d, function %d\n", (int)got, (int)config,
               (int)set, (int)fset);
    }

    /* JIT options (cuModuleLoadDataEx): the logs land in this program's buffers, the sizes
       and the wall time in its value slots. */
    {
        static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                                  ".visible .entry nop() { ret; }\n";
        char info[4096] = "", error[4096] = "untouched";
        CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                               CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                               CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_LOG_VERBOSE, CU_JIT_WALL_TIME};
        void *vals[] = {info, (void *)(uintptr_t)sizeof info, error, (void *)(uintptr_t)sizeof error,
                        (void *)(uintptr_t)3, (void *)(uintptr_t)1, NULL};
        CUmodule jit;
        CUresult st = cuModuleLoadDataEx(&jit, ptx, 7, opts, vals);
        float wall;
        memcpy(&wall, &vals[6], sizeof wall);
        /* Not the info log: a load the JIT cache answers (the second run's) may write none. */
        printf("JIT load: %d, error log size %u, wall time %s\n", (int)st,
               (unsigned)(uintptr_t)vals[3], wall >= 0 ? "given" : "negative");
        CUfunction nop;
        if (st == CUDA_SUCCESS) {
            CHECK(cuModuleGetFunction(&nop, jit, "nop"));
            CHECK(cuLaunchKernel(nop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            CHECK(cuCtxSynchronize());
            CHECK(cuModuleUnload(jit));
        }
        CUjit_option eopts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *evals[] = {error, (void *)(uintptr_t)sizeof error};
        st = cuModuleLoadDataEx(&jit, "this is not PTX", 2, eopts, evals);
        printf("JIT load of bad PTX: %d, error log: %s\n", (int)st, error);
    }

    /* JIT linking (cuLink*): the logs of the link's options grow with each step; the linked
       image is loaded and run. */
    {
        static const char put42[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                                    ".visible .entry put42(.param .u64 out) {\n"
                                    ".reg .b64 %rd<2>;\n.reg .b32 %r<1>;\n"
                                    "ld.param.u64 %rd0, [out];\ncvta.to.global.u64 %rd1, %rd0;\n"
                                    "mov.u32 %r0, 42;\nst.global.u32 [%rd1], %r0;\nret;\n}\n";
        char info[4096] = "", error[4096] = "";
        CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                               CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                               CU_JIT_LOG_VERBOSE};
        void *vals[] = {info, (void *)(uintptr_t)sizeof info, error, (void *)(uintptr_t)sizeof error,
                        (void *)(uintptr_t)1};
        CUlinkState link;
        CHECK(cuLinkCreate(5, opts, vals, &link));
        CUresult bad = cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)"not PTX", 8, "bad.ptx", 0,
                                     NULL, NULL);
        printf("link of bad PTX: %d, error log %s\n", (int)bad, error[0] ? "written" : "empty");
        CHECK(cuLinkDestroy(link));
        error[0] = info[0] = 0;
        vals[1] = (void *)(uintptr_t)sizeof info;
        vals[3] = (void *)(uintptr_t)sizeof error;
        CHECK(cuLinkCreate(5, opts, vals, &link));
        CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)put42, sizeof put42, "put42.ptx", 0,
                            NULL, NULL));
        void *cubin;
        size_t cubin_size;
        CHECK(cuLinkComplete(link, &cubin, &cubin_size));
        CUmodule linked;
        CHECK(cuModuleLoadData(&linked, cubin));
        CHECK(cuLinkDestroy(link));
        CUfunction put;
        CHECK(cuModuleGetFunction(&put, linked, "put42"));
        CUdeviceptr cell;
        CHECK(cuMemAlloc(&cell, sizeof(unsigned)));
        void *put_args[] = {&cell};
        CHECK(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, NULL, put_args, NULL));
        unsigned got = 0;
        CHECK(cuMemcpyDtoH(&got, cell, sizeof got));
        printf("linked kernel: %u, image %s\n", got, cubin_size > 0 ? "given" : "empty");
        CHECK(cuMemFree(cell));
        CHECK(cuModuleUnload(linked));
    }

    /* Virtual memory management, as PyTorch's expandable segments use it: one reservation,
       two handles of the granularity mapped side by side (one released while mapped, which
       keeps its memory), access set over both, then a copy, a memset, a kernel and a copy on
       the device, each across the seam between them; then undone. */
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)dev;
        size_t seg = 0;
        CHECK(cuMemGetAllocationGranularity(&seg, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUdeviceptr va;
        CHECK(cuMemAddressReserve(&va, 8 * seg, 0, 0, 0));
        CUmemGenericAllocationHandle h0, h1;
        CHECK(cuMemCreate(&h0, seg, &prop, 0));
        CHECK(cuMemCreate(&h1, seg, &prop, 0));
        CHECK(cuMemMap(va, seg, 0, h0, 0));
        CHECK(cuMemMap(va + seg, seg, 0, h1, 0));
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(cuMemSetAccess(va, 2 * seg, &access, 1));
        CHECK(cuMemRelease(h0));
        unsigned long long flags = 0;
        CHECK(cuMemGetAccess(&flags, &access.location, va + seg));
        CUmemAllocationProp back;
        memset(&back, 0xff, sizeof back);
        CHECK(cuMemGetAllocationPropertiesFromHandle(&back, h1));
        CUdeviceptr va_a = va + seg - bytes / 2, va_c = va + seg + bytes / 2;
        CHECK(cuMemcpyHtoD(db, hb, bytes));
        CHECK(cuMemcpyHtoD(va_a, ha, bytes));
        CHECK(cuMemsetD32(va_c, 0, n));
        void *vargs[] = {&va_a, &db, &va_c, &nn};
        CHECK(cuLaunchKernel(vadd, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, vargs, NULL));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemcpyDtoH(hc, va_c, bytes));
        long wrong = 0;
        for (int i = 0; i < n; i++) wrong += hc[i] != 1.5f * i;
        CHECK(cuMemcpyDtoD(va_c, va_a, bytes));
        CHECK(cuMemcpyDtoH(hc, va_c, bytes));
        for (int i = 0; i < n; i++) wrong += hc[i] != ha[i];
        CUmemorytype mtype = 0;
        CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va_a));
        /* NCCL's way to its handle: retained from an address, released once more. */
        CUmemGenericAllocationHandle again = 0;
        CHECK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(va + seg + 64)));
        int retained_same = again == h1;
        CHECK(cuMemRelease(again));
        CHECK(cuMemUnmap(va, seg));
        CHECK(cuMemUnmap(va + seg, seg));
        CHECK(cuMemRelease(h1));
        CHECK(cuMemAddressFree(va, 8 * seg));
        printf("virtual memory: granularity %s, access %llu, properties: type %d, handle types %d, "
               "this device %s; across the seam: %ld wrong, memory type %u; retained from an "
               "address: %s\n",
               seg && !(seg & (seg - 1)) ? "a power of two" : "odd", flags, (int)back.type,
               (int)back.requestedHandleTypes,
               back.location.type == CU_MEM_LOCATION_TYPE_DEVICE && back.location.id == (int)dev
                   ? "yes"
                   : "no",
               wrong, (unsigned)mtype, retained_same ? "its handle" : "another");
    }

    /* Errors the driver reports. */
    printf("free of a bad pointer: %d\n", (int)cuMemFree(da + 4));
    printf("launch with too many threads: %d\n",
           (int)cuLaunchKernel(vadd, 1, 1, 1, 4096, 1, 1, 0, NULL, args, NULL));

    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(stop));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(module));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
