// Stream capture and CUDA graphs as PyTorch uses them (torch.cuda.graph): capture status
// queries before, during and after a capture, the graph and its dependencies while capturing,
// the thread's capture mode, instantiation, replays into page-locked memory, a capture the
// program breaks; host functions and stream callbacks, in stream order and as graph nodes;
// stream-ordered allocation; a cooperative launch.
// Through Wormhole it must print what it prints natively.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

// Every block writes its number, waits at a grid-wide barrier (which only a cooperative
// launch guarantees to be reachable: all blocks resident at once), then block 0 adds them up.
__global__ void grid_sum(int *v, int *out, unsigned *arrived) {
    if (threadIdx.x == 0) {
        v[blockIdx.x] = blockIdx.x + 1;
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {
        }
        __threadfence();
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int sum = 0;
        for (unsigned i = 0; i < gridDim.x; i++) sum += v[i];
        *out = sum;
    }
}

static int calls = 0;
static void CUDART_CB count_call(void *by) { calls += *(int *)by; }
static void CUDART_CB note_status(cudaStream_t, cudaError_t status, void *out) { *(int *)out = 100 + (int)status; }

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
    const int n = 1 << 16;
    const size_t bytes = n * sizeof(float);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *x, *y, *h;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMallocHost(&h, bytes));
    for (int i = 0; i < n; i++) h[i] = (float)(i % 100);
    CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y, 0, bytes));

    // Host functions run in stream order: after the kernel before them, before what follows.
    int one = 1, seen_status = 0;
    CHECK(cudaMemsetAsync(y, 0, bytes, s));
    axpy<<<n / 256, 256, 0, s>>>(1.0f, x, y, n);
    CHECK(cudaMemcpyAsync(h, y, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, count_call, &one));
    CHECK(cudaStreamAddCallback(s, note_status, &seen_status, 0));
    CHECK(cudaStreamSynchronize(s));
    printf("host function ran %d time(s), the stream callback saw %d, the copy before them: %s\n", calls,
           seen_status, h[99] == 99.0f ? "done" : "not done");
    CHECK(cudaMemset(y, 0, bytes));

    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    CHECK(cudaStreamIsCapturing(s, &st));
    printf("before: capturing %d\n", (int)st);
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id));
    printf("before: capture info %d\n", (int)st);

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamIsCapturing(s, &st));
    cudaGraph_t during = nullptr;
    const cudaGraphNode_t *deps = nullptr;
    size_t ndeps = 99;
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id, &during, &deps, nullptr, &ndeps));
    printf("during: capturing %d, a graph %s, %zu dependencies\n", (int)st, during ? "yes" : "no", ndeps);
    axpy<<<n / 256, 256, 0, s>>>(2.0f, x, y, n);
    axpy<<<n / 256, 256, 0, s>>>(3.0f, x, y, n);
    CHECK(cudaMemcpyAsync(h, y, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, count_call, &one));
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id, nullptr, &deps, nullptr, &ndeps));
    printf("after four operations: %zu dependencies, one given: %s\n", ndeps, deps && deps[0] ? "yes" : "no");
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("the thread's mode was %d\n", (int)mode);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaStreamIsCapturing(s, &st));
    printf("after: capturing %d, the graph is the one captured into: %s\n", (int)st, graph == during ? "yes" : "no");
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    cudaGraphNode_t listed[8] = {};
    size_t room = 8;
    CHECK(cudaGraphGetNodes(graph, listed, &room));
    printf("nodes: %zu, listed %zu, the last slot empty: %s\n", nodes, room, listed[7] ? "no" : "yes");
    calls = 0;

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphUpload(exec, s));
    for (int i = 0; i < n; i++) h[i] = -1.0f;
    for (int r = 0; r < 10; r++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    bool right = true;
    for (int i = 0; i < n; i++) right &= h[i] == 50.0f * (float)(i % 100);
    printf("ten replays: %s, the host function in the graph ran %d times\n", right ? "right" : "wrong", calls);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // Synchronizing a capturing stream is refused and breaks the capture.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t sync = cudaStreamSynchronize(s);
    cudaGraph_t broken = nullptr;
    cudaError_t end = cudaStreamEndCapture(s, &broken);
    printf("a sync while capturing: %d, then the end: %d, a graph: %s\n", (int)sync, (int)end,
           broken ? "yes" : "no");
    cudaGetLastError();
    CHECK(cudaStreamIsCapturing(s, &st));
    printf("afterwards: capturing %d\n", (int)st);
    // Stream-ordered allocation (cudaMallocAsync, cudaFreeAsync).
    float *z = nullptr;
    CHECK(cudaMallocAsync(&z, bytes, s));
    CHECK(cudaMemsetAsync(z, 0, bytes, s));
    axpy<<<n / 256, 256, 0, s>>>(4.0f, x, z, n);
    CHECK(cudaMemcpyAsync(h, z, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(z, s));
    CHECK(cudaStreamSynchronize(s));
    printf("stream-ordered allocation: %s\n", h[99] == 396.0f ? "right" : "wrong");
    // A cooperative launch.
    int *v, *sum_d, sum = 0;
    unsigned *arrived;
    CHECK(cudaMalloc(&v, 64 * sizeof(int)));
    CHECK(cudaMalloc(&sum_d, sizeof(int)));
    CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
    CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), s));
    void *coop_args[] = {&v, &sum_d, &arrived};
    CHECK(cudaLaunchCooperativeKernel((void *)grid_sum, dim3(64), dim3(32), coop_args, 0, s));
    CHECK(cudaMemcpyAsync(&sum, sum_d, sizeof sum, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("cooperative launch: grid sum %d\n", sum);
    CHECK(cudaFreeHost(h));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
