/* A size far beyond the memory behind a pointer is one the driver refuses before it reads:
 * a fill pattern of a GiB (CL_INVALID_VALUE), a kernel argument of a GiB
 * (CL_INVALID_ARG_SIZE) and a launch of 2^30 work dimensions (CL_INVALID_WORK_DIMENSION),
 * with pointers to a few bytes. A forwarding client that copied the
 * bytes first would crash the application instead. Sizes that are wrong but small get the
 * driver's own answer, and right ones still work. */
#include "common.h"

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
    CHECK(err);
    int pattern = 0x01020304;
    size_t gib = (size_t)1 << 30;
    EXPECT(clEnqueueFillBuffer(q, b, &pattern, gib, 0, 1 << 20, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueFillBuffer(q, b, &pattern, 3, 0, 1 << 20, 0, NULL, NULL) == CL_INVALID_VALUE);
    CHECK(clEnqueueFillBuffer(q, b, &pattern, sizeof pattern, 0, 1 << 20, 0, NULL, NULL));

    cl_program p = build(ctx, d, "kernel void k(global int *a, int v) { a[get_global_id(0)] = v; }");
    cl_kernel k = clCreateKernel(p, "k", &err);
    CHECK(err);
    int v = 7;
    EXPECT(clSetKernelArg(k, 1, gib, &v) == CL_INVALID_ARG_SIZE);
    EXPECT(clSetKernelArg(k, 1, 8, &v) == CL_INVALID_ARG_SIZE);
    CHECK(clSetKernelArg(k, 0, sizeof b, &b));
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
    size_t one = 1;
    /* A work dimension no device has, with arrays of one entry. */
    EXPECT(clEnqueueNDRangeKernel(q, k, 1u << 30, NULL, &one, NULL, 0, NULL, NULL) == CL_INVALID_WORK_DIMENSION);
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
    int back[2] = {0, 0};
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    EXPECT(back[0] == 7 && back[1] == pattern);
    printf("OK\n");
    clReleaseKernel(k);
    clReleaseProgram(p);
    clReleaseMemObject(b);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
