/* Coarse-grained SVM migrated to the host and read there without a map (Boost.Compute's
 * svm_ptr test): PoCL's SVM is host memory, so native shows the device's bytes; through
 * Wormhole the client's mirror kept its old bytes. The spec asks for a map before such a
 * read; a migration to the host now brings the bytes along, whole allocations (size 0) and
 * parts alike. Prints "ok". */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void put(__global int *p, int base) { p[get_global_id(0)] = base + (int)get_global_id(0); }\n";

#define N 1024

int main(void) {
    cl_device_id d;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&d, &ctx, &q);
    cl_device_svm_capabilities caps = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) != CL_SUCCESS ||
        !(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) {
        printf("no SVM\nok\n");
        return 0;
    }
    int *p = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N * sizeof(int), 0);
    EXPECT(p != NULL);
    cl_program prog = build(ctx, d, SRC);
    cl_kernel k = clCreateKernel(prog, "put", &err);
    CHECK(err);
    CHECK(clSetKernelArgSVMPointer(k, 0, p));
    size_t global = N;

    /* The whole allocation (size 0), waited for with its event. */
    int base = 100;
    CHECK(clSetKernelArg(k, 1, sizeof base, &base));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    const void *ptrs[1] = {p};
    size_t whole[1] = {0};
    cl_event migrated;
    CHECK(clEnqueueSVMMigrateMem(q, 1, ptrs, whole, CL_MIGRATE_MEM_OBJECT_HOST, 0, NULL, &migrated));
    CHECK(clWaitForEvents(1, &migrated));
    for (int i = 0; i < N; i++) EXPECT(p[i] == base + i);
    CHECK(clReleaseEvent(migrated));

    /* Two parts of it (NULL sizes would mean whole allocations), waited for with clFinish. */
    base = 5000;
    CHECK(clSetKernelArg(k, 1, sizeof base, &base));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    const void *parts[2] = {p, p + N / 2};
    size_t sizes[2] = {16 * sizeof(int), 16 * sizeof(int)};
    CHECK(clEnqueueSVMMigrateMem(q, 2, parts, sizes, CL_MIGRATE_MEM_OBJECT_HOST, 0, NULL, NULL));
    CHECK(clFinish(q));
    for (int i = 0; i < 16; i++) {
        EXPECT(p[i] == base + i);
        EXPECT(p[N / 2 + i] == base + N / 2 + i);
    }

    /* A migration to the device moves nothing into host memory. */
    CHECK(clEnqueueSVMMigrateMem(q, 1, ptrs, whole, 0, 0, NULL, NULL));
    CHECK(clFinish(q));

    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(prog));
    clSVMFree(ctx, p);
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("ok\n");
    return 0;
}
