/* Fine-grained buffer SVM: the host reads and writes the memory without maps; the device sees
 * the host's writes at each enqueue and the host sees the device's after synchronisation.
 * argv[1]: the number of floats (default 3000; over 2^28 the allocation exceeds 1 GiB). */
#include "common.h"

static const char *SRC =
    "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2; }\n"
    "__kernel void bump_odd(__global float *a) { size_t i = get_global_id(0); if (i & 1) a[i] += 1; }\n";

int main(int argc, char **argv) {
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    cl_device_svm_capabilities caps = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL));
    EXPECT(caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK(err);
    size_t N = argc > 1 ? strtoull(argv[1], NULL, 10) : 3000;
    float *a = clSVMAlloc(ctx, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, N * sizeof(float), 64);
    EXPECT(a != NULL);
    for (size_t i = 0; i < N; i++) a[i] = 17;
    cl_program prog = build(ctx, d, SRC);
    cl_kernel twice = clCreateKernel(prog, "twice", &err);
    CHECK(err);
    cl_kernel bump = clCreateKernel(prog, "bump_odd", &err);
    CHECK(err);
    size_t g = N;
    CHECK(clSetKernelArgSVMPointer(twice, 0, a));
    CHECK(clEnqueueNDRangeKernel(q, twice, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    for (size_t i = 0; i < N; i++) EXPECT(a[i] == 34);
    /* The host changes even elements while the device changes odd ones: both survive. */
    CHECK(clSetKernelArgSVMPointer(bump, 0, a));
    for (size_t i = 0; i < N; i += 2) a[i] = -1;
    CHECK(clEnqueueNDRangeKernel(q, bump, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    for (size_t i = 0; i < N; i++) EXPECT(a[i] == (i & 1 ? 35 : -1));
    printf("fine-grained svm OK\n");
    clSVMFree(ctx, a);
    clReleaseKernel(twice);
    clReleaseKernel(bump);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
