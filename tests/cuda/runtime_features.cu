// The CUDA runtime as ordinary programs use it (built with static and with shared cudart):
// device queries; kernels with parameters of many kinds (pointers, scalars of every width,
// structs with padding, a by-value array of 1 KiB); streams, priorities and events; host
// functions and stream callbacks; pageable and page-locked copies both ways, synchronous and
// asynchronous, up to beyond one 64 MiB piece and at odd offsets; mapped and registered host
// memory; memsets; copies between device ranges and in 2D; a launch error and its clearing;
// several threads at once, each with its own stream. Each result is checked here (exit 1 on a
// wrong one) and printed: through Wormhole it must print what it prints natively.
//
// Usage:
//   runtime_features               all of the above
//   runtime_features alloc MIB     allocates MIB MiB (cudaMalloc, then cudaMallocAsync), prints
//                                  what each answered, and then that the device still works:
//                                  a tenant over its quota gets cudaErrorMemoryAllocation and
//                                  carries on
//   runtime_features copy-forever  prints "copying" and copies 64 MiB both ways until killed
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <thread>
#include <unistd.h>
#include <vector>

// A failed check ends the process at once (_exit): exit's teardown of cudart would race the
// other threads still inside CUDA calls.
#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("error: %s -> %d %s: %s\n", #call, (int)e_, cudaGetErrorName(e_),         \
                   cudaGetErrorString(e_));                                                  \
            fflush(stdout);                                                                  \
            _exit(2);                                                                        \
        }                                                                                    \
    } while (0)

#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            printf("wrong: %s: ", #cond);                                                    \
            printf(__VA_ARGS__);                                                             \
            printf("\n");                                                                    \
            fflush(stdout);                                                                  \
            _exit(1);                                                                        \
        }                                                                                    \
    } while (0)

// ---- kernels ----

struct Mixed {  // padding after c and s, a double, an array member
    char c;
    double d;
    short s;
    float f[3];
    long long ll;
};

struct Big {  // 1 KiB by value
    int v[256];
};

__host__ __device__ float mixed_value(int in, Mixed m, const Big &big, char c, short s,
                                      unsigned long long u, double d, float f, int i) {
    return in + m.c + (float)m.d + m.s + m.f[i % 3] + (float)(m.ll % 1000) + big.v[i % 256] + c +
           s + (float)(u % 977) + (float)d + f;
}

__global__ void mixed_args(float *out, const int *in, Mixed m, Big big, char c, short s,
                           unsigned long long u, double d, float f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = mixed_value(in[i], m, big, c, s, u, d, f, i);
}

__global__ void fill(int *a, int v, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) a[i] = v;
}

__global__ void add(int *a, int by, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) a[i] += by;
}

// Bytes changed where they lie, so that what comes back differs from what went.
__global__ void flip(unsigned char *b, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) b[i] ^= 0x5a;
}

// Runs for about `ns` nanoseconds (for a stream still busy when asked).
__global__ void spin(long long ns) {
    long long start = clock64();
    // clock64 counts SM cycles: at most ~2 GHz, so 2 cycles a nanosecond is at least `ns`.
    while (clock64() - start < 2 * ns) {
    }
}

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }

// ---- parts ----

static void device_queries() {
    int count = 0, dev = -1, driver = 0, runtime = 0;
    CHECK(cudaGetDeviceCount(&count));
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    printf("devices %d, current %d, driver %d, runtime %d\n", count, dev, driver, runtime);
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("device 0: %s, cc %d.%d, %d SMs, warp %d, %d threads/block, %zu shared/block, "
           "L2 %d, concurrent kernels %d, unified addressing %d\n",
           p.name, p.major, p.minor, p.multiProcessorCount, p.warpSize, p.maxThreadsPerBlock,
           p.sharedMemPerBlock, p.l2CacheSize, p.concurrentKernels, p.unifiedAddressing);
    int attrs[] = {cudaDevAttrMaxGridDimX, cudaDevAttrAsyncEngineCount,
                   cudaDevAttrMaxSharedMemoryPerBlockOptin, cudaDevAttrPciBusId};
    for (int a : attrs) {
        int v = -1;
        CHECK(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)a, 0));
        printf("attribute %d: %d\n", a, v);
    }
    size_t free = 0, total = 0;
    CHECK(cudaMemGetInfo(&free, &total));
    EXPECT(free > 0 && free <= total, "free %zu total %zu", free, total);
    int lo = 0, hi = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    printf("stream priorities %d..%d\n", lo, hi);
}

static void kernel_arguments() {
    const int n = 4096;
    Mixed m = {'a', 2.5, -7, {0.25f, 0.5f, 0.75f}, 123456789012LL};
    Big big;
    for (int i = 0; i < 256; i++) big.v[i] = i * 3 - 100;
    std::vector<int> in(n);
    for (int i = 0; i < n; i++) in[i] = i % 97 - 40;
    int *din;
    float *dout;
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&dout, n * sizeof(float)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    mixed_args<<<blocks(n), 256>>>(dout, din, m, big, (char)-3, (short)300, 0xfedcba9876543210ULL,
                                   -1.125, 0.0625f, n);
    CHECK(cudaGetLastError());
    std::vector<float> out(n);
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float want = mixed_value(in[i], m, big, (char)-3, (short)300, 0xfedcba9876543210ULL,
                                 -1.125, 0.0625f, i);
        EXPECT(out[i] == want, "mixed_args [%d] = %f, expected %f", i, out[i], want);
        sum += out[i];
    }
    printf("kernel arguments: %d values, sum %.4f\n", n, sum);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
}

static void streams_and_events() {
    const size_t n = 1 << 20;
    int lo = 0, hi = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
    int prio = 0;
    unsigned flags = 0;
    CHECK(cudaStreamGetPriority(s2, &prio));
    CHECK(cudaStreamGetFlags(s2, &flags));
    printf("stream priority %d, flags %u\n", prio, flags);
    int *a, *h;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMallocHost(&h, n * sizeof(int)));
    cudaEvent_t ready, start, stop, untimed;
    CHECK(cudaEventCreate(&ready));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    // s2 waits for s1's fill through the event, then adds.
    CHECK(cudaEventRecord(start, s1));
    spin<<<1, 1, 0, s1>>>(20 * 1000 * 1000);
    fill<<<blocks(n), 256, 0, s1>>>(a, 7, n);
    CHECK(cudaEventRecord(ready, s1));
    CHECK(cudaStreamWaitEvent(s2, ready, 0));
    add<<<blocks(n), 256, 0, s2>>>(a, 1, n);
    CHECK(cudaMemcpyAsync(h, a, n * sizeof(int), cudaMemcpyDeviceToHost, s2));
    CHECK(cudaEventRecord(stop, s2));
    CHECK(cudaEventRecord(untimed, s2));
    CHECK(cudaStreamSynchronize(s2));
    for (size_t i = 0; i < n; i++) EXPECT(h[i] == 8, "[%zu] = %d after the wait", i, h[i]);
    printf("stream waits for another's event: ok\n");
    printf("event query after -> %s\n", cudaGetErrorName(cudaEventQuery(stop)));
    printf("stream query after -> %s\n", cudaGetErrorName(cudaStreamQuery(s2)));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    EXPECT(ms >= 10, "elapsed %f ms over a 20 ms kernel", ms);
    printf("elapsed at least the spin: yes\n");
    printf("elapsed of an untimed event -> %s\n",
           cudaGetErrorName(cudaEventElapsedTime(&ms, start, untimed)));
    cudaGetLastError();
    // Busy while a kernel runs.
    spin<<<1, 1, 0, s1>>>(200 * 1000 * 1000);
    CHECK(cudaEventRecord(ready, s1));
    printf("stream query while a kernel runs -> %s\n", cudaGetErrorName(cudaStreamQuery(s1)));
    printf("event query while a kernel runs -> %s\n", cudaGetErrorName(cudaEventQuery(ready)));
    CHECK(cudaEventSynchronize(ready));
    printf("event query after its sync -> %s\n", cudaGetErrorName(cudaEventQuery(ready)));
    CHECK(cudaEventDestroy(ready));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(untimed));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(a));
    CHECK(cudaFreeHost(h));
}

static std::vector<int> order;
static void CUDART_CB host_fn(void *p) { order.push_back((int)*(volatile int *)p); }
static void CUDART_CB stream_cb(cudaStream_t, cudaError_t st, void *p) {
    order.push_back(1000 + (int)st + (int)*(volatile int *)p);
}

static void host_callbacks() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *mapped, *dmapped;
    CHECK(cudaHostAlloc(&mapped, sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&dmapped, mapped, 0));
    *mapped = 0;
    // Each callback sees what the kernel before it wrote into mapped memory.
    spin<<<1, 1, 0, s>>>(5 * 1000 * 1000);
    fill<<<1, 1, 0, s>>>(dmapped, 11, 1);
    CHECK(cudaLaunchHostFunc(s, host_fn, mapped));
    add<<<1, 1, 0, s>>>(dmapped, 11, 1);
    CHECK(cudaStreamAddCallback(s, stream_cb, mapped, 0));
    add<<<1, 1, 0, s>>>(dmapped, 11, 1);
    CHECK(cudaLaunchHostFunc(s, host_fn, mapped));
    CHECK(cudaStreamSynchronize(s));
    printf("host functions and callbacks saw:");
    for (int v : order) printf(" %d", v);
    printf("\n");
    EXPECT(order.size() == 3 && order[0] == 11 && order[1] == 1022 && order[2] == 33,
           "order of %zu", order.size());
    CHECK(cudaFreeHost(mapped));
    CHECK(cudaStreamDestroy(s));
}

static void pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131 + seed) >> 3);
}

static bool flipped(const unsigned char *got, const unsigned char *sent, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != (unsigned char)(sent[i] ^ 0x5a)) return false;
    return true;
}

// One size, every way: host memory sent to the device, flipped there, and brought back.
static void copies_of(size_t n, cudaStream_t s) {
    unsigned char *dev, *pinned_in, *pinned_out;
    std::vector<unsigned char> in(n), out(n);
    pattern(in.data(), n, (unsigned)n);
    CHECK(cudaMalloc(&dev, n));
    CHECK(cudaMallocHost(&pinned_in, n));
    CHECK(cudaHostAlloc(&pinned_out, n, cudaHostAllocDefault));
    memcpy(pinned_in, in.data(), n);
    const char *ways[4] = {"pageable sync", "pageable async", "page-locked sync",
                           "page-locked async"};
    for (int way = 0; way < 4; way++) {
        bool locked = way >= 2, async = way % 2;
        const unsigned char *src = locked ? pinned_in : in.data();
        unsigned char *dst = locked ? pinned_out : out.data();
        memset(dst, 0, n);
        if (async) {
            CHECK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s));
            flip<<<blocks(n), 256, 0, s>>>(dev, n);
            CHECK(cudaMemcpyAsync(dst, dev, n, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
        } else {
            CHECK(cudaMemcpy(dev, src, n, cudaMemcpyHostToDevice));
            flip<<<blocks(n), 256>>>(dev, n);
            CHECK(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
        }
        EXPECT(flipped(dst, in.data(), n), "%zu bytes %s", n, ways[way]);
    }
    // Part of the range, at odd offsets on both sides.
    if (n > 64) {
        size_t len = n - 37;
        memset(out.data(), 0, n);
        CHECK(cudaMemcpy(dev + 3, in.data() + 5, len, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(out.data() + 7, dev + 3, len, cudaMemcpyDeviceToHost));
        EXPECT(memcmp(out.data() + 7, in.data() + 5, len) == 0, "%zu bytes at odd offsets", n);
    }
    printf("copies of %zu bytes: pageable and page-locked, sync and async, both ways: ok\n", n);
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(pinned_in));
    CHECK(cudaFreeHost(pinned_out));
}

static void copies() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t sizes[] = {1, 4096, (256 << 10) + 3, 4 << 20, 80 << 20};
    for (size_t n : sizes) copies_of(n, s);
    CHECK(cudaStreamDestroy(s));
}

static void host_memory_kinds() {
    const size_t n = 1 << 20;
    // Mapped: a kernel writes the host's memory itself.
    int *mapped, *dmapped;
    CHECK(cudaHostAlloc(&mapped, n * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostGetDevicePointer(&dmapped, mapped, 0));
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, mapped));
    printf("mapped host memory flags %u\n", flags);
    fill<<<blocks(n), 256>>>(dmapped, 42, n);
    CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < n; i++) EXPECT(mapped[i] == 42, "mapped [%zu] = %d", i, mapped[i]);
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, mapped));
    printf("pointer attributes of mapped memory: type %d, device %d\n", (int)attr.type,
           attr.device);
    CHECK(cudaFreeHost(mapped));
    // Registered: the program's own memory, page-locked for copies.
    size_t bytes = n * sizeof(int);
    int *own = (int *)aligned_alloc(4096, bytes), *dev;
    for (size_t i = 0; i < n; i++) own[i] = (int)i;
    CHECK(cudaHostRegister(own, bytes, cudaHostRegisterDefault));
    CHECK(cudaMalloc(&dev, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(dev, own, bytes, cudaMemcpyHostToDevice, s));
    add<<<blocks(n), 256, 0, s>>>(dev, 5, n);
    CHECK(cudaMemcpyAsync(own, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++) EXPECT(own[i] == (int)i + 5, "registered [%zu] = %d", i, own[i]);
    CHECK(cudaPointerGetAttributes(&attr, dev));
    printf("pointer attributes of device memory: type %d, device %d\n", (int)attr.type,
           attr.device);
    CHECK(cudaHostUnregister(own));
    printf("registered host memory: copies both ways ok\n");
    printf("unregistering twice -> %s\n", cudaGetErrorName(cudaHostUnregister(own)));
    cudaGetLastError();
    free(own);
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
}

static void memsets_and_device_copies() {
    const size_t n = (1 << 20) + 5;
    unsigned char *a, *b;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    std::vector<unsigned char> h(n);
    CHECK(cudaMemset(a, 0xab, n));
    CHECK(cudaMemset(a + 1, 0x01, 3));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemsetAsync(a + n - 2, 0xcd, 2, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(h.data(), b, n, cudaMemcpyDefault));
    for (size_t i = 0; i < n; i++) {
        unsigned char want = (i >= 1 && i < 4) ? 0x01 : i >= n - 2 ? 0xcd : 0xab;
        EXPECT(h[i] == want, "memset [%zu] = %x", i, h[i]);
    }
    printf("memsets and a device-to-device copy: ok\n");
    // 2D: a pitched allocation, a memset of a sub-rectangle, a 2D copy out.
    size_t pitch = 0, width = 100, height = 37;
    unsigned char *p2;
    CHECK(cudaMallocPitch(&p2, &pitch, width, height));
    EXPECT(pitch >= width, "pitch %zu", pitch);
    CHECK(cudaMemset2D(p2, pitch, 0x11, width, height));
    CHECK(cudaMemset2DAsync(p2 + pitch * 5 + 10, pitch, 0x22, 20, 8, s));
    std::vector<unsigned char> rect(width * height);
    CHECK(cudaMemcpy2DAsync(rect.data(), width, p2, pitch, width, height, cudaMemcpyDeviceToHost,
                            s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t y = 0; y < height; y++)
        for (size_t x = 0; x < width; x++) {
            unsigned char want = (y >= 5 && y < 13 && x >= 10 && x < 30) ? 0x22 : 0x11;
            EXPECT(rect[y * width + x] == want, "2D (%zu, %zu) = %x", x, y, rect[y * width + x]);
        }
    // 2D from the host into part of the pitched allocation.
    std::vector<unsigned char> src(16 * 4);
    for (size_t i = 0; i < src.size(); i++) src[i] = (unsigned char)(200 + i);
    CHECK(cudaMemcpy2D(p2 + pitch * 20 + 50, pitch, src.data(), 16, 16, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(rect.data(), width, p2, pitch, width, height, cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < 4; y++)
        for (size_t x = 0; x < 16; x++)
            EXPECT(rect[(20 + y) * width + 50 + x] == src[y * 16 + x], "2D in (%zu, %zu)", x, y);
    printf("2D memsets and copies: ok\n");
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(p2));
    CHECK(cudaStreamDestroy(s));
}

static void launch_errors() {
    fill<<<1, 4096>>>(nullptr, 0, 0);  // more threads than a block may have
    cudaError_t e = cudaGetLastError();
    printf("launch of 4096 threads a block -> %s\n", cudaGetErrorName(e));
    printf("last error after that -> %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("free of a pointer never allocated -> %s\n",
           cudaGetErrorName(cudaFree((void *)0x1234)));
    cudaGetLastError();
    printf("free of NULL -> %s\n", cudaGetErrorName(cudaFree(nullptr)));
}

// Several threads at once, each with its own stream and memory, the device's default stream
// for one of them.
static void threads() {
    const int nthreads = 4, rounds = 50;
    const size_t n = 64 << 10;
    std::vector<int> failures(nthreads, 0);
    std::vector<std::thread> ts;
    for (int t = 0; t < nthreads; t++) {
        ts.emplace_back([t, n, &failures] {
            CHECK(cudaSetDevice(0));
            cudaStream_t s = 0;
            if (t > 0) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            int *dev;
            CHECK(cudaMalloc(&dev, n * sizeof(int)));
            std::vector<int> h(n);
            for (int r = 0; r < rounds; r++) {
                for (size_t i = 0; i < n; i++) h[i] = (int)i + r;
                CHECK(cudaMemcpyAsync(dev, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
                add<<<blocks(n), 256, 0, s>>>(dev, t * 1000, n);
                CHECK(cudaMemcpyAsync(h.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost, s));
                CHECK(cudaStreamSynchronize(s));
                for (size_t i = 0; i < n; i++)
                    if (h[i] != (int)i + r + t * 1000) failures[t]++;
            }
            CHECK(cudaFree(dev));
            if (s) CHECK(cudaStreamDestroy(s));
        });
    }
    for (auto &th : ts) th.join();
    for (int t = 0; t < nthreads; t++) EXPECT(failures[t] == 0, "thread %d: %d wrong", t, failures[t]);
    printf("%d threads, %d rounds each: ok\n", nthreads, rounds);
}

static int alloc_mode(size_t mib) {
    void *p = nullptr, *q = nullptr;
    cudaError_t e = cudaMalloc(&p, mib << 20);
    printf("cudaMalloc of %zu MiB -> %s\n", mib, cudaGetErrorName(e));
    printf("last error after it -> %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaError_t ea = cudaMallocAsync(&q, mib << 20, s);
    printf("cudaMallocAsync of %zu MiB -> %s\n", mib, cudaGetErrorName(ea));
    cudaGetLastError();
    if (ea == cudaSuccess) CHECK(cudaFreeAsync(q, s));
    CHECK(cudaStreamSynchronize(s));
    if (e == cudaSuccess) CHECK(cudaFree(p));
    // The device still works for this program.
    const size_t n = 1 << 20;
    int *dev;
    CHECK(cudaMalloc(&dev, n * sizeof(int)));
    fill<<<blocks(n), 256>>>(dev, 9, n);
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) EXPECT(h[i] == 9, "[%zu] = %d afterwards", i, h[i]);
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
    printf("afterwards 4 MiB, a kernel and a copy: ok\n");
    return 0;
}

static int copy_forever() {
    const size_t n = 64 << 20;
    unsigned char *dev, *pinned;
    std::vector<unsigned char> pageable(n, 1);
    CHECK(cudaMalloc(&dev, n));
    CHECK(cudaMallocHost(&pinned, n));
    printf("copying\n");
    fflush(stdout);
    for (;;) {
        CHECK(cudaMemcpy(dev, pageable.data(), n, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(pageable.data(), dev, n, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(dev, pinned, n, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(pinned, dev, n, cudaMemcpyDeviceToHost));
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "alloc") == 0) return alloc_mode(strtoull(argv[2], 0, 10));
    if (argc == 2 && strcmp(argv[1], "copy-forever") == 0) return copy_forever();
    device_queries();
    kernel_arguments();
    streams_and_events();
    host_callbacks();
    copies();
    host_memory_kinds();
    memsets_and_device_copies();
    launch_errors();
    threads();
    printf("runtime features OK\n");
    return 0;
}
