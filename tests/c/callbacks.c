/* Callbacks and user events: build notify, event callbacks (fired after a user event
 * releases a kernel), memory destructor callbacks, a second thread waiting on a user event,
 * and a non-blocking read gated by a user event. */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static atomic_int build_notified, event_called, event_status = 99, destructor_called, waiter_done;
static void *seen_user_data;

static void CL_CALLBACK on_build(cl_program p, void *ud) {
    (void)p;
    seen_user_data = ud;
    atomic_store(&build_notified, 1);
}
static void CL_CALLBACK on_event(cl_event e, cl_int status, void *ud) {
    (void)e;
    (void)ud;
    atomic_store(&event_status, status);
    atomic_store(&event_called, 1);
}
static void CL_CALLBACK on_destroy(cl_mem m, void *ud) {
    (void)m;
    atomic_store(&destructor_called, *(int *)ud);
}
static void *waiter(void *arg) {
    cl_event e = (cl_event)arg;
    CHECK(clWaitForEvents(1, &e));
    atomic_store(&waiter_done, 1);
    return NULL;
}
static int wait_for(atomic_int *flag) {
    for (int i = 0; i < 500 && !atomic_load(flag); i++) usleep(10000);
    return atomic_load(flag);
}

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    const char *src = "__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }";
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    int marker = 42;
    CHECK(clBuildProgram(prog, 1, &d, "", on_build, &marker));
    EXPECT(wait_for(&build_notified));
    EXPECT(seen_user_data == &marker);

    cl_kernel k = clCreateKernel(prog, "inc", &err);
    CHECK(err);
    int host[16] = {0};
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));

    /* A kernel gated by a user event does not run until the event is set. */
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    pthread_t t;
    pthread_create(&t, NULL, waiter, gate);
    size_t g = 16;
    cl_event done;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 1, &gate, &done));
    CHECK(clSetEventCallback(done, CL_COMPLETE, on_event, NULL));
    int out[16] = {0};
    cl_event read_done;
    CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, sizeof out, out, 0, NULL, &read_done));
    CHECK(clFlush(q));
    usleep(100000);
    cl_int st;
    CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st != CL_COMPLETE);
    EXPECT(!atomic_load(&waiter_done));
    EXPECT(!atomic_load(&event_called));

    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &read_done));
    for (int i = 0; i < 16; i++) EXPECT(out[i] == 1);
    EXPECT(wait_for(&event_called));
    EXPECT(atomic_load(&event_status) == CL_COMPLETE);
    pthread_join(t, NULL);
    EXPECT(atomic_load(&waiter_done));

    int tag = 7;
    CHECK(clSetMemObjectDestructorCallback(buf, on_destroy, &tag));
    CHECK(clReleaseEvent(done));
    CHECK(clReleaseEvent(read_done));
    CHECK(clReleaseEvent(gate));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseMemObject(buf));
    EXPECT(wait_for(&destructor_called) == 7);
    printf("callbacks and user events OK\n");
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
