/* Launches that Wormhole pipelines (repeats of a launch the driver accepted) each asking for an
 * event, none released, then clFinish. Under a tenant's object limit the server refuses the
 * events past the limit although the client already answered CL_SUCCESS: that failure must
 * reach the application at clFinish (and once only), not only a server log line.
 * Prints "launches <status of each>" and "finish <status> <status of a second clFinish>". */
#include "common.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    const char *src = "__kernel void k(__global int *a) { a[get_global_id(0)] += 1; }";
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(p, 1, &d, NULL, NULL, NULL));
    cl_kernel k = clCreateKernel(p, "k", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(cl_int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t global = 64;
    int failed = 0;
    for (int i = 0; i < n; i++) {
        cl_event ev;
        cl_int st = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &ev);
        if (st != CL_SUCCESS)
            failed++;
    }
    cl_int first = clFinish(q);
    cl_int second = clFinish(q);
    printf("launches failed %d\nfinish %d %d\n", failed, first, second);
    return 0;
}
