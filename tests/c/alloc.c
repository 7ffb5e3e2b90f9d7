/* Allocates buffers of the sizes given (MiB) and prints the status of each creation (kept
 * alive until the end), then waits for a line on stdin if asked to (argv[1] == "hold"). */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    int hold = argc > 1 && !strcmp(argv[1], "hold");
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
    return 0;
}
