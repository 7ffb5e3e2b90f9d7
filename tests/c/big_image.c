/* Image and rectangle transfers whose host footprint may exceed a frame (1 GiB): a 2D
 * CL_RGBA/CL_UNSIGNED_INT8 image of argv[1] x argv[2] pixels (default 256 x 128) is written and
 * read back, blocking and not, with a host row pitch padded by 64 bytes (the padding must stay
 * untouched); out-of-range regions fail as natively; the whole image is mapped, changed and
 * unmapped; a buffer of the image's size takes the same bytes through
 * clEnqueueWriteBufferRect and clEnqueueReadBufferRect; and an image and a buffer are created
 * from them (CL_MEM_COPY_HOST_PTR). At 16384 x 16384 (the CTS's imagedim_pow2 at PoCL's largest
 * 2D image: 1 GiB) the host footprint is 1 GiB + 1 MiB.
 * Prints "big image OK", or "big image skipped: ..." when the device cannot hold the image. */
#include "common.h"
#include <stdint.h>
#include <string.h>

#define PAD 64

/* The pattern's byte at (x, y): every pixel and row differs from its neighbours. */
static inline uint8_t pattern(size_t x, size_t y) {
    return (uint8_t)(x * 31 + y * 17 + (y >> 8) * 7 + (x >> 10));
}

static void fill(uint8_t *h, size_t row_bytes, size_t pitch, size_t rows) {
    for (size_t y = 0; y < rows; y++) {
        uint8_t *r = h + y * pitch;
        for (size_t x = 0; x < row_bytes; x++) r[x] = pattern(x, y);
    }
}

/* Changes one byte in every third row (twice: back to the pattern). */
static void flip(uint8_t *h, size_t row_bytes, size_t pitch, size_t rows) {
    for (size_t y = 0; y < rows; y += 3) h[y * pitch + (y * 7) % row_bytes] ^= 0xFF;
}

/* Every row holds the pattern and every padding byte is still `pad` (-1: any). */
static int check(const uint8_t *h, size_t row_bytes, size_t pitch, size_t rows, int pad) {
    for (size_t y = 0; y < rows; y++) {
        const uint8_t *r = h + y * pitch;
        for (size_t x = 0; x < row_bytes; x++) {
            if (r[x] != pattern(x, y)) {
                fprintf(stderr, "byte %zu of row %zu: %u, expected %u\n", x, y, r[x], pattern(x, y));
                return 0;
            }
        }
        if (pad >= 0 && y + 1 < rows) {
            for (size_t x = row_bytes; x < pitch; x++) {
                if (r[x] != pad) {
                    fprintf(stderr, "padding byte %zu of row %zu was written\n", x, y);
                    return 0;
                }
            }
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    size_t w = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    size_t hgt = argc > 2 ? strtoull(argv[2], NULL, 10) : 128;
    cl_bool images = CL_FALSE;
    size_t max_w = 0, max_h = 0;
    cl_ulong max_alloc = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL));
    if (images) {
        CHECK(clGetDeviceInfo(d, CL_DEVICE_IMAGE2D_MAX_WIDTH, sizeof max_w, &max_w, NULL));
        CHECK(clGetDeviceInfo(d, CL_DEVICE_IMAGE2D_MAX_HEIGHT, sizeof max_h, &max_h, NULL));
    }
    size_t row_bytes = w * 4, pitch = row_bytes + PAD;
    size_t size = row_bytes * hgt, footprint = pitch * (hgt - 1) + row_bytes;
    if (!images || w > max_w || hgt > max_h || size > max_alloc) {
        printf("big image skipped: the device holds no %zu x %zu RGBA8 image\n", w, hgt);
        return 0;
    }
    uint8_t *h = malloc(footprint);
    if (!h) {
        printf("big image skipped: no %zu bytes of host memory\n", footprint);
        return 0;
    }
    cl_int err;
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = w;
    desc.image_height = hgt;
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
    CHECK(err);
    size_t origin[3] = {0, 0, 0}, region[3] = {w, hgt, 1};

    /* A blocking write and a blocking read of the whole image. */
    memset(h, 0xEE, footprint);
    fill(h, row_bytes, pitch, hgt);
    CHECK(clEnqueueWriteImage(q, img, CL_TRUE, origin, region, pitch, 0, h, 0, NULL, NULL));
    memset(h, 0, footprint);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, region, pitch, 0, h, 0, NULL, NULL));
    EXPECT(check(h, row_bytes, pitch, hgt, 0));

    /* A non-blocking read with an event: the bytes are there once the event is waited for. */
    memset(h, 0x5A, footprint);
    cl_event read;
    CHECK(clEnqueueReadImage(q, img, CL_FALSE, origin, region, pitch, 0, h, 0, NULL, &read));
    CHECK(clWaitForEvents(1, &read));
    EXPECT(check(h, row_bytes, pitch, hgt, 0x5A));
    cl_command_type type = 0;
    CHECK(clGetEventInfo(read, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    EXPECT(type == CL_COMMAND_READ_IMAGE);
    CHECK(clReleaseEvent(read));

    /* Out of range by one row: refused as natively, and the image keeps its bytes. */
    size_t shifted[3] = {0, 1, 0}, first_row[3] = {w, 1, 1};
    memset(h, 0xFF, row_bytes);
    EXPECT(clEnqueueWriteImage(q, img, CL_TRUE, shifted, region, pitch, 0, h, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadImage(q, img, CL_TRUE, shifted, region, pitch, 0, h, 0, NULL, NULL) == CL_INVALID_VALUE);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, first_row, 0, 0, h, 0, NULL, NULL));
    EXPECT(check(h, row_bytes, pitch, 1, 0));

    /* A non-blocking write with an event, read back. */
    flip(h, row_bytes, pitch, hgt);
    cl_event wrote;
    CHECK(clEnqueueWriteImage(q, img, CL_FALSE, origin, region, pitch, 0, h, 0, NULL, &wrote));
    CHECK(clWaitForEvents(1, &wrote));
    CHECK(clReleaseEvent(wrote));
    memset(h, 0, footprint);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, region, pitch, 0, h, 0, NULL, NULL));
    flip(h, row_bytes, pitch, hgt);
    EXPECT(check(h, row_bytes, pitch, hgt, 0));

    /* A blocking map of the whole image shows its bytes (changed rows and all); what the host
     * writes there is the image's once unmapped. */
    free(h);
    size_t map_pitch = 0;
    uint8_t *m = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, origin, region, &map_pitch, NULL, 0,
                                   NULL, NULL, &err);
    CHECK(err);
    EXPECT(map_pitch >= row_bytes);
    flip(m, row_bytes, map_pitch, hgt);
    EXPECT(check(m, row_bytes, map_pitch, hgt, -1));
    CHECK(clEnqueueUnmapMemObject(q, img, m, 0, NULL, NULL));
    h = malloc(footprint);
    EXPECT(h != NULL);
    memset(h, 0, footprint);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, region, pitch, 0, h, 0, NULL, NULL));
    EXPECT(check(h, row_bytes, pitch, hgt, 0));
    CHECK(clReleaseMemObject(img));

    /* The same footprint through a buffer's rectangle transfers. */
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    size_t rect[3] = {row_bytes, hgt, 1};
    CHECK(clEnqueueWriteBufferRect(q, buf, CL_TRUE, origin, origin, rect, row_bytes, 0, pitch, 0, h, 0, NULL, NULL));
    memset(h, 0, footprint);
    CHECK(clEnqueueReadBufferRect(q, buf, CL_TRUE, origin, origin, rect, row_bytes, 0, pitch, 0, h, 0, NULL, NULL));
    EXPECT(check(h, row_bytes, pitch, hgt, 0));
    size_t past[3] = {0, 1, 0};
    EXPECT(clEnqueueReadBufferRect(q, buf, CL_TRUE, past, origin, rect, row_bytes, 0, pitch, 0, h, 0, NULL, NULL) ==
           CL_INVALID_VALUE);
    CHECK(clReleaseMemObject(buf));

    /* Created from host memory (CL_MEM_COPY_HOST_PTR): an image with the padded row pitch, then
     * a buffer of the same bytes; rows at the start, middle and end read back. */
    uint8_t *row = malloc(pitch);
    EXPECT(row != NULL);
    desc.image_row_pitch = pitch;
    img = clCreateImage(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &desc, h, &err);
    CHECK(err);
    size_t ys[3] = {0, hgt / 2, hgt - 1};
    for (int i = 0; i < 3; i++) {
        size_t at[3] = {0, ys[i], 0};
        CHECK(clEnqueueReadImage(q, img, CL_TRUE, at, first_row, 0, 0, row, 0, NULL, NULL));
        EXPECT(memcmp(row, h + ys[i] * pitch, row_bytes) == 0);
    }
    CHECK(clReleaseMemObject(img));
    buf = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, size, h, &err);
    CHECK(err);
    for (int i = 0; i < 3; i++) {
        size_t at = ys[i] * row_bytes;
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, at, row_bytes, row, 0, NULL, NULL));
        EXPECT(memcmp(row, h + at, row_bytes) == 0);
    }
    CHECK(clReleaseMemObject(buf));
    free(row);

    free(h);
    printf("big image OK (%zu x %zu, host footprint %zu bytes)\n", w, hgt, footprint);
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
