/* Rectangle and image transfers outside their buffer or image are the driver's
 * CL_INVALID_VALUE, and the application's memory is not touched for them: the host pointer
 * holds 16 bytes, the regions asked for span up to a GiB of host memory, and a forwarding
 * client that read or wrote that first would crash instead of answering. Buffers,
 * sub-buffers, 2D images and 1D image arrays, blocking and not; in-range transfers still work. */
#include "common.h"
#include <string.h>

static void rects(cl_command_queue q, cl_mem b, size_t size, char *small) {
    const size_t zero[3] = {0, 0, 0};
    /* One row past the end, a GiB, and an origin 4 GiB in. */
    const size_t past_origin[3] = {0, 1, 0}, past_region[3] = {4096, size / 4096, 1};
    const size_t huge_region[3] = {1 << 16, 1 << 14, 1};
    const size_t far_origin[3] = {0, 0, (size_t)1 << 20};
    const size_t one_row[3] = {16, 1, 1};
    for (int blocking = 0; blocking < 2; blocking++) {
        EXPECT(clEnqueueWriteBufferRect(q, b, blocking, past_origin, zero, past_region, 4096, 0, 4096, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadBufferRect(q, b, blocking, past_origin, zero, past_region, 4096, 0, 4096, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueWriteBufferRect(q, b, blocking, zero, zero, huge_region, 0, 0, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadBufferRect(q, b, blocking, zero, zero, huge_region, 0, 0, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueWriteBufferRect(q, b, blocking, far_origin, zero, one_row, 16, 4096, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadBufferRect(q, b, blocking, far_origin, zero, one_row, 16, 4096, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
    }
    /* The last 16 bytes, in range. */
    const size_t last[3] = {size - 16, 0, 0};
    CHECK(clEnqueueWriteBufferRect(q, b, CL_TRUE, last, zero, one_row, 0, 0, 0, 0, small, 0, NULL, NULL));
    char back[16] = {0};
    CHECK(clEnqueueReadBufferRect(q, b, CL_TRUE, last, zero, one_row, 0, 0, 0, 0, back, 0, NULL, NULL));
    EXPECT(!memcmp(back, small, sizeof back));
}

/* Rows beyond the last are left out for 1D image arrays (`rows_too` 0): PoCL 3.1 accepts an
 * array index beyond their array size natively (and then reads or writes past the
 * application's memory), so there is no native answer to match. */
static void images(cl_command_queue q, cl_mem img, size_t w, size_t h, int rows_too, char *small) {
    const size_t zero[3] = {0, 0, 0};
    /* Rows beyond the height (or array size): 16 MiB of host memory for 16 bytes. */
    const size_t tall[3] = {w, (size_t)1 << 16, 1};
    /* A pixel past the width, one past the last row, and a third dimension the image lacks. */
    const size_t edge_origin[3] = {w - 2, 0, 0}, edge_region[3] = {4, 1, 1};
    const size_t below_origin[3] = {0, h, 0}, one_pixel[3] = {1, 1, 1};
    const size_t deep[3] = {1, 1, 2};
    for (int blocking = 0; blocking < 2; blocking++) {
        if (rows_too) {
            EXPECT(clEnqueueWriteImage(q, img, blocking, zero, tall, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueReadImage(q, img, blocking, zero, tall, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueWriteImage(q, img, blocking, below_origin, one_pixel, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
            EXPECT(clEnqueueReadImage(q, img, blocking, below_origin, one_pixel, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        }
        EXPECT(clEnqueueWriteImage(q, img, blocking, edge_origin, edge_region, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadImage(q, img, blocking, edge_origin, edge_region, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueWriteImage(q, img, blocking, zero, deep, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
        EXPECT(clEnqueueReadImage(q, img, blocking, zero, deep, 0, 0, small, 0, NULL, NULL) == CL_INVALID_VALUE);
    }
    /* The last pixel, in range. */
    const size_t last[3] = {w - 1, h - 1, 0};
    CHECK(clEnqueueWriteImage(q, img, CL_TRUE, last, one_pixel, 0, 0, small, 0, NULL, NULL));
    char back[4] = {0};
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, last, one_pixel, 0, 0, back, 0, NULL, NULL));
    EXPECT(!memcmp(back, small, sizeof back));
}

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    size_t size = 1 << 20;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    cl_uint align = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    cl_buffer_region region = {align / 8, 64 * 1024};
    cl_mem sub = clCreateSubBuffer(b, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK(err);
    char small[16];
    memset(small, 7, sizeof small);
    rects(q, b, size, small);
    rects(q, sub, region.size, small);

    cl_bool image_support = CL_FALSE;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_IMAGE_SUPPORT, sizeof image_support, &image_support, NULL));
    if (image_support) {
        cl_image_format fmt = {CL_RGBA, CL_UNORM_INT8};
        cl_image_desc desc2d = {.image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = 64, .image_height = 32};
        cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc2d, NULL, &err);
        CHECK(err);
        images(q, img, 64, 32, 1, small);
        cl_image_desc desc1da = {.image_type = CL_MEM_OBJECT_IMAGE1D_ARRAY, .image_width = 64, .image_array_size = 8};
        cl_mem arr = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc1da, NULL, &err);
        CHECK(err);
        images(q, arr, 64, 8, 0, small);
        clReleaseMemObject(arr);
        clReleaseMemObject(img);
    }
    CHECK(clFinish(q));
    printf("OK\n");
    clReleaseMemObject(sub);
    clReleaseMemObject(b);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
