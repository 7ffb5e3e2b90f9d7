/* Builds a kernel whose VALUE comes from a header the source includes by its path, and runs
 * it: what a build may read through Wormhole (the build sandbox) against natively.
 *
 * Usage: include_probe [HEADER]. Prints "value N" where the build and the kernel ran
 * (without HEADER the source defines VALUE itself), else "build STATUS" and the build log. */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    cl_platform_id platform;
    cl_device_id dev;
    cl_int err;
    CHECK(clGetPlatformIDs(1, &platform, NULL));
    CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    char src[4096];
    snprintf(src, sizeof src, "%s%s%s\n__kernel void probe(__global int *a) { a[0] = VALUE; }\n",
             argc > 1 ? "#include \"" : "#define VALUE 7", argc > 1 ? argv[1] : "",
             argc > 1 ? "\"" : "");
    const char *s = src;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &s, NULL, &err);
    CHECK(err);
    cl_int built = clBuildProgram(prog, 1, &dev, "", NULL, NULL);
    if (built != CL_SUCCESS) {
        static char log[65536];
        CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
        printf("build %d\n%s\n", built, log);
        return 0;
    }
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_kernel k = clCreateKernel(prog, "probe", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t one = 1;
    int value = 0;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof value, &value, 0, NULL, NULL));
    printf("value %d\n", value);
    return 0;
}
