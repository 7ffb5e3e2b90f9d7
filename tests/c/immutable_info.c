/* Info a library asks for again and again (clFFT asks its program for the context at every
   transform): values that never change for an object, and values that do, side by side.
   Prints what it saw, so the output can be compared with native. */
#include "common.h"
#include <string.h>

static const char *SRC = "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }";

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    /* Before the build: no kernels yet (CL_INVALID_PROGRAM_EXECUTABLE), so a value that changes
       with the build must not be kept from here. */
    size_t nk = 0;
    EXPECT(clGetProgramInfo(prog, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL) ==
           CL_INVALID_PROGRAM_EXECUTABLE);
    CHECK(clBuildProgram(prog, 1, &d, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "twice", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    int zero[64] = {0};
    CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof zero, zero, 0, NULL, NULL));
    size_t global = 64;
    for (int i = 0; i < rounds; i++) {
        cl_event ev;
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &ev));
        cl_context pc = NULL, ec = NULL;
        cl_command_queue eq = NULL;
        cl_uint ndev = 0;
        cl_device_id dev = NULL;
        cl_command_type type = 0;
        CHECK(clGetProgramInfo(prog, CL_PROGRAM_CONTEXT, sizeof pc, &pc, NULL));
        CHECK(clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL));
        CHECK(clGetProgramInfo(prog, CL_PROGRAM_DEVICES, sizeof dev, &dev, NULL));
        for (int again = 0; again < 2; again++) {
            CHECK(clGetEventInfo(ev, CL_EVENT_CONTEXT, sizeof ec, &ec, NULL));
            CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
            CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
            EXPECT(pc == ctx && ec == ctx && eq == q && ndev == 1 && dev == d);
            EXPECT(type == CL_COMMAND_NDRANGE_KERNEL);
        }
        CHECK(clReleaseEvent(ev));
    }
    /* The source, asked for in two steps (size, then value), and too small a buffer. */
    size_t len = 0;
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_SOURCE, 0, NULL, &len));
    EXPECT(len == strlen(SRC) + 1);
    char src[256];
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_SOURCE, len, src, NULL));
    EXPECT(strcmp(src, SRC) == 0);
    EXPECT(clGetProgramInfo(prog, CL_PROGRAM_SOURCE, 4, src, NULL) == CL_INVALID_VALUE);
    /* What changes is asked anew: the reference count after a retain, the status of an event. */
    cl_uint refs = 0, refs2 = 0;
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_REFERENCE_COUNT, sizeof refs, &refs, NULL));
    CHECK(clRetainProgram(prog));
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_REFERENCE_COUNT, sizeof refs2, &refs2, NULL));
    EXPECT(refs2 == refs + 1);
    CHECK(clReleaseProgram(prog));
    CHECK(clGetProgramInfo(prog, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL));
    EXPECT(nk == 1);
    cl_event user = clCreateUserEvent(ctx, &err);
    CHECK(err);
    cl_int st = 0;
    cl_command_queue none = q;
    CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_QUEUE, sizeof none, &none, NULL));
    EXPECT(none == NULL);
    CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_SUBMITTED);
    CHECK(clSetUserEventStatus(user, CL_COMPLETE));
    CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_COMPLETE);
    CHECK(clReleaseEvent(user));
    int out[64];
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    printf("rounds %d, source %zu bytes, kernels %zu, refs %u then %u, a[0] %d\n", rounds, len, nk,
           refs, refs2, out[0]);
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
