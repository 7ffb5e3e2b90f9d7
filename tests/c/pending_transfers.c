/* Non-blocking reads and writes held back by a user event. Natively their bytes are the
 * application's own memory; through Wormhole the worker keeps them (a read's staging buffer
 * until it is collected, a write's bytes until the driver has read them), so a tenant with a
 * memory quota may keep at most that quota in transfers in flight: past it a transfer is
 * refused with CL_OUT_OF_HOST_MEMORY, before anything is enqueued. Every transfer accepted
 * brings (or takes) the right bytes, and what a round held is given back for the next.
 *
 *   pending_transfers MIB COUNT
 *
 * Prints, per round, how many of COUNT transfers of MIB MiB each were accepted and how many
 * refused with CL_OUT_OF_HOST_MEMORY (any other failure exits 1), then "ok". */
#include "common.h"
#include <string.h>

static cl_context ctx;
static cl_command_queue q;

static unsigned char pattern(size_t i, int k) { return (unsigned char)(i * 7 + k * 13 + 1); }

/* COUNT transfers of `size` bytes behind one user event: reads of `buf` (filled with pattern
 * k = 0) into fresh host memory, or writes into it, the i-th of pattern i + 1, which leave it
 * with the last accepted one's bytes. */
static void round_of(int writes, cl_mem buf, size_t size, int count) {
    cl_int err;
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    unsigned char **host = calloc(count, sizeof *host);
    int accepted = 0, refused = 0;
    for (int i = 0; i < count; i++) {
        host[i] = malloc(size);
        EXPECT(host[i] != NULL);
        cl_int st;
        if (writes) {
            for (size_t j = 0; j < size; j++) host[i][j] = pattern(j, i + 1);
            st = clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, size, host[i], 1, &gate, NULL);
        } else {
            memset(host[i], 0xEE, size);
            st = clEnqueueReadBuffer(q, buf, CL_FALSE, 0, size, host[i], 1, &gate, NULL);
        }
        if (st == CL_SUCCESS) {
            EXPECT(refused == 0); /* once refused, refused until something is given back */
            accepted++;
        } else {
            EXPECT(st == CL_OUT_OF_HOST_MEMORY);
            refused++;
        }
    }
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clFinish(q));
    EXPECT(accepted > 0);
    if (writes) {
        unsigned char *back = malloc(size);
        EXPECT(back != NULL);
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, size, back, 0, NULL, NULL));
        EXPECT(memcmp(back, host[accepted - 1], size) == 0);
        free(back);
    } else {
        for (int i = 0; i < accepted; i++) {
            for (size_t j = 0; j < size; j += 4093) EXPECT(host[i][j] == pattern(j, 0));
            EXPECT(host[i][size - 1] == pattern(size - 1, 0));
        }
    }
    for (int i = 0; i < count; i++) free(host[i]);
    free(host);
    CHECK(clReleaseEvent(gate));
    printf("%s accepted %d refused %d\n", writes ? "writes" : "reads", accepted, refused);
}

int main(int argc, char **argv) {
    EXPECT(argc == 3);
    size_t size = (size_t)atoi(argv[1]) << 20;
    int count = atoi(argv[2]);
    EXPECT(size > 0 && count > 0);
    cl_device_id dev;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_mem src = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    cl_mem dst = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err);
    unsigned char *fill = malloc(size);
    EXPECT(fill != NULL);
    for (size_t j = 0; j < size; j++) fill[j] = pattern(j, 0);
    CHECK(clEnqueueWriteBuffer(q, src, CL_TRUE, 0, size, fill, 0, NULL, NULL));
    free(fill);
    round_of(0, src, size, count);
    round_of(1, dst, size, count);
    /* What the rounds held was given back: the same again. */
    round_of(0, src, size, count);
    round_of(1, dst, size, count);
    CHECK(clReleaseMemObject(src));
    CHECK(clReleaseMemObject(dst));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("ok\n");
    return 0;
}
