/* Commands of a kernel with a required work-group size keep running while the server's
 * program cache would store their program (after 50 ms without a request, as during a
 * clFinish). On PoCL before 7.0, asking a program for its binaries makes a code entry of the
 * same build hash and work-group size, and a finishing command may give back that entry
 * instead of its own: the driver aborts (the worker, and so the session, with it). Such a
 * program must not be asked for its binaries; the application sees its commands finish.
 *
 * Prints "ok" after about TOTAL_MS of kernel work, each command checked; with "hold" it
 * then waits for a line on stdin. */
#include "common.h"
#include <string.h>
#include <time.h>

/* The same loop twice: without an attribute (timed, to size the commands) and with one. */
#define LOOP                                                                     \
    "void spin(__global uint *out, uint n, uint base) {\n"                      \
    "    uint x = base + get_global_id(0) + 1;\n"                                \
    "    for (uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;\n"        \
    "    out[base + get_global_id(0)] = x;\n"                                   \
    "}\n"
static const char *PLAIN = "__kernel " LOOP;
static const char *REQUIRED = "__kernel __attribute__((reqd_work_group_size(1, 1, 1)))\n" LOOP;

#define COMMANDS 20
#define TOTAL_MS 4000.0

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static cl_uint expected(cl_uint x, cl_uint n) {
    for (cl_uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;
    return x;
}

/* Enqueues `spin` for `groups` work-groups of one item each, from `base`. */
static void launch(cl_command_queue q, cl_kernel k, cl_uint n, cl_uint base, size_t groups) {
    size_t one = 1;
    CHECK(clSetKernelArg(k, 1, sizeof n, &n));
    CHECK(clSetKernelArg(k, 2, sizeof base, &base));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &groups, &one, 0, NULL, NULL));
}

int main(int argc, char **argv) {
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, COMMANDS * 2 * sizeof(cl_uint), NULL, &err);
    CHECK(err);

    /* How many steps make a command of TOTAL_MS / COMMANDS on this machine (timed once the
     * kernel's code is made: the first command waits for it). */
    cl_program plain = build(ctx, dev, PLAIN);
    cl_kernel k = clCreateKernel(plain, "spin", &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    launch(q, k, 1, 0, 1);
    CHECK(clFinish(q));
    cl_uint n = 1u << 24;
    double t0 = now_ms();
    launch(q, k, n, 0, 1);
    CHECK(clFinish(q));
    double per_step = (now_ms() - t0) / n;
    double steps = TOTAL_MS / COMMANDS / (per_step > 0 ? per_step : 1e-6);
    n = steps > 4e9 ? 4000000000u : steps < 1 ? 1 : (cl_uint)steps;
    CHECK(clReleaseKernel(k));

    /* Built, then at once two work-groups per command (one per PoCL thread here), all
     * enqueued before one wait: the session's first quiet moment comes while they run, and
     * the store (a build of about a second) is done before they are. */
    cl_program required = build(ctx, dev, REQUIRED);
    k = clCreateKernel(required, "spin", &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    for (cl_uint base = 0; base < 2 * COMMANDS; base += 2) launch(q, k, n, base, 2);
    CHECK(clFinish(q));
    cl_uint got[COMMANDS * 2];
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
    for (cl_uint i = 0; i < COMMANDS * 2; i++) EXPECT(got[i] == expected(i + 1, n));

    CHECK(clReleaseMemObject(out));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseProgram(plain));
    CHECK(clReleaseProgram(required));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("ok\n");
    fflush(stdout);
    /* With "hold": the session stays until a line or the end of stdin (its status can be
     * read meanwhile). */
    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        char line[16];
        if (fgets(line, sizeof line, stdin) == NULL) line[0] = 0;
    }
    return 0;
}
