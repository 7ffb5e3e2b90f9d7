/* Device-side copies and fills repeated in a loop (OpenCV copies and fills its images so,
   hashcat copies between its buffers), then what must still be refused: overlapping copies
   within one buffer and between two sub-buffers of one buffer, ranges past the end, a fill
   whose offset is not a multiple of its pattern. */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    enum { N = 1 << 16 };
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    CHECK(err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    CHECK(err);
    for (int i = 0; i < rounds; i++) {
        cl_uint v = (cl_uint)i * 2654435761u;
        size_t off = (size_t)(i % 16) * 1024;
        CHECK(clEnqueueFillBuffer(q, a, &v, sizeof v, off, 4096, 0, NULL, NULL));
        CHECK(clEnqueueCopyBuffer(q, a, b, off, N - off - 4096, 4096, 0, NULL, NULL));
        /* within one buffer, not overlapping */
        CHECK(clEnqueueCopyBuffer(q, b, b, N - off - 4096, off / 2, 512, 0, NULL, NULL));
    }
    unsigned char *out = malloc(N);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, out, 0, NULL, NULL));
    unsigned long sum = 0;
    for (int i = 0; i < N; i++) sum = sum * 31 + out[i];

    cl_int e_overlap = clEnqueueCopyBuffer(q, b, b, 0, 256, 512, 0, NULL, NULL);
    cl_uint align = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    size_t step = align / 8;
    cl_buffer_region r1 = {0, 2 * step}, r2 = {step, 2 * step};
    cl_mem s1 = clCreateSubBuffer(a, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r1, &err);
    CHECK(err);
    cl_mem s2 = clCreateSubBuffer(a, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r2, &err);
    CHECK(err);
    /* Apart first (accepted), then overlapping within the parent. */
    cl_int e_sub_apart = clEnqueueCopyBuffer(q, s1, s2, 0, step, step / 2, 0, NULL, NULL);
    cl_int e_sub_overlap = clEnqueueCopyBuffer(q, s1, s2, step, 0, step, 0, NULL, NULL);
    cl_int e_past = clEnqueueCopyBuffer(q, a, b, N - 100, 0, 200, 0, NULL, NULL);
    cl_uint v = 7;
    cl_int e_fill_ok = clEnqueueFillBuffer(q, a, &v, sizeof v, 0, 64, 0, NULL, NULL);
    cl_int e_fill_misaligned = clEnqueueFillBuffer(q, a, &v, sizeof v, 2, 64, 0, NULL, NULL);
    cl_int e_fill_past = clEnqueueFillBuffer(q, a, &v, sizeof v, N - 4, 64, 0, NULL, NULL);
    CHECK(clFinish(q));
    printf("rounds %d, checksum %lu\n", rounds, sum);
    printf("overlap %d, sub-buffers apart %d overlapping %d, past the end %d, fill %d misaligned %d past %d\n",
           e_overlap, e_sub_apart, e_sub_overlap, e_past, e_fill_ok, e_fill_misaligned, e_fill_past);
    free(out);
    clReleaseMemObject(s1);
    clReleaseMemObject(s2);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
