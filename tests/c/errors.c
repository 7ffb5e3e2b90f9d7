/* Bad input gets the error codes native OpenCL gives: invalid handles, wrong sizes,
 * a kernel argument index out of range. With STRICT=1 it also checks what the spec requires
 * but PoCL does not check natively (an object of the wrong kind; PoCL's empty dispatch slot,
 * which crashes natively). */
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#include "common.h"
#include <string.h>

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    CHECK(err);
    char small[4];
    size_t sz;
    /* info queries */
    EXPECT(clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof small, small, NULL) == CL_INVALID_VALUE);
    EXPECT(clGetDeviceInfo(d, 0xdead, 0, NULL, &sz) == CL_INVALID_VALUE);
    EXPECT(clGetMemObjectInfo(buf, CL_MEM_SIZE, 0, NULL, &sz) == CL_SUCCESS && sz == sizeof(size_t));
    int strict = getenv("STRICT") != NULL;
    EXPECT(clReleaseKernel(NULL) == CL_INVALID_KERNEL);
    EXPECT(clFinish(NULL) == CL_INVALID_COMMAND_QUEUE);
    if (strict) {
        EXPECT(clGetMemObjectInfo((cl_mem)q, CL_MEM_SIZE, 0, NULL, &sz) == CL_INVALID_MEM_OBJECT);
        EXPECT(clFinish((cl_command_queue)buf) == CL_INVALID_COMMAND_QUEUE);
    }
    /* sizes and ranges */
    char data[128];
    EXPECT(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, 8, NULL, 0, NULL, NULL) == CL_INVALID_VALUE);
    cl_event ev = NULL;
    EXPECT(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, 8, data, 1, NULL, &ev) == CL_INVALID_EVENT_WAIT_LIST);
    const char *src = "__kernel void k(__global int *x, int y) { x[0] = y; }";
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &d, "", NULL, NULL));
    /* user data without a callback (the driver never sees the client's user data) */
    int user = 0;
    cl_platform_id plat;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL));
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    cl_context none = clCreateContext(NULL, 1, &d, NULL, &user, &err);
    EXPECT(none == NULL && err == CL_INVALID_VALUE);
    none = clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, NULL, &user, &err);
    EXPECT(none == NULL && err == CL_INVALID_VALUE);
    EXPECT(clBuildProgram(prog, 1, &d, "", NULL, &user) == CL_INVALID_VALUE);
    cl_program part = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    EXPECT(clCompileProgram(part, 1, &d, "", 0, NULL, NULL, NULL, &user) == CL_INVALID_VALUE);
    CHECK(clCompileProgram(part, 1, &d, "", 0, NULL, NULL, NULL, NULL));
    cl_program linked = clLinkProgram(ctx, 1, &d, "", 1, &part, NULL, &user, &err);
    EXPECT(linked == NULL && err == CL_INVALID_VALUE);
    CHECK(clReleaseProgram(part));
    cl_kernel k = clCreateKernel(prog, "nope", &err);
    EXPECT(k == NULL && err == CL_INVALID_KERNEL_NAME);
    k = clCreateKernel(prog, "k", &err);
    CHECK(err);
    int v = 3;
    EXPECT(clSetKernelArg(k, 5, sizeof v, &v) == CL_INVALID_ARG_INDEX);
    EXPECT(clSetKernelArg(k, 1, 2, &v) == CL_INVALID_ARG_SIZE);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
    size_t g = 1;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    int out = 0;
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
    EXPECT(out == 3);
    if (strict) {
        /* the empty dispatch slot of some drivers (clSetCommandQueueProperty) must not crash */
        cl_command_queue_properties old;
        EXPECT(clSetCommandQueueProperty(q, CL_QUEUE_PROFILING_ENABLE, CL_TRUE, &old) == CL_INVALID_OPERATION);
    }
    printf("error codes OK\n");
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseMemObject(buf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
