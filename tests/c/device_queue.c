/* A device-side queue on a device without device-side enqueue is refused with
 * CL_INVALID_QUEUE_PROPERTIES, as the spec says, and the session carries on (PoCL 3.1 aborts
 * the process instead: through Wormhole that was the session's worker, and every later call
 * failed with CL_OUT_OF_RESOURCES). Where the device does have device-side queues, one is
 * made. Prints "refused" or "made", then "ok". */
#include "common.h"

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_device_device_enqueue_capabilities caps = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES, sizeof caps, &caps, NULL));
    cl_queue_properties props[] = {
        CL_QUEUE_PROPERTIES, CL_QUEUE_ON_DEVICE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
    cl_command_queue dq = clCreateCommandQueueWithProperties(ctx, d, props, &err);
    if (caps & CL_DEVICE_QUEUE_SUPPORTED) {
        CHECK(err);
        CHECK(clReleaseCommandQueue(dq));
        printf("made\n");
    } else {
        EXPECT(err == CL_INVALID_QUEUE_PROPERTIES && dq == NULL);
        printf("refused\n");
    }
    /* The session goes on. */
    cl_int v = 7, got = 0;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof v, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueFillBuffer(q, b, &v, sizeof v, 0, sizeof v, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
    EXPECT(got == 7);
    CHECK(clReleaseMemObject(b));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("ok\n");
    return 0;
}
