/* Blocks in clWaitForEvents on a user event nobody completes; prints the status the call
 * returns when the server is killed underneath it. */
#include "common.h"
#include <time.h>

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK(err);
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    printf("waiting\n");
    fflush(stdout);
    err = clWaitForEvents(1, &gate);
    printf("returned %d\n", err);
    fflush(stdout);
    /* Later calls fail fast too. */
    cl_int st;
    err = clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
    printf("then %d\n", err);
    return 0;
}
