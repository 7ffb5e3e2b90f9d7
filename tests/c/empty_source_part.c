/* clCreateProgramWithSource with empty strings among the parts (as the CTS printf suite does):
 * an empty part is the empty string, whatever follows it (through Wormhole its length 0 made
 * the driver read on into the request: CL_BUILD_PROGRAM_FAILURE). */
#include "common.h"

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    const char *parts[] = {"", "__kernel void ", "", "k(__global int *a) { a[0] = 42; }", ""};
    cl_program prog = clCreateProgramWithSource(ctx, 5, parts, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &d, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "k", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t one = 1;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
    int v = 0;
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
    EXPECT(v == 42);
    printf("empty source parts OK\n");
    return 0;
}
