/* An application may release an event right after asking for its completion callback
   (OpenCV does): the callback still gets that event, usable (natively the driver keeps it
   until its callbacks ran), and the event's reference count does not show the callback's. */
#include "common.h"
#include <stdatomic.h>
#include <unistd.h>

static atomic_int ran;
static cl_event seen[2];
static cl_int status_query[2], status_seen[2];

static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *user) {
    int i = (int)(size_t)user;
    seen[i] = e;
    cl_int s = -1;
    status_query[i] = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL);
    status_seen[i] = s;
    (void)status;
    atomic_fetch_add(&ran, 1);
}

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    CHECK(err);
    /* A user event holds both commands back until both callbacks are asked for. */
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    cl_int zero = 0;
    cl_event ev[2];
    for (int i = 0; i < 2; i++)
        CHECK(clEnqueueFillBuffer(q, buf, &zero, sizeof zero, 0, 4096, 1, &gate, &ev[i]));
    cl_uint before = 0, after = 0;
    CHECK(clGetEventInfo(ev[0], CL_EVENT_REFERENCE_COUNT, sizeof before, &before, NULL));
    for (int i = 0; i < 2; i++) CHECK(clSetEventCallback(ev[i], CL_COMPLETE, on_complete, (void *)(size_t)i));
    CHECK(clGetEventInfo(ev[0], CL_EVENT_REFERENCE_COUNT, sizeof after, &after, NULL));
    cl_event kept = ev[0], released = ev[1];
    CHECK(clReleaseEvent(ev[1]));
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clFinish(q));
    for (int t = 0; t < 1000 && atomic_load(&ran) < 2; t++) usleep(10000);
    EXPECT(atomic_load(&ran) == 2);
    EXPECT(seen[0] == kept && seen[1] == released);
    EXPECT(status_query[0] == CL_SUCCESS && status_query[1] == CL_SUCCESS);
    EXPECT(status_seen[0] == CL_COMPLETE && status_seen[1] == CL_COMPLETE);
    EXPECT(after == before);
    printf("callbacks %d, references %u then %u, statuses %d %d\n", atomic_load(&ran), before, after,
           status_seen[0], status_seen[1]);
    CHECK(clReleaseEvent(ev[0]));
    CHECK(clReleaseEvent(gate));
    clReleaseMemObject(buf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
