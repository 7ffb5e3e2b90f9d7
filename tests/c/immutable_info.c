/* Info a library asks for again and again (clFFT asks its program for the context at every
   transform): values that never change for an object, and values that do, side by side.
   Prints what it saw, so the output can be compared with native. */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }\n"
    "__kernel void staged(__global int *a, __local int *t) {\n"
    "  t[get_local_id(0)] = a[get_global_id(0)]; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  a[get_global_id(0)] = t[0]; }\n";

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
    /* Every buffer's size (libraries ask it of each buffer they make), a sub-buffer's too. */
    for (int i = 0; i < rounds; i++) {
        size_t want = 64 * (size_t)(i + 1), size = 0;
        cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, want, NULL, &err);
        CHECK(err);
        CHECK(clGetMemObjectInfo(b, CL_MEM_SIZE, sizeof size, &size, NULL));
        EXPECT(size == want);
        size_t small = 0;
        EXPECT(clGetMemObjectInfo(b, CL_MEM_SIZE, 4, &small, NULL) == CL_INVALID_VALUE);
        CHECK(clReleaseMemObject(b));
    }
    cl_uint align = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    cl_buffer_region region = {align / 8, 32};
    cl_mem sub = clCreateSubBuffer(buf, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK(err);
    size_t sub_size = 0;
    CHECK(clGetMemObjectInfo(sub, CL_MEM_SIZE, sizeof sub_size, &sub_size, NULL));
    CHECK(clReleaseMemObject(sub));
    /* A kernel's local memory counts the local arguments set so far: asked anew each time. */
    cl_kernel staged = clCreateKernel(prog, "staged", &err);
    CHECK(err);
    cl_ulong lm[3] = {0, 0, 0};
    CHECK(clGetKernelWorkGroupInfo(staged, d, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lm[0], &lm[0], NULL));
    CHECK(clSetKernelArg(staged, 1, 4096, NULL));
    CHECK(clGetKernelWorkGroupInfo(staged, d, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lm[1], &lm[1], NULL));
    CHECK(clSetKernelArg(staged, 1, 64, NULL));
    CHECK(clGetKernelWorkGroupInfo(staged, d, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lm[2], &lm[2], NULL));
    CHECK(clReleaseKernel(staged));
    printf("sub-buffer size %zu, local memory %lu then %lu then %lu\n", sub_size, (unsigned long)lm[0],
           (unsigned long)lm[1], (unsigned long)lm[2]);
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
    EXPECT(nk == 2);
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
