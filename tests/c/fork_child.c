/* A process with a session forks a child that exits normally (running the libraries' exit
 * hooks); the parent's session must carry on. Prints "fork OK". */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK(err);
    pid_t child = fork();
    if (child == 0) exit(0);
    int st;
    waitpid(child, &st, 0);
    usleep(300 * 1000);
    cl_uint n;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL));
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK(err);
    CHECK(clFinish(q));
    printf("fork OK\n");
    return 0;
}
