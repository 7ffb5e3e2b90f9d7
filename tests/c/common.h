/* Shared helpers of Wormhole's C test clients: plain OpenCL, run natively or through `wh run`. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cl_int err_ = (x);                                                           \
        if (err_ != CL_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, err_); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define EXPECT(cond)                                                      \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

static inline void first_device(cl_platform_id *p, cl_device_id *d) {
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(1, p, &n));
    EXPECT(n >= 1);
    CHECK(clGetDeviceIDs(*p, CL_DEVICE_TYPE_ALL, 1, d, NULL));
}

/* The first device, a context on it and an in-order queue: how most test clients start. */
static inline void open_queue(cl_device_id *d, cl_context *ctx, cl_command_queue *q) {
    cl_platform_id p;
    cl_int err;
    first_device(&p, d);
    *ctx = clCreateContext(NULL, 1, d, NULL, NULL, &err);
    CHECK(err);
    *q = clCreateCommandQueueWithProperties(*ctx, *d, NULL, &err);
    CHECK(err);
}

static inline cl_program build(cl_context ctx, cl_device_id dev, const char *src) {
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    err = clBuildProgram(prog, 1, &dev, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[8192];
        clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "build failed: %s\n", log);
        exit(1);
    }
    return prog;
}

/* With "hold" as the program's first argument: waits until stdin closes, its session kept
 * open meanwhile for the test to look at the server's status. */
static inline void hold_if_asked(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        while (getchar() != EOF) {
        }
    }
}
