/* Large buffers, which Wormhole stores where its client can copy them itself (the session's
 * shared arena): blocking reads and writes wait for the commands before them, contents and
 * offsets survive every path (kernels, maps, sub-buffers, an out-of-order queue), the flags
 * read back are the ones asked for, errors are native, and storage is reused as buffers come
 * and go. Prints "windows OK"; with "hold", then keeps its buffers until stdin closes. */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void copy(__global const int *s, __global int *d) {\n"
    "    size_t i = get_global_id(0); d[i] = s[i];\n"
    "}\n"
    "__kernel void add(__global int *a, int k) { a[get_global_id(0)] += k; }\n";

static cl_mem_flags flags_of(cl_mem m) {
    cl_mem_flags f = 0;
    CHECK(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof f, &f, NULL));
    return f;
}

static void *host_ptr_of(cl_mem m) {
    void *p = (void *)1;
    CHECK(clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof p, &p, NULL));
    return p;
}

int main(int argc, char **argv) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    open_queue(&d, &ctx, &q);
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &d, "", NULL, NULL));
    cl_kernel copy = clCreateKernel(prog, "copy", &err);
    CHECK(err);
    cl_kernel add = clCreateKernel(prog, "add", &err);
    CHECK(err);

    const size_t n = 4u << 20, size = n * sizeof(int);
    int *a = malloc(size), *b = malloc(size), *c = malloc(size);
    for (size_t i = 0; i < n; i++) a[i] = (int)i;

    /* contents given at creation; the flags and host pointer the application asked for */
    cl_mem src = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, size, a, &err);
    CHECK(err);
    cl_mem dst = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, size, NULL, &err);
    CHECK(err);
    cl_mem plain = clCreateBuffer(ctx, CL_MEM_READ_ONLY, size, NULL, &err);
    CHECK(err);
    EXPECT(flags_of(src) == (CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR));
    EXPECT(flags_of(dst) == (CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR));
    EXPECT(flags_of(plain) == CL_MEM_READ_ONLY);
    EXPECT(host_ptr_of(src) == NULL && host_ptr_of(dst) == NULL);
    CHECK(clEnqueueReadBuffer(q, src, CL_TRUE, 0, size, b, 0, NULL, NULL));
    EXPECT(memcmp(a, b, size) == 0);

    /* a blocking write waits for the kernel enqueued before it, which reads the old contents */
    CHECK(clSetKernelArg(copy, 0, sizeof src, &src));
    CHECK(clSetKernelArg(copy, 1, sizeof dst, &dst));
    CHECK(clEnqueueNDRangeKernel(q, copy, 1, NULL, &n, NULL, 0, NULL, NULL));
    for (size_t i = 0; i < n; i++) b[i] = -(int)i;
    CHECK(clEnqueueWriteBuffer(q, src, CL_TRUE, 0, size, b, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dst, CL_TRUE, 0, size, c, 0, NULL, NULL));
    EXPECT(memcmp(a, c, size) == 0);

    /* a blocking read waits for the kernel that changes the buffer */
    int k = 7;
    CHECK(clSetKernelArg(add, 0, sizeof src, &src));
    CHECK(clSetKernelArg(add, 1, sizeof k, &k));
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, src, CL_TRUE, 0, size, c, 0, NULL, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(c[i] == -(int)i + 7);

    /* offsets, and a read with an event (the ordinary path) of what a direct write left */
    for (size_t i = 0; i < 1000; i++) a[i] = (int)(i * 3 + 1);
    CHECK(clEnqueueWriteBuffer(q, src, CL_TRUE, 12345 * sizeof(int), 1000 * sizeof(int), a, 0, NULL, NULL));
    cl_event ev;
    CHECK(clEnqueueReadBuffer(q, src, CL_TRUE, 12000 * sizeof(int), 2000 * sizeof(int), c, 0, NULL, &ev));
    CHECK(clWaitForEvents(1, &ev));
    clReleaseEvent(ev);
    for (size_t i = 0; i < 2000; i++) {
        size_t at = 12000 + i;
        int want = (at >= 12345 && at < 13345) ? a[at - 12345] : -(int)at + 7;
        EXPECT(c[i] == want);
    }

    /* a sub-buffer sees the parent's bytes, and writes through it land in the parent */
    cl_uint align_bits = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    cl_buffer_region reg = {(size_t)align_bits / 8 * 64, 1 << 20};
    cl_mem sub = clCreateSubBuffer(dst, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
    CHECK(err);
    EXPECT((flags_of(sub) & CL_MEM_USE_HOST_PTR) == 0);
    memset(b, 0x42, 1 << 20);
    CHECK(clEnqueueWriteBuffer(q, sub, CL_TRUE, 0, 1 << 20, b, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dst, CL_TRUE, reg.origin, 1 << 20, c, 0, NULL, NULL));
    EXPECT(memcmp(b, c, 1 << 20) == 0);
    clReleaseMemObject(sub);

    /* maps see what direct copies wrote, and direct copies see what maps wrote */
    int *m = clEnqueueMapBuffer(q, src, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, size, 0, NULL, NULL, &err);
    CHECK(err);
    EXPECT(m[12345] == a[0] && m[0] == 7);
    for (size_t i = 0; i < n; i++) m[i] = (int)(i ^ 0x5555);
    CHECK(clEnqueueUnmapMemObject(q, src, m, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, src, CL_TRUE, 0, size, c, 0, NULL, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(c[i] == (int)(i ^ 0x5555));
    /* a non-blocking map and unmap with events, as PyOpenCL does, and an invalidating map */
    cl_event mapped, unmapped;
    int *part = clEnqueueMapBuffer(q, src, CL_FALSE, CL_MAP_READ, 4096, 4096, 0, NULL, &mapped, &err);
    CHECK(err);
    CHECK(clWaitForEvents(1, &mapped));
    EXPECT(part[0] == (int)(1024 ^ 0x5555) && part[1023] == (int)(2047 ^ 0x5555));
    CHECK(clEnqueueUnmapMemObject(q, src, part, 0, NULL, &unmapped));
    CHECK(clWaitForEvents(1, &unmapped));
    clReleaseEvent(mapped);
    clReleaseEvent(unmapped);
    part = clEnqueueMapBuffer(q, src, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, 8192, 0, NULL, NULL, &err);
    CHECK(err);
    for (int i = 0; i < 2048; i++) part[i] = 3 * i;
    CHECK(clEnqueueUnmapMemObject(q, src, part, 0, NULL, NULL));
    CHECK(clSetKernelArg(copy, 0, sizeof src, &src));
    CHECK(clSetKernelArg(copy, 1, sizeof dst, &dst));
    CHECK(clEnqueueNDRangeKernel(q, copy, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dst, CL_TRUE, 0, 8192, c, 0, NULL, NULL));
    for (int i = 0; i < 2048; i++) EXPECT(c[i] == 3 * i);

    /* an out-of-order queue */
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
    cl_command_queue ooo = clCreateCommandQueueWithProperties(ctx, d, props, &err);
    if (err == CL_SUCCESS) {
        for (size_t i = 0; i < n; i++) b[i] = (int)(i * 7);
        CHECK(clEnqueueWriteBuffer(ooo, dst, CL_TRUE, 0, size, b, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(ooo, dst, CL_TRUE, 0, size, c, 0, NULL, NULL));
        EXPECT(memcmp(b, c, size) == 0);
        clReleaseCommandQueue(ooo);
    }

    /* errors, as natively */
    EXPECT(clEnqueueWriteBuffer(q, src, CL_TRUE, size - 4, 8, b, 0, NULL, NULL) == CL_INVALID_VALUE);
    EXPECT(clEnqueueReadBuffer(q, src, CL_TRUE, size, 4, c, 0, NULL, NULL) == CL_INVALID_VALUE);
    cl_mem hidden = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_NO_ACCESS, size, NULL, &err);
    CHECK(err);
    EXPECT(clEnqueueReadBuffer(q, hidden, CL_TRUE, 0, size, c, 0, NULL, NULL) == CL_INVALID_OPERATION);
    EXPECT(clEnqueueWriteBuffer(q, hidden, CL_TRUE, 0, size, b, 0, NULL, NULL) == CL_INVALID_OPERATION);
    clReleaseMemObject(hidden);

    /* buffers come and go; each one holds exactly what was written to it */
    for (int round = 0; round < 40; round++) {
        size_t len = (size_t)(1 + round % 5) << 20;
        cl_mem t = clCreateBuffer(ctx, CL_MEM_READ_WRITE, len, NULL, &err);
        CHECK(err);
        memset(b, round, len);
        CHECK(clEnqueueWriteBuffer(q, t, CL_TRUE, 0, len, b, 0, NULL, NULL));
        memset(c, 0xff, len);
        CHECK(clEnqueueReadBuffer(q, t, CL_TRUE, 0, len, c, 0, NULL, NULL));
        EXPECT(memcmp(b, c, len) == 0);
        CHECK(clReleaseMemObject(t));
    }
    printf("windows OK\n");
    fflush(stdout);
    hold_if_asked(argc, argv);
    clReleaseMemObject(plain);
    clReleaseMemObject(src);
    clReleaseMemObject(dst);
    return 0;
}
