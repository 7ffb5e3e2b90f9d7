/* Prints what the application can learn of a kernel besides running it: CL_KERNEL_ATTRIBUTES
 * and its arguments' names and type names (built with -cl-kernel-arg-info). A second session
 * whose build the program cache could serve must print the same as the first, and as native
 * (PoCL's binaries forget `__attribute__`s: a cached build answered "" before). */
#include "common.h"

static const char *SRC =
    "__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((vec_type_hint(float4)))\n"
    "void marked(__global int *counts, float scale) { counts[0] = (int)scale; }\n";

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &d, "-cl-kernel-arg-info", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "marked", &err);
    CHECK(err);
    char text[512] = "";
    CHECK(clGetKernelInfo(k, CL_KERNEL_ATTRIBUTES, sizeof text, text, NULL));
    printf("attributes: %s\n", text);
    for (cl_uint i = 0; i < 2; i++) {
        char name[64] = "", type[64] = "";
        CHECK(clGetKernelArgInfo(k, i, CL_KERNEL_ARG_NAME, sizeof name, name, NULL));
        CHECK(clGetKernelArgInfo(k, i, CL_KERNEL_ARG_TYPE_NAME, sizeof type, type, NULL));
        printf("arg %u: %s %s\n", i, type, name);
    }
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
