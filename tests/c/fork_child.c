/* A process with a session forks a child that tries a call and exits normally (running the
 * libraries' exit hooks). Through Wormhole the session stays the parent's: the child's call
 * fails cleanly (it must not write into the parent's lanes), and the parent carries on.
 * Prints "fork OK". */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    pid_t child = fork();
    if (child == 0) exit(clFinish(q) == CL_SUCCESS ? 3 : 0);
    int st;
    waitpid(child, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    usleep(300 * 1000);
    cl_uint n;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL));
    CHECK(clFinish(q));
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK(err);
    CHECK(clFinish(q2));
    printf("fork OK\n");
    return 0;
}
