/* A kernel whose name is 256 characters (the CTS compiler kernel_name_size): the program
 * builds and the kernel is created through Wormhole as natively. The program cache asked PoCL
 * for the program's binaries, which aborted the worker (PoCL generates code for the kernel,
 * which it cannot for so long a name: natively, running it aborts too, so it is not run). */
#include "common.h"
#include <string.h>

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    char name[257];
    for (int i = 0; i < 256; i++) name[i] = 'a' + i % 26;
    name[256] = 0;
    char src[1024];
    snprintf(src, sizeof src, "__kernel void %s(int s, __global int *d) { d[0] = s; }\n", name);
    cl_program p = build(ctx, d, src);
    cl_kernel k = clCreateKernel(p, name, &err);
    CHECK(err);
    char got[300] = "";
    CHECK(clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof got, got, NULL));
    EXPECT(strcmp(got, name) == 0);
    printf("long kernel name OK\n");
    return 0;
}
