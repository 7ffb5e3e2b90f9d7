/* Allocates buffers of the sizes given (MiB) and prints the status of each creation (kept
 * alive until the end), then waits for a line on stdin if asked to (argv[1] == "hold").
 * With argv[1] == "svm-cycle", allocates and frees shared virtual memory of each size in
 * turn instead (status 0, or -4 when clSVMAlloc returns NULL). With argv[1] == "hold-call",
 * holds as "hold" does, then creates one more 1 MiB buffer and prints "after <status>" (what a
 * session's next call gets once the server ended it). */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    if (argc > 1 && !strcmp(argv[1], "svm-cycle")) {
        for (int i = 2; i < argc; i++) {
            size_t mib = (size_t)atol(argv[i]);
            char *p = clSVMAlloc(ctx, CL_MEM_READ_WRITE, mib << 20, 0);
            if (p) {
                CHECK(clEnqueueSVMMemFill(q, p, "\1", 1, mib << 20, 0, NULL, NULL));
                CHECK(clFinish(q));
                clSVMFree(ctx, p);
            }
            printf("%zu %d\n", mib, p ? CL_SUCCESS : CL_MEM_OBJECT_ALLOCATION_FAILURE);
            fflush(stdout);
        }
        return 0;
    }
    int call_after = argc > 1 && !strcmp(argv[1], "hold-call");
    int hold = call_after || (argc > 1 && !strcmp(argv[1], "hold"));
    for (int i = hold ? 2 : 1; i < argc; i++) {
        size_t mib = (size_t)atol(argv[i]);
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, mib << 20, NULL, &err);
        if (err == CL_SUCCESS) {
            /* touch it so the memory is really there */
            char c = 1;
            CHECK(clEnqueueFillBuffer(q, m, &c, 1, 0, mib << 20, 0, NULL, NULL));
            CHECK(clFinish(q));
        }
        printf("%zu %d\n", mib, err);
        fflush(stdout);
    }
    if (hold) {
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 0;
    }
    if (call_after) {
        clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
        printf("after %d\n", err);
        fflush(stdout);
    }
    return 0;
}
