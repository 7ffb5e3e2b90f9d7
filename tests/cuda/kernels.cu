// Kernels for driver_api.c, built into a fatbin (nvcc -fatbin) that the program loads with
// cuModuleLoadData: C names, and parameters of several kinds (pointers, scalars, a struct, a
// by-value array) so that launches depend on the parameter layout the driver reports.
struct Affine {
    float scale;
    int offset;
    double bias;
};

struct Quad {
    int v[4];
};

extern "C" __global__ void vadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void affine(float *x, Affine t, Quad q, char tag, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * t.scale + t.offset + (float)t.bias + q.v[i % 4] + tag;
}

// A module variable: found by name (cuModuleGetGlobal, cuLibraryGetGlobal), copied to and
// from like device memory.
__device__ int counter;

extern "C" __global__ void bump(int by) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter += by;
}
