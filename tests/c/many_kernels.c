/* Enqueues COUNT tiny kernels without waiting (each adds 1 to every element), then clFinish,
 * and checks every element is COUNT: the admission limit (max_queued) may slow an enqueue
 * down, never change a result. Prints "ready" and waits for a line on stdin before the flood,
 * then prints "ok COUNT" and waits for stdin's end before it ends its session. */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void inc(__global int *a) { a[get_global_id(0)] += 1; }\n";

int main(int argc, char **argv) {
    EXPECT(argc == 2);
    int count = atoi(argv[1]);
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_program prog = build(ctx, dev, SRC);
    cl_kernel k = clCreateKernel(prog, "inc", &err);
    CHECK(err);
    enum { N = 64 };
    int host[N];
    memset(host, 0, sizeof host);
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof a, &a));
    printf("ready\n");
    fflush(stdout);
    char line[64];
    EXPECT(fgets(line, sizeof line, stdin) != NULL);
    size_t global = N;
    cl_event last = NULL;
    for (int i = 0; i < count; i++) {
        /* One in 1000 with an event of its own: the application's events stay its own. */
        int with_event = i % 1000 == 999;
        if (with_event && last)
            CHECK(clReleaseEvent(last));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, with_event ? &last : NULL));
    }
    CHECK(clFinish(q));
    if (last) {
        cl_int st;
        CHECK(clGetEventInfo(last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
        EXPECT(st == CL_COMPLETE);
        cl_command_type type;
        CHECK(clGetEventInfo(last, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
        EXPECT(type == CL_COMMAND_NDRANGE_KERNEL);
        CHECK(clReleaseEvent(last));
    }
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    for (int i = 0; i < N; i++) {
        if (host[i] != count) {
            fprintf(stderr, "element %d is %d, not %d\n", i, host[i], count);
            return 1;
        }
    }
    printf("ok %d\n", count);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
