/* Builds a kernel whose VALUE comes from a header the source includes by its path, and runs
 * it: what a build may read through Wormhole (the build sandbox) against natively.
 *
 * Usage: include_probe [HEADER] | include_probe [-c] -I DIR NAME. Prints "value N" where the
 * build and the kernel ran (without HEADER the source defines VALUE itself), else "build
 * STATUS" and the build log. With -I the source includes NAME, found through the option
 * "-I DIR", and the build options the program reports are printed first. With -c the program
 * is compiled (clCompileProgram, the -I options its compile options) and then linked. */
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
    char src[4096], options[4096] = "";
    int compile = argc > 1 && strcmp(argv[1], "-c") == 0;
    argv += compile;
    argc -= compile;
    const char *header = argc > 1 ? argv[1] : NULL;
    if (argc > 3 && strcmp(argv[1], "-I") == 0) {
        snprintf(options, sizeof options, "-I %s", argv[2]);
        header = argv[3];
    }
    snprintf(src, sizeof src, "%s%s%s\n__kernel void probe(__global int *a) { a[0] = VALUE; }\n",
             header ? "#include \"" : "#define VALUE 7", header ? header : "", header ? "\"" : "");
    const char *s = src;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &s, NULL, &err);
    CHECK(err);
    cl_int built = compile ? clCompileProgram(prog, 1, &dev, options, 0, NULL, NULL, NULL, NULL)
                           : clBuildProgram(prog, 1, &dev, options, NULL, NULL);
    if (options[0]) {
        char given[4096];
        CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_OPTIONS, sizeof given, given, NULL));
        printf("options %s\n", given);
    }
    if (built != CL_SUCCESS) {
        static char log[65536];
        CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
        printf("build %d\n%s\n", built, log);
        return 0;
    }
    if (compile) {
        cl_program linked = clLinkProgram(ctx, 1, &dev, "", 1, &prog, NULL, NULL, &err);
        CHECK(err);
        prog = linked;
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
