/* Coarse-grained shared virtual memory: a linked list built by the host inside SVM (pointers
 * stored in SVM data) is walked by a kernel; results come back by map and by memcpy. */
#include "common.h"
#include <stdatomic.h>
#include <unistd.h>
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

/* clEnqueueSVMFree's free function: the application frees the pointers itself. */
static atomic_int freed_count;
static void *freed_first;
static void CL_CALLBACK free_them(cl_command_queue q, cl_uint n, void *ptrs[], void *ud) {
    cl_context c;
    clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof c, &c, NULL);
    freed_first = ptrs[0];
    for (cl_uint i = 0; i < n; i++) clSVMFree(c, ptrs[i]);
    atomic_store(&freed_count, (int)n + *(int *)ud);
}

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
    /* The kernel's SVM pointer set: given, cleared with (0, NULL) (was CL_INVALID_VALUE through
     * Wormhole), given with a NULL entry; then a launch still works. */
    void *set[2] = {nodes, out};
    CHECK(clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_SVM_PTRS, sizeof set, set));
    CHECK(clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_SVM_PTRS, 0, NULL));
    void *with_null[1] = {NULL};
    CHECK(clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_SVM_PTRS, sizeof with_null, with_null));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    /* A buffer over SVM larger than the allocation is refused (through Wormhole it was made
     * from the host bytes past the allocation's end: a crash when they were not mapped). */
    cl_mem over = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, 2 * 2 * sizeof(int), out, &err);
    EXPECT(over == NULL && err == CL_INVALID_BUFFER_SIZE);
    cl_mem fits = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, 2 * sizeof(int), out, &err);
    CHECK(err);
    CHECK(clReleaseMemObject(fits));
    /* A copy between two plain host buffers is still the device's command, with its event
     * (through Wormhole it was a marker, copied at once). */
    int from[4] = {1, 2, 3, 4}, to[4] = {0, 0, 0, 0};
    cl_event copied;
    CHECK(clEnqueueSVMMemcpy(q, CL_TRUE, to, from, sizeof from, 0, NULL, &copied));
    cl_command_type type = 0;
    CHECK(clGetEventInfo(copied, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    EXPECT(type == CL_COMMAND_SVM_MEMCPY && to[3] == 4);
    CHECK(clReleaseEvent(copied));
    /* A free function given to clEnqueueSVMFree runs once, with the pointers (was refused as
     * CL_INVALID_OPERATION through Wormhole). */
    void *doomed[2] = {clSVMAlloc(ctx, CL_MEM_READ_WRITE, 256, 0), clSVMAlloc(ctx, CL_MEM_READ_WRITE, 256, 0)};
    EXPECT(doomed[0] && doomed[1]);
    static int extra = 100;
    CHECK(clEnqueueSVMFree(q, 2, doomed, free_them, &extra, 0, NULL, NULL));
    CHECK(clFinish(q));
    for (int i = 0; i < 500 && !atomic_load(&freed_count); i++) usleep(10000);
    EXPECT(atomic_load(&freed_count) == 102 && freed_first == doomed[0]);
    printf("svm: list of %d nodes summed to %d OK\n", N, host[0]);
    clSVMFree(ctx, nodes);
    clSVMFree(ctx, out);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
