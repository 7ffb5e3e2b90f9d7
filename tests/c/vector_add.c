/* The main job's demo: add two vectors on the device and print a checksum. */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void add(__global const float *a, __global const float *b, __global float *c) {\n"
    "    size_t i = get_global_id(0);\n"
    "    c[i] = a[i] + b[i];\n"
    "}\n";

int main(void) {
    enum { N = 1 << 20 };
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    char pname[256], dname[256];
    CHECK(clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof pname, pname, NULL));
    CHECK(clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof dname, dname, NULL));
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK(err);
    cl_program prog = build(ctx, d, SRC);
    cl_kernel k = clCreateKernel(prog, "add", &err);
    CHECK(err);
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)), *c = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * (float)i;
    }
    cl_mem ba = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(float), a, &err);
    CHECK(err);
    cl_mem bb = clCreateBuffer(ctx, CL_MEM_READ_ONLY, N * sizeof(float), NULL, &err);
    CHECK(err);
    cl_mem bc = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, N * sizeof(float), NULL, &err);
    CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, bb, CL_TRUE, 0, N * sizeof(float), b, 0, NULL, NULL));
    CHECK(clSetKernelArg(k, 0, sizeof ba, &ba));
    CHECK(clSetKernelArg(k, 1, sizeof bb, &bb));
    CHECK(clSetKernelArg(k, 2, sizeof bc, &bc));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, bc, CL_TRUE, 0, N * sizeof(float), c, 0, NULL, NULL));
    double sum = 0;
    for (int i = 0; i < N; i++) {
        EXPECT(c[i] == 3.0f * (float)i);
        sum += c[i];
    }
    printf("platform: %s\ndevice:   %s\nvector_add of %d floats: OK, checksum %.0f\n", pname, dname, N, sum);
    clReleaseMemObject(ba);
    clReleaseMemObject(bb);
    clReleaseMemObject(bc);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    free(a);
    free(b);
    free(c);
    return 0;
}
