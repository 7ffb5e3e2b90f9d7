/* CL_MEM_USE_HOST_PTR objects are mapped in the application's own memory, and report it:
 * a sub-buffer's CL_MEM_HOST_PTR and map pointer are the parent's host pointer plus the origin,
 * and a map of an image lands at its origin in the host memory, with the host's row pitch
 * (through Wormhole, both came back as fresh client memory / NULL: the CTS mem_host_flags and
 * api get_buffer_info differences). */
#include "common.h"
#include <string.h>

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);

    cl_uint align_bits = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    size_t origin = align_bits / 8, n = 4 * origin;
    unsigned char *host = malloc(n);
    EXPECT(host != NULL);
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)i;
    cl_mem parent = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR | CL_MEM_HOST_READ_ONLY, n, host, &err);
    CHECK(err);
    cl_buffer_region region = {origin, origin};
    cl_mem sub = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK(err);
    void *reported = NULL;
    CHECK(clGetMemObjectInfo(sub, CL_MEM_HOST_PTR, sizeof reported, &reported, NULL));
    EXPECT(reported == host + origin);
    unsigned char *m = clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_READ, 0, origin, 0, NULL, NULL, &err);
    CHECK(err);
    EXPECT(m == host + origin && m[1] == (unsigned char)(origin + 1));
    CHECK(clEnqueueUnmapMemObject(q, sub, m, 0, NULL, NULL));
    /* The parent's host access flag is the sub-buffer's too. */
    m = clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_WRITE, 0, origin, 0, NULL, NULL, &err);
    EXPECT(m == NULL && err == CL_INVALID_OPERATION);
    CHECK(clFinish(q));

    cl_bool images = CL_FALSE;
    clGetDeviceInfo(d, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
    if (images) {
        size_t w = 16, h = 8;
        unsigned char *pixels = malloc(w * h * 4);
        EXPECT(pixels != NULL);
        for (size_t i = 0; i < w * h * 4; i++) pixels[i] = (unsigned char)(i * 7);
        cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
        cl_image_desc desc = {0};
        desc.image_type = CL_MEM_OBJECT_IMAGE2D;
        desc.image_width = w;
        desc.image_height = h;
        cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, &fmt, &desc, pixels, &err);
        CHECK(err);
        size_t at[3] = {2, 3, 0}, reg[3] = {4, 2, 1}, row = 0, slice = 0;
        unsigned char *p = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ, at, reg, &row, &slice, 0, NULL, NULL, &err);
        CHECK(err);
        EXPECT(row == w * 4);
        EXPECT(p == pixels + 3 * row + 2 * 4);
        EXPECT(p[row + 5] == (unsigned char)((4 * row + 2 * 4 + 5) * 7));
        CHECK(clEnqueueUnmapMemObject(q, img, p, 0, NULL, NULL));
        CHECK(clFinish(q));
        CHECK(clReleaseMemObject(img));
        free(pixels);
    }
    CHECK(clReleaseMemObject(sub));
    CHECK(clReleaseMemObject(parent));
    free(host);
    printf("host pointer maps OK\n");
    return 0;
}
