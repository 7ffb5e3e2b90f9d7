/* A CL_MEM_USE_HOST_PTR object mapped without waiting, unmapped at once, and only then waited
 * for (Boost.Compute's copy_async from a device vector to a host vector of another type:
 * the result is written into a buffer over the host vector, which is mapped to make the host
 * memory current). The spec puts the object's bits into the host memory when the map
 * completes, whether or not the application looked: through Wormhole the host memory kept
 * its old bytes (the map's bytes were dropped at the unmap).
 *
 * Cases: buffers small and large, released before the wait; a map waiting for a user event
 * set only after the unmap; a 2D image. Prints "ok". */
#include "common.h"
#include <string.h>

static void buffer_case(cl_context ctx, cl_command_queue q, size_t n, int user_gate) {
    cl_int err;
    cl_uint *host = malloc(n * sizeof *host);
    EXPECT(host != NULL);
    memset(host, 0, n * sizeof *host);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY | CL_MEM_USE_HOST_PTR, n * sizeof *host, host, &err);
    CHECK(err);
    cl_uint pattern = 0x5eed0000u + (cl_uint)n;
    cl_event filled, mapped, unmapped, gate = NULL;
    CHECK(clEnqueueFillBuffer(q, b, &pattern, sizeof pattern, 0, n * sizeof *host, 0, NULL, &filled));
    cl_event wait[2] = {filled, NULL};
    if (user_gate) {
        gate = clCreateUserEvent(ctx, &err);
        CHECK(err);
        wait[1] = gate;
    }
    void *p = clEnqueueMapBuffer(q, b, CL_FALSE, CL_MAP_READ, 0, n * sizeof *host, user_gate ? 2 : 1, wait,
                                 &mapped, &err);
    CHECK(err);
    EXPECT(p == host);
    CHECK(clEnqueueUnmapMemObject(q, b, p, 1, &mapped, &unmapped));
    CHECK(clReleaseMemObject(b));
    if (gate) {
        CHECK(clFlush(q));
        CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    }
    CHECK(clWaitForEvents(1, &unmapped));
    for (size_t i = 0; i < n; i++) EXPECT(host[i] == pattern);
    CHECK(clReleaseEvent(filled));
    CHECK(clReleaseEvent(mapped));
    CHECK(clReleaseEvent(unmapped));
    if (gate) CHECK(clReleaseEvent(gate));
    free(host);
}

static void image_case(cl_context ctx, cl_command_queue q) {
    cl_int err;
    const size_t w = 16, h = 8;
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = w;
    desc.image_height = h;
    cl_uchar *host = calloc(w * h, 4);
    EXPECT(host != NULL);
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, &fmt, &desc, host, &err);
    CHECK(err);
    cl_uint4 color = {{1, 2, 3, 4}};
    size_t origin[3] = {0, 0, 0}, region[3] = {w, h, 1}, row = 0;
    cl_event filled, mapped, unmapped;
    CHECK(clEnqueueFillImage(q, img, &color, origin, region, 0, NULL, &filled));
    void *p = clEnqueueMapImage(q, img, CL_FALSE, CL_MAP_READ, origin, region, &row, NULL, 1, &filled, &mapped, &err);
    CHECK(err);
    CHECK(clEnqueueUnmapMemObject(q, img, p, 1, &mapped, &unmapped));
    CHECK(clWaitForEvents(1, &unmapped));
    /* Natively (PoCL) the map is the host memory with the host's pitch; where a driver maps
     * elsewhere, the host memory is not promised current. */
    if (p == host && row == w * 4)
        for (size_t i = 0; i < w * h * 4; i++) EXPECT(host[i] == (cl_uchar)(i % 4 + 1));
    CHECK(clReleaseMemObject(img));
    CHECK(clReleaseEvent(filled));
    CHECK(clReleaseEvent(mapped));
    CHECK(clReleaseEvent(unmapped));
    free(host);
}

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    buffer_case(ctx, q, 4, 0);
    buffer_case(ctx, q, 1 << 20, 0);
    buffer_case(ctx, q, 64, 1);
    image_case(ctx, q);
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("ok\n");
    return 0;
}
