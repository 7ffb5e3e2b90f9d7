/* Coarse-grained shared virtual memory: a linked list built by the host inside SVM (pointers
 * stored in SVM data) is walked by a kernel; results come back by map and by memcpy. */
#include "common.h"
#include <string.h>

typedef struct node {
    struct node *next;
    int value;
} node;

static const char *SRC =
    "typedef struct node { __global struct node *next; int value; } node;\n"
    "__kernel void walk(__global node *head, __global int *out) {\n"
    "    int sum = 0;\n"
    "    for (__global node *n = head; n; n = n->next) sum += n->value;\n"
    "    out[0] = sum;\n"
    "    out[1] = head->next->value * 10;\n"
    "}\n";

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    cl_device_svm_capabilities caps = 0;
    CHECK(clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL));
    EXPECT(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK(err);
    enum { N = 100 };
    node *nodes = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N * sizeof(node), 0);
    int *out = clSVMAlloc(ctx, CL_MEM_READ_WRITE, 2 * sizeof(int), 0);
    EXPECT(nodes && out);
    CHECK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE, nodes, N * sizeof(node), 0, NULL, NULL));
    for (int i = 0; i < N; i++) {
        nodes[i].value = i + 1;
        nodes[i].next = i + 1 < N ? &nodes[i + 1] : NULL;
    }
    CHECK(clEnqueueSVMUnmap(q, nodes, 0, NULL, NULL));
    int pattern = -7;
    CHECK(clEnqueueSVMMemFill(q, out, &pattern, sizeof pattern, 2 * sizeof(int), 0, NULL, NULL));
    cl_program prog = build(ctx, d, SRC);
    cl_kernel k = clCreateKernel(prog, "walk", &err);
    CHECK(err);
    CHECK(clSetKernelArgSVMPointer(k, 0, nodes));
    CHECK(clSetKernelArgSVMPointer(k, 1, out));
    size_t g = 1;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    int host[2] = {0, 0};
    CHECK(clEnqueueSVMMemcpy(q, CL_TRUE, host, out, sizeof host, 0, NULL, NULL));
    EXPECT(host[0] == N * (N + 1) / 2);
    EXPECT(host[1] == 20);
    CHECK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_READ, out, 2 * sizeof(int), 0, NULL, NULL));
    EXPECT(out[0] == host[0]);
    CHECK(clEnqueueSVMUnmap(q, out, 0, NULL, NULL));
    CHECK(clFinish(q));
    printf("svm: list of %d nodes summed to %d OK\n", N, host[0]);
    clSVMFree(ctx, nodes);
    clSVMFree(ctx, out);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
