/* Wormhole's CUDA benchmark client: the CUDA driver API, loaded as cudart loads it
 * (dlopen("libcuda.so.1")), run natively and through Wormhole by `wh bench --part cuda`.
 * Needs no CUDA headers or toolkit to build: the few entry points are declared here, and the
 * kernel is PTX the driver compiles. Prints one "key value" line per measurement.
 * Usage: cuda_bench_client MODE
 *   calls   sync calls, tiny kernels, launches, allocation, copies (pageable, pageable on a
 *           stream, pinned), and cuBLAS SGEMM 4096^3 where cuBLAS loads (libcublas.so.13 on
 *           the library path, or the file WORMHOLE_BENCH_CUBLAS names)
 *   start   time from process start to the first kernel result (measured by the caller) */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "bench_measure.h"

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuEventCreate)(CUevent *, unsigned);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuEventQuery)(CUevent);
static CUresult (*cuEventSynchronize)(CUevent);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemAllocHost)(void **, size_t);
static CUresult (*cuMemFreeHost)(void *);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);

#define CHECK(x)                                                                   \
    do {                                                                           \
        CUresult e_ = (x);                                                         \
        if (e_ != 0) {                                                             \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, e_);      \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* tiny(int *x, int v): the first thread writes v. PTX for any GPU since sm_50. */
static const char *PTX =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry tiny(.param .u64 x, .param .u32 v)\n{\n"
    "  .reg .pred %p;\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<3>;\n"
    "  mov.u32 %r1, %tid.x;\n  mov.u32 %r2, %ctaid.x;\n  or.b32 %r3, %r1, %r2;\n"
    "  setp.ne.u32 %p, %r3, 0;\n  @%p bra DONE;\n"
    "  ld.param.u64 %rd1, [x];\n  cvta.to.global.u64 %rd2, %rd1;\n"
    "  ld.param.u32 %r1, [v];\n  st.global.u32 [%rd2], %r1;\n"
    "DONE:\n  ret;\n}\n";

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "libcuda.so.1 has no %s\n", name); exit(1); }
    return p;
}

/* cuBLAS, loaded at run time (declared here: no toolkit needed to build). */
typedef void *cublasHandle_t;
static int (*cublasCreate)(cublasHandle_t *);
static int (*cublasSetStream)(cublasHandle_t, CUstream);
static int (*cublasSgemm)(cublasHandle_t, int, int, int, int, int, const float *, const float *,
                          int, const float *, int, const float *, float *, int);
static int (*cublasDestroy)(cublasHandle_t);
enum { CUBLAS_OP_N = 0 };

static CUfunction tiny;
static CUstream stream;
static CUdeviceptr dx;

static void setup(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "no CUDA driver: %s\n", dlerror()); exit(1); }
    *(void **)&cuInit = sym(lib, "cuInit");
    *(void **)&cuDeviceGet = sym(lib, "cuDeviceGet");
    *(void **)&cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
    *(void **)&cuModuleLoadData = sym(lib, "cuModuleLoadData");
    *(void **)&cuModuleGetFunction = sym(lib, "cuModuleGetFunction");
    *(void **)&cuLaunchKernel = sym(lib, "cuLaunchKernel");
    *(void **)&cuStreamCreate = sym(lib, "cuStreamCreate");
    *(void **)&cuStreamSynchronize = sym(lib, "cuStreamSynchronize");
    *(void **)&cuEventCreate = sym(lib, "cuEventCreate");
    *(void **)&cuEventRecord = sym(lib, "cuEventRecord");
    *(void **)&cuEventQuery = sym(lib, "cuEventQuery");
    *(void **)&cuEventSynchronize = sym(lib, "cuEventSynchronize");
    *(void **)&cuMemAlloc = sym(lib, "cuMemAlloc_v2");
    *(void **)&cuMemFree = sym(lib, "cuMemFree_v2");
    *(void **)&cuMemAllocHost = sym(lib, "cuMemAllocHost_v2");
    *(void **)&cuMemFreeHost = sym(lib, "cuMemFreeHost");
    *(void **)&cuMemcpyHtoD = sym(lib, "cuMemcpyHtoD_v2");
    *(void **)&cuMemcpyDtoH = sym(lib, "cuMemcpyDtoH_v2");
    *(void **)&cuMemcpyHtoDAsync = sym(lib, "cuMemcpyHtoDAsync_v2");
    *(void **)&cuMemcpyDtoHAsync = sym(lib, "cuMemcpyDtoHAsync_v2");
    CHECK(cuInit(0));
    int dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule m;
    CHECK(cuModuleLoadData(&m, PTX));
    CHECK(cuModuleGetFunction(&tiny, m, "tiny"));
    CHECK(cuStreamCreate(&stream, 0));
    CHECK(cuMemAlloc(&dx, 4096));
}

static void launch(int v) {
    void *args[] = {&dx, &v};
    CHECK(cuLaunchKernel(tiny, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
}

/* Copies of `n` bytes each way between `host` and the device, in GB/s (`kind`: pageable or
 * pinned). */
static void copies(const char *kind, char *host, CUdeviceptr dev, size_t n) {
    int reps = n <= (1 << 20) ? 200 : n <= (16 << 20) ? 20 : 3;
    memset(host, 1, n);
    CHECK(cuMemcpyHtoD(dev, host, n));
    double t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyHtoD(dev, host, n));
    double th = now() - t;
    t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyDtoH(host, dev, n));
    double td = now() - t;
    printf("%s_htod_%zuKiB_GBps %.3f\n%s_dtoh_%zuKiB_GBps %.3f\n", kind, n >> 10,
           n * (double)reps / th / 1e9, kind, n >> 10, n * (double)reps / td / 1e9);
}

/* As `copies`, each copy on `stream` (cuMemcpy*Async) followed by its synchronisation: what
 * PyTorch's `.to()` of pageable memory does. */
static void async_copies(const char *kind, char *host, CUdeviceptr dev, size_t n) {
    int reps = n <= (1 << 20) ? 200 : 20;
    memset(host, 1, n);
    double t = now();
    for (int i = 0; i < reps; i++) {
        CHECK(cuMemcpyHtoDAsync(dev, host, n, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    double th = now() - t;
    t = now();
    for (int i = 0; i < reps; i++) {
        CHECK(cuMemcpyDtoHAsync(host, dev, n, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    double td = now() - t;
    printf("%s_htod_%zuKiB_GBps %.3f\n%s_dtoh_%zuKiB_GBps %.3f\n", kind, n >> 10,
           n * (double)reps / th / 1e9, kind, n >> 10, n * (double)reps / td / 1e9);
}

/* SGEMM 4096^3 (C = A B), twenty of them on the stream then one sync, in TFLOP/s; nothing
 * where cuBLAS does not load. */
static void sgemm(void) {
    const char *path = getenv("WORMHOLE_BENCH_CUBLAS");
    void *lib = dlopen(path && *path ? path : "libcublas.so.13", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "no cuBLAS (%s): no SGEMM row\n", dlerror());
        return;
    }
    *(void **)&cublasCreate = dlsym(lib, "cublasCreate_v2");
    *(void **)&cublasSetStream = dlsym(lib, "cublasSetStream_v2");
    *(void **)&cublasSgemm = dlsym(lib, "cublasSgemm_v2");
    *(void **)&cublasDestroy = dlsym(lib, "cublasDestroy_v2");
    if (!cublasCreate || !cublasSetStream || !cublasSgemm || !cublasDestroy) {
        fprintf(stderr, "cuBLAS lacks an entry point: no SGEMM row\n");
        return;
    }
    const int n = 4096, reps = 20;
    const size_t bytes = (size_t)n * n * sizeof(float);
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc(&a, bytes));
    CHECK(cuMemAlloc(&b, bytes));
    CHECK(cuMemAlloc(&c, bytes));
    float *host = malloc(bytes);
    for (size_t i = 0; i < (size_t)n * n; i++) host[i] = (float)(i % 7) * 0.25f;
    CHECK(cuMemcpyHtoD(a, host, bytes));
    CHECK(cuMemcpyHtoD(b, host, bytes));
    free(host);
    cublasHandle_t h;
    int st = cublasCreate(&h);
    if (st != 0) {
        fprintf(stderr, "cublasCreate -> %d: no SGEMM row\n", st);
        exit(1);
    }
    CHECK(cublasSetStream(h, stream));
    const float one = 1, zero = 0;
    /* The first builds cuBLAS's state (kernels loaded, workspace): not timed. */
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (const float *)a, n,
                      (const float *)b, n, &zero, (float *)c, n));
    CHECK(cuStreamSynchronize(stream));
    double t = now();
    for (int i = 0; i < reps; i++)
        CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (const float *)a, n,
                          (const float *)b, n, &zero, (float *)c, n));
    CHECK(cuStreamSynchronize(stream));
    t = now() - t;
    printf("sgemm_4096_tflops %.2f\n", 2.0 * n * n * (double)n * reps / t / 1e12);
    CHECK(cublasDestroy(h));
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(c));
}

static void calls(void) {
    enum { N = 2000 };
    static double v[N];
    /* A synchronous call that the device answers at once: the query of a finished event. */
    CUevent ev;
    CHECK(cuEventCreate(&ev, 0));
    CHECK(cuEventRecord(ev, stream));
    CHECK(cuEventSynchronize(ev));
    for (int i = 0; i < N; i++) {
        double t = now();
        CHECK(cuEventQuery(ev));
        v[i] = now() - t;
    }
    stats("sync_call", v, N);
    for (int i = 0; i < N; i++) {
        double t = now();
        launch(i);
        CHECK(cuStreamSynchronize(stream));
        v[i] = now() - t;
    }
    stats("tiny_kernel", v, N);
    const int launches = 100000;
    double t = now();
    for (int i = 0; i < launches; i++) launch(i);
    CHECK(cuStreamSynchronize(stream));
    printf("pipelined_launches_per_s %.0f\n", launches / (now() - t));
    for (int i = 0; i < N; i++) {
        CUdeviceptr p;
        double t0 = now();
        CHECK(cuMemAlloc(&p, 1 << 20));
        CHECK(cuMemFree(p));
        v[i] = now() - t0;
    }
    stats("alloc_free_1MiB", v, N);
    size_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
    size_t biggest = sizes[sizeof sizes / sizeof *sizes - 1];
    CUdeviceptr dev;
    CHECK(cuMemAlloc(&dev, biggest));
    char *pageable = malloc(biggest);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) copies("pageable", pageable, dev, sizes[i]);
    async_copies("pageable_async", pageable, dev, 1 << 20);
    async_copies("pageable_async", pageable, dev, 16 << 20);
    free(pageable);
    void *pinned = NULL;
    CUresult st = cuMemAllocHost(&pinned, biggest);
    if (st == 0) {
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) copies("pinned", pinned, dev, sizes[i]);
        CHECK(cuMemFreeHost(pinned));
    } else {
        fprintf(stderr, "cuMemAllocHost -> %d: no pinned copies\n", st);
    }
    CHECK(cuMemFree(dev));
    sgemm();
    printf("client_cpu_s %.3f\n", cpu_seconds());
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "calls";
    setup();
    if (!strcmp(mode, "start")) {
        launch(42);
        int out = 0;
        CHECK(cuMemcpyDtoH(&out, dx, sizeof out));
        printf("start_result %d\n", out);
        return out == 42 ? 0 : 1;
    }
    if (!strcmp(mode, "calls")) {
        calls();
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
