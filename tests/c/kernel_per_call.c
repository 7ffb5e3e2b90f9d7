/* A kernel object made for every call, as OpenCV makes them: create by name, set the
   arguments, launch, ask for a callback, release. Then what must still be refused: a launch
   of a fresh kernel with an argument unset, a wrong name, bad callback requests, and an
   argument of the old size after the program was built again with another type. */
#include "common.h"
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static const char *SRC =
    "__kernel void add(__global T *a, T b) { a[get_global_id(0)] += b; }\n"
    "__kernel void scale(__global T *a, T b, __local T *tmp) {\n"
    "  tmp[get_local_id(0)] = a[get_global_id(0)] * b;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  a[get_global_id(0)] = tmp[get_local_id(0)]; }\n";

static atomic_int done;
static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *user) {
    (void)e;
    (void)user;
    if (status == CL_COMPLETE) atomic_fetch_add(&done, 1);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &d, "-DT=int", NULL, NULL));
    size_t n = 256, local = 64;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(cl_int), NULL, &err);
    CHECK(err);
    cl_int zero = 0;
    CHECK(clEnqueueFillBuffer(q, buf, &zero, sizeof zero, 0, n * sizeof(cl_int), 0, NULL, NULL));
    for (int i = 0; i < rounds; i++) {
        int b = i % 7 + 1;
        cl_kernel k = clCreateKernel(prog, i % 2 ? "scale" : "add", &err);
        CHECK(err);
        CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
        CHECK(clSetKernelArg(k, 1, sizeof(cl_int), &b));
        if (i % 2) CHECK(clSetKernelArg(k, 2, local * sizeof(cl_int), NULL));
        cl_event ev;
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, &local, 0, NULL, &ev));
        CHECK(clSetEventCallback(ev, CL_COMPLETE, on_complete, NULL));
        CHECK(clReleaseEvent(ev));
        CHECK(clReleaseKernel(k));
    }
    CHECK(clFinish(q));
    /* Callbacks run after the command completes, on a thread of the driver's: wait for them. */
    for (int t = 0; t < 1000 && atomic_load(&done) < rounds; t++) usleep(10000);
    EXPECT(atomic_load(&done) == rounds);
    cl_int out[256];
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));

    /* A fresh kernel of a known kind with its scalar unset: the launch is refused. */
    cl_kernel k = clCreateKernel(prog, "add", &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    cl_int e1 = clEnqueueNDRangeKernel(q, k, 1, NULL, &n, &local, 0, NULL, NULL);
    /* The same kind with the local buffer's size changed: known settings but one. */
    cl_kernel s = clCreateKernel(prog, "scale", &err);
    CHECK(err);
    cl_int two = 2;
    CHECK(clSetKernelArg(s, 0, sizeof buf, &buf));
    CHECK(clSetKernelArg(s, 1, sizeof two, &two));
    CHECK(clSetKernelArg(s, 2, local * sizeof(cl_int) * 2, NULL));
    CHECK(clEnqueueNDRangeKernel(q, s, 1, NULL, &n, &local, 0, NULL, NULL));
    cl_int e3;
    EXPECT(clCreateKernel(prog, "nosuch", &e3) == NULL);
    cl_event user = clCreateUserEvent(ctx, &err);
    CHECK(err);
    cl_int e4 = clSetEventCallback(user, CL_QUEUED, on_complete, NULL);
    cl_int e5 = clSetEventCallback(user, CL_COMPLETE, NULL, NULL);
    CHECK(clSetUserEventStatus(user, CL_COMPLETE));
    CHECK(clReleaseEvent(user));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseKernel(s));
    CHECK(clFinish(q));

    /* Built again with another type: the kernels take a double now, and an int is refused. */
    CHECK(clBuildProgram(prog, 1, &d, "-DT=long", NULL, NULL));
    k = clCreateKernel(prog, "add", &err);
    CHECK(err);
    cl_int e6 = clSetKernelArg(k, 1, sizeof(cl_int), &two);
    cl_long big = 5;
    CHECK(clSetKernelArg(k, 1, sizeof big, &big));
    CHECK(clReleaseKernel(k));

    printf("rounds %d, a[0] %d a[255] %d, callbacks %d\n", rounds, out[0], out[255], atomic_load(&done));
    printf("unset argument %d, bad name %d, bad callback type %d, no function %d, old size %d\n",
           e1, e3, e4, e5, e6);
    clReleaseMemObject(buf);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
