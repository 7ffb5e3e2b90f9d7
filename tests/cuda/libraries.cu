// NVIDIA's libraries on top of the runtime (built with static and with shared cudart): cuBLAS
// SGEMM and DGEMM, batched GEMM (arrays of pointers, and strided), GEMM on a stream of the
// program's; cuFFT complex-to-complex there and back, and a 2D real-to-complex transform.
// The GEMMs' inputs are small integers, so their results are exact and checked against the
// host's; the transforms are checked against what they must give (the input again, scaled;
// the sum of the inputs at frequency 0). Each result is printed: through Wormhole it must
// print what it prints natively.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cufft.h>
#include <vector>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("error: %s -> %d %s\n", #call, (int)e_, cudaGetErrorName(e_));           \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

#define BLAS(call)                                                                           \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            printf("error: %s -> %d %s\n", #call, (int)s_, cublasGetStatusName(s_));        \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

#define FFT(call)                                                                            \
    do {                                                                                     \
        cufftResult r_ = (call);                                                             \
        if (r_ != CUFFT_SUCCESS) {                                                           \
            printf("error: %s -> %d\n", #call, (int)r_);                                     \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            printf("wrong: %s: ", #cond);                                                    \
            printf(__VA_ARGS__);                                                             \
            printf("\n");                                                                    \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

template <typename T> static T *to_device(const std::vector<T> &h) {
    T *d;
    CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static std::vector<T> to_host(const T *d, size_t n) {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// Column-major C = A * B (m x k times k x n), on the host.
template <typename T>
static std::vector<T> gemm_host(const std::vector<T> &a, const std::vector<T> &b, int m, int n,
                                int k, size_t a_at = 0, size_t b_at = 0) {
    std::vector<T> c((size_t)m * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            T sum = 0;
            for (int l = 0; l < k; l++) sum += a[a_at + i + (size_t)l * m] * b[b_at + l + (size_t)j * k];
            c[i + (size_t)j * m] = sum;
        }
    return c;
}

template <typename T> static std::vector<T> small_ints(size_t n, int seed) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (T)((int)((i * 7 + seed * 13) % 11) - 5);
    return v;
}

template <typename T> static double checksum(const std::vector<T> &v) {
    double s = 0;
    for (size_t i = 0; i < v.size(); i++) s += (double)v[i] * (double)(i % 7 + 1);
    return s;
}

static void gemms(cublasHandle_t h) {
    const int m = 256, n = 192, k = 320;
    const float one = 1, zero = 0;
    auto a = small_ints<float>((size_t)m * k, 1), b = small_ints<float>((size_t)k * n, 2);
    float *da = to_device(a), *db = to_device(b), *dc;
    CHECK(cudaMalloc(&dc, (size_t)m * n * sizeof(float)));
    BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m));
    auto c = to_host(dc, (size_t)m * n);
    EXPECT(c == gemm_host(a, b, m, n, k), "SGEMM %dx%dx%d", m, n, k);
    printf("SGEMM %dx%dx%d: exact, checksum %.1f\n", m, n, k, checksum(c));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));

    const double done = 1, dzero = 0;
    auto ad = small_ints<double>((size_t)m * k, 3), bd = small_ints<double>((size_t)k * n, 4);
    double *dad = to_device(ad), *dbd = to_device(bd), *dcd;
    CHECK(cudaMalloc(&dcd, (size_t)m * n * sizeof(double)));
    BLAS(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &done, dad, m, dbd, k, &dzero, dcd, m));
    auto cd = to_host(dcd, (size_t)m * n);
    EXPECT(cd == gemm_host(ad, bd, m, n, k), "DGEMM %dx%dx%d", m, n, k);
    printf("DGEMM %dx%dx%d: exact, checksum %.1f\n", m, n, k, checksum(cd));
    CHECK(cudaFree(dad));
    CHECK(cudaFree(dbd));
    CHECK(cudaFree(dcd));
}

static void batched(cublasHandle_t h) {
    const int m = 64, n = 48, k = 32, count = 8;
    const float one = 1, zero = 0;
    const size_t sa = (size_t)m * k, sb = (size_t)k * n, sc = (size_t)m * n;
    auto a = small_ints<float>(sa * count, 5), b = small_ints<float>(sb * count, 6);
    float *da = to_device(a), *db = to_device(b), *dc;
    CHECK(cudaMalloc(&dc, sc * count * sizeof(float)));
    // Arrays of pointers, in device memory.
    std::vector<const float *> pa(count), pb(count);
    std::vector<float *> pc(count);
    for (int i = 0; i < count; i++) {
        pa[i] = da + sa * i;
        pb[i] = db + sb * i;
        pc[i] = dc + sc * i;
    }
    const float **dpa = to_device(pa), **dpb = to_device(pb);
    float **dpc = to_device(pc);
    BLAS(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dpa, m, dpb, k, &zero, dpc,
                            m, count));
    auto c = to_host(dc, sc * count);
    for (int i = 0; i < count; i++) {
        auto want = gemm_host(a, b, m, n, k, sa * i, sb * i);
        EXPECT(std::equal(want.begin(), want.end(), c.begin() + sc * i), "batched GEMM %d", i);
    }
    printf("SGEMM batched, %d of %dx%dx%d: exact, checksum %.1f\n", count, m, n, k, checksum(c));
    CHECK(cudaMemset(dc, 0, sc * count * sizeof(float)));
    BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, sa, db, k,
                                   sb, &zero, dc, m, sc, count));
    auto c2 = to_host(dc, sc * count);
    EXPECT(c2 == c, "strided batched GEMM");
    printf("SGEMM strided batched: as the batched one\n");
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(dpa));
    CHECK(cudaFree(dpb));
    CHECK(cudaFree(dpc));
}

// GEMMs on a stream of the program's, pipelined, the result read once at the end.
static void on_a_stream(cublasHandle_t h) {
    const int n = 512, rounds = 20;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    BLAS(cublasSetStream(h, s));
    std::vector<float> id((size_t)n * n, 0);
    for (int i = 0; i < n; i++) id[i + (size_t)i * n] = 1;
    auto x = small_ints<float>((size_t)n * n, 7);
    float *did = to_device(id), *dx = to_device(x), *dy;
    CHECK(cudaMalloc(&dy, (size_t)n * n * sizeof(float)));
    // The uploads went on the legacy stream, which a non-blocking stream does not wait for
    // (a pageable cudaMemcpy may return before its DMA is done).
    CHECK(cudaDeviceSynchronize());
    const float one = 1, zero = 0;
    // x = identity * x, twenty times, alternating buffers: x again.
    for (int r = 0; r < rounds; r++) {
        float *src = r % 2 ? dy : dx, *dst = r % 2 ? dx : dy;
        BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, did, n, src, n, &zero, dst,
                         n));
    }
    std::vector<float> back((size_t)n * n);
    CHECK(cudaMemcpyAsync(back.data(), dx, back.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(back == x, "%d GEMMs by the identity", rounds);
    printf("%d GEMMs of %d^3 on a stream: exact\n", rounds, n);
    BLAS(cublasSetStream(h, 0));
    CHECK(cudaFree(did));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaStreamDestroy(s));
}

static void ffts() {
    // Complex to complex, forward then inverse: the input again, times the length.
    const int len = 4096, batch = 4;
    std::vector<cufftComplex> in((size_t)len * batch);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = {(float)((i * 37) % 101) / 101.0f - 0.5f, (float)((i * 53) % 89) / 89.0f - 0.5f};
    cufftComplex *d = to_device(in);
    cufftHandle plan;
    FFT(cufftPlan1d(&plan, len, CUFFT_C2C, batch));
    FFT(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
    auto freq = to_host(d, in.size());
    FFT(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
    auto back = to_host(d, in.size());
    double worst = 0;
    for (size_t i = 0; i < in.size(); i++) {
        worst = fmax(worst, fabs(back[i].x / len - in[i].x));
        worst = fmax(worst, fabs(back[i].y / len - in[i].y));
    }
    EXPECT(worst < 1e-4, "C2C round trip off by %g", worst);
    // Frequency 0 of each batch is the sum of its inputs.
    for (int b = 0; b < batch; b++) {
        double sx = 0, sy = 0;
        for (int i = 0; i < len; i++) {
            sx += in[(size_t)b * len + i].x;
            sy += in[(size_t)b * len + i].y;
        }
        EXPECT(fabs(freq[(size_t)b * len].x - sx) < 1e-2 && fabs(freq[(size_t)b * len].y - sy) < 1e-2,
               "C2C batch %d at 0: %f %f against %f %f", b, freq[(size_t)b * len].x,
               freq[(size_t)b * len].y, sx, sy);
    }
    printf("C2C %d x %d there and back: within 1e-4; bin 1 of batch 0: %.2f %.2f\n", len, batch,
           freq[1].x, freq[1].y);
    FFT(cufftDestroy(plan));
    CHECK(cudaFree(d));

    // Real to complex, 2D, on a stream of the program's.
    const int rows = 64, cols = 128;
    std::vector<float> real((size_t)rows * cols);
    double total = 0;
    for (size_t i = 0; i < real.size(); i++) {
        real[i] = (float)((i * 29) % 61) / 61.0f;
        total += real[i];
    }
    float *dr = to_device(real);
    cufftComplex *dcx;
    CHECK(cudaMalloc(&dcx, (size_t)rows * (cols / 2 + 1) * sizeof(cufftComplex)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    FFT(cufftPlan2d(&plan, rows, cols, CUFFT_R2C));
    FFT(cufftSetStream(plan, s));
    FFT(cufftExecR2C(plan, dr, dcx));
    std::vector<cufftComplex> spectrum((size_t)rows * (cols / 2 + 1));
    CHECK(cudaMemcpyAsync(spectrum.data(), dcx, spectrum.size() * sizeof(cufftComplex),
                          cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(fabs(spectrum[0].x - total) < 1e-2 && fabs(spectrum[0].y) < 1e-2,
           "R2C at 0: %f %f against %f", spectrum[0].x, spectrum[0].y, total);
    printf("R2C %dx%d: frequency 0 is the sum (%.2f); bin (1, 1): %.2f %.2f\n", rows, cols, total,
           spectrum[cols / 2 + 2].x, spectrum[cols / 2 + 2].y);
    FFT(cufftDestroy(plan));
    CHECK(cudaFree(dr));
    CHECK(cudaFree(dcx));
    CHECK(cudaStreamDestroy(s));
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    cublasHandle_t h;
    cublasStatus_t st = cublasCreate(&h);
    printf("cublasCreate -> %s\n", cublasGetStatusName(st));
    if (st != CUBLAS_STATUS_SUCCESS) return 2;
    int version = 0;
    BLAS(cublasGetVersion(h, &version));
    printf("cuBLAS %d\n", version);
    gemms(h);
    batched(h);
    on_a_stream(h);
    BLAS(cublasDestroy(h));
    int fft_version = 0;
    FFT(cufftGetVersion(&fft_version));
    printf("cuFFT %d\n", fft_version);
    ffts();
    printf("libraries OK\n");
    return 0;
}
