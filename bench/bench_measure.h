/* What Wormhole's benchmark clients (bench_client.c, cuda_bench_client.c) measure with: a
 * monotonic clock, the process's CPU time, and a sample's median and p99 as "key value"
 * lines. */
#ifndef WORMHOLE_BENCH_MEASURE_H
#define WORMHOLE_BENCH_MEASURE_H
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Prints NAME_median_us and NAME_p99_us of the `n` seconds in `v` (sorted in place). */
static void stats(const char *name, double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    printf("%s_median_us %.3f\n%s_p99_us %.3f\n", name, v[n / 2] * 1e6, name, v[(int)(n * 0.99)] * 1e6);
}
#endif
