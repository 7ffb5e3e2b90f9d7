/* Transfers outside a buffer are the driver's CL_INVALID_VALUE, and the application's memory
 * is not touched for them: the host pointer here holds 16 bytes, the sizes asked for are far
 * larger (up to beyond a frame), and a forwarding client that read or wrote them first would
 * crash instead of answering. Buffers, sub-buffers, blocking and not. */
#include "common.h"
#include <string.h>

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
    CHECK(err);
    cl_uint align = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    cl_buffer_region region = {align / 8, 4096};
    cl_mem sub = clCreateSubBuffer(b, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK(err);
    char small[16];
    memset(small, 7, sizeof small);
    size_t huge[] = {(size_t)2 << 20, (size_t)1 << 30, ((size_t)3 << 30) + 5};
    for (int i = 0; i < 3; i++) {
        for (int blocking = 0; blocking < 2; blocking++) {
            EXPECT(clEnqueueWriteBuffer(q, b, blocking, 0, huge[i], small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueReadBuffer(q, b, blocking, 0, huge[i], small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueWriteBuffer(q, sub, blocking, 0, huge[i], small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueReadBuffer(q, sub, blocking, 0, huge[i], small, 0, NULL, NULL) == CL_INVALID_VALUE);
        }
    }
    /* Just past the end, and an offset whose sum with the size wraps around. */
    EXPECT(clEnqueueWriteBuffer(q, sub, CL_TRUE, 4090, 8, small, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadBuffer(q, b, CL_TRUE, (size_t)-8, 16, small, 0, NULL, NULL) == CL_INVALID_VALUE);
    /* In range still works. */
    CHECK(clEnqueueWriteBuffer(q, sub, CL_TRUE, 4080, 16, small, 0, NULL, NULL));
    char back[16] = {0};
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, region.origin + 4080, 16, back, 0, NULL, NULL));
    EXPECT(!memcmp(back, small, sizeof back));
    CHECK(clFinish(q));
    printf("OK\n");
    clReleaseMemObject(sub);
    clReleaseMemObject(b);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
