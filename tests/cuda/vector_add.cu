// A plain CUDA runtime program (cudart, static or shared as built): device query, memory,
// copies both ways, a kernel, events. Through Wormhole it must print what it prints natively.
// Without a device it reports the runtime's error for the first call and how long that took
// (a program must learn within a second that there is no device, not hang).
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void vadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("error: %s -> %d %s: %s\n", #call, (int)e_, cudaGetErrorName(e_),         \
                   cudaGetErrorString(e_));                                                  \
            return 2;                                                                        \
        }                                                                                    \
    } while (0)

int main() {
    auto t0 = std::chrono::steady_clock::now();
    int count = -1;
    cudaError_t first = cudaGetDeviceCount(&count);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    fprintf(stderr, "first call: %.1f ms\n", ms);
    CHECK(first);
    printf("devices: %d\n", count);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);

    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    float *ha = new float[n], *hb = new float[n], *hc = new float[n];
    for (int i = 0; i < n; i++) { ha[i] = (float)i; hb[i] = 2.0f * i; hc[i] = 0; }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0, bytes));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, 0));
    vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop, 0));
    CHECK(cudaEventSynchronize(stop));
    float elapsed = -1;
    CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    CHECK(cudaMemcpy(hc, dc, bytes, cudaMemcpyDeviceToHost));
    long bad = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (hc[i] != 3.0f * i) bad++;
        sum += hc[i];
    }
    printf("mismatches: %ld, checksum %.0f, kernel time measured: %s\n", bad, sum, elapsed >= 0 ? "yes" : "no");
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    delete[] ha; delete[] hb; delete[] hc;
    return bad ? 1 : 0;
}
