/* Builds again of a program whose first build the server's program cache may serve (piglit's
 * cl-api-build-program does them): each answers as natively, and the program works or fails
 * afterwards as natively. Through Wormhole the second run of this program in one server meets
 * its first build in the cache; PoCL 3.1 aborts when a program made from binaries is built
 * twice, which ended the session at the plain rebuild below before.
 *
 * Prints one line per step (the test compares the lines with native's) and checks what the
 * program then does; exits non-zero on a check that fails. With "hold" it then prints "ready"
 * and waits for a line on stdin (so the session's status can be read). */
#include "common.h"
#include <string.h>
#include <unistd.h>

static const char *SRC =
    "#warning \"wormhole-rebuild-test\"\n"
    "__kernel void fill(__global int *a) { a[get_global_id(0)] = VALUE; }\n";

#define N 16

/* Runs `fill` and returns a[0], or prints why the kernel could not be made (and returns -1). */
static int run_fill(cl_context ctx, cl_command_queue q, cl_program prog) {
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "fill", &err);
    if (err != CL_SUCCESS) {
        printf("  clCreateKernel %d\n", err);
        return -1;
    }
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    int data[N];
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL));
    for (int i = 1; i < N; i++) EXPECT(data[i] == data[0]);
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseKernel(k));
    return data[0];
}

static void status(cl_program prog, cl_device_id dev) {
    cl_build_status st;
    CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_STATUS, sizeof st, &st, NULL));
    char options[256];
    CHECK(clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_OPTIONS, sizeof options, options, NULL));
    printf("  status %d, options '%s'\n", st, options);
}

static void step(const char *what, cl_int st) {
    printf("%s: %d\n", what, st);
    fflush(stdout);
}

static void CL_CALLBACK count_notify(cl_program prog, void *user) {
    (void)prog;
    __atomic_add_fetch((int *)user, 1, __ATOMIC_SEQ_CST);
}

/* How many times the build callback ran (waiting up to 5 s for the first: through Wormhole it
 * comes on the callback thread). */
static int notified(int *count) {
    for (int i = 0; i < 500 && __atomic_load_n(count, __ATOMIC_SEQ_CST) == 0; i++) usleep(10000);
    return __atomic_load_n(count, __ATOMIC_SEQ_CST);
}

/* A build (or compile) while a kernel the application released still waits in a queue
 * behind a user event: natively the kernel holds the program, so the build is refused; then
 * the kernel runs with what the program was. Through Wormhole the program the cache served
 * was given away under that kernel before. */
static void build_under_a_pending_kernel(cl_context ctx, cl_command_queue q, cl_program prog,
                                         cl_device_id dev, int compile) {
    cl_int err;
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK(err);
    cl_kernel k = clCreateKernel(prog, "fill", &err);
    CHECK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 1, &gate, NULL));
    CHECK(clReleaseKernel(k));
    int count = 0;
    if (compile) {
        step("compiled under a pending kernel",
             clCompileProgram(prog, 1, &dev, "-DVALUE=6", 0, NULL, NULL, count_notify, &count));
    } else {
        step("built under a pending kernel",
             clBuildProgram(prog, 1, &dev, "-DVALUE=6", count_notify, &count));
    }
    printf("  notified %d\n", notified(&count));
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    int data[N];
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL));
    printf("  the pending kernel wrote %d\n", data[0]);
    CHECK(clReleaseMemObject(buf));
    CHECK(clReleaseEvent(gate));
}

int main(int argc, char **argv) {
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    open_queue(&dev, &ctx, &q);
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);

    step("build", clBuildProgram(p, 1, &dev, "-DVALUE=1", NULL, NULL));
    printf("  runs %d\n", run_fill(ctx, q, p));
    build_under_a_pending_kernel(ctx, q, p, dev, 0);
    status(p, dev);
    printf("  runs %d\n", run_fill(ctx, q, p));
    step("the same build again", clBuildProgram(p, 1, &dev, "-DVALUE=1", NULL, NULL));
    status(p, dev);
    printf("  runs %d\n", run_fill(ctx, q, p));

    /* Refused for its arguments: the program stays built. */
    step("no device list, one device", clBuildProgram(p, 1, NULL, "-DVALUE=2", NULL, NULL));
    step("a device list, no devices", clBuildProgram(p, 0, &dev, "-DVALUE=2", NULL, NULL));
    int user = 0;
    step("user data, no callback", clBuildProgram(p, 1, &dev, "-DVALUE=2", NULL, &user));
    cl_kernel k = clCreateKernel(p, "fill", &err);
    CHECK(err);
    step("a kernel attached", clBuildProgram(p, 1, &dev, "-DVALUE=2", NULL, NULL));
    CHECK(clReleaseKernel(k));
    status(p, dev);
    printf("  runs %d\n", run_fill(ctx, q, p));

    /* Other options: built anew. */
    step("other options", clBuildProgram(p, 1, &dev, "-DVALUE=3", NULL, NULL));
    status(p, dev);
    printf("  runs %d\n", run_fill(ctx, q, p));

    /* Options the compiler refuses, and a build that fails to compile: no program after. */
    step("invalid options", clBuildProgram(p, 1, &dev, "-invalid- --options", NULL, NULL));
    cl_build_status st;
    CHECK(clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_STATUS, sizeof st, &st, NULL));
    printf("  status %d\n", st);
    printf("  runs %d\n", run_fill(ctx, q, p));
    step("a build that fails", clBuildProgram(p, 1, &dev, "", NULL, NULL));
    char log[16384];
    CHECK(clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
    printf("  log names VALUE: %s\n", strstr(log, "VALUE") ? "yes" : "no");
    printf("  runs %d\n", run_fill(ctx, q, p));

    /* And built again after all that. */
    step("built again", clBuildProgram(p, 1, &dev, "-DVALUE=1", NULL, NULL));
    status(p, dev);
    printf("  runs %d\n", run_fill(ctx, q, p));

    /* A second program of the same source: its build may be served, then compiled again as
     * a compile-only step (clCompileProgram recompiles a built source program natively). */
    cl_program p2 = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK(err);
    step("second program", clBuildProgram(p2, 1, &dev, "-DVALUE=1", NULL, NULL));
    build_under_a_pending_kernel(ctx, q, p2, dev, 1);
    step("compiled", clCompileProgram(p2, 1, &dev, "-DVALUE=4", 0, NULL, NULL, NULL, NULL));
    CHECK(clGetProgramBuildInfo(p2, dev, CL_PROGRAM_BUILD_STATUS, sizeof st, &st, NULL));
    cl_program_binary_type bt;
    CHECK(clGetProgramBuildInfo(p2, dev, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
    printf("  status %d, binary type %u\n", st, bt);
    step("then built", clBuildProgram(p2, 1, &dev, "-DVALUE=5", NULL, NULL));
    printf("  runs %d\n", run_fill(ctx, q, p2));

    CHECK(clReleaseProgram(p2));
    CHECK(clReleaseProgram(p));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    printf("done\n");
    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 0;
    }
    return 0;
}
