/* What Wormhole's libcuda.so.1 answers without a device: the entry-point lookup cudart relies
 * on (cuGetProcAddress with CUDA versions and per-thread default streams), status names and
 * messages, export tables and entry points it does not forward (an error, never a silent
 * success), and cuInit's "no device" within a second. Loaded the way cudart loads it:
 * dlopen("libcuda.so.1"). Exit 0 when every answer is the expected one. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int (*get_proc_t)(const char *, void **, int, uint64_t, int *);
typedef int (*status_text_t)(int, const char **);
typedef int (*export_table_t)(const void **, const unsigned char *);
typedef int (*init_t)(unsigned);
typedef int (*version_t)(int *);
typedef int (*nullary_t)(void);

static int failures;
#define EXPECT(cond, ...)                                                                     \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                       \
            printf(__VA_ARGS__);                                                              \
            printf("\n");                                                                     \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("FAIL: %s\n", dlerror()); return 1; }
    EXPECT(dlsym(lib, "wormhole_cuda_client") != NULL, "this is not Wormhole's libcuda.so.1");
    get_proc_t get_proc = (get_proc_t)dlsym(lib, "cuGetProcAddress_v2");
    EXPECT(get_proc != NULL, "no cuGetProcAddress_v2");
    if (!get_proc) return 1;

    /* Versioned lookups: the ABI the caller was built for. */
    struct { const char *name; int version; uint64_t flags; const char *symbol; } cases[] = {
        {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
        {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"},
        {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
        {"cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds"},
        {"cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2"},
        {"cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *p = NULL;
        int status = -1;
        int r = get_proc(cases[i].name, &p, cases[i].version, cases[i].flags, &status);
        EXPECT(r == 0 && status == 0 && p == dlsym(lib, cases[i].symbol),
               "cuGetProcAddress(%s, %d, %lu) -> %d/%d %p, expected %s", cases[i].name,
               cases[i].version, (unsigned long)cases[i].flags, r, status, p, cases[i].symbol);
    }
    void *p = (void *)1;
    int status = -1;
    EXPECT(get_proc("cuNoSuchEntryPoint", &p, 13000, 0, &status) == 500 && p == NULL && status == 1,
           "an unknown entry point must be CUDA_ERROR_NOT_FOUND / SYMBOL_NOT_FOUND");
    EXPECT(get_proc("cuCtxCreate", &p, 1000, 0, &status) == 500 && status == 2,
           "a version older than every ABI must be VERSION_NOT_SUFFICIENT");

    /* Status names and messages, answered without a server. */
    status_text_t name = (status_text_t)dlsym(lib, "cuGetErrorName");
    status_text_t text = (status_text_t)dlsym(lib, "cuGetErrorString");
    const char *s = NULL;
    EXPECT(name(100, &s) == 0 && s && strcmp(s, "CUDA_ERROR_NO_DEVICE") == 0, "cuGetErrorName(100)");
    EXPECT(text(100, &s) == 0 && s && strcmp(s, "no CUDA-capable device is detected") == 0,
           "cuGetErrorString(100)");
    EXPECT(text(123456, &s) == 1 && s == NULL, "cuGetErrorString of no status");

    /* Export tables: those cudart and cuBLAS need are served (the first word is the size
     * callers check); any other fails with the table NULL, never a silent success. */
    export_table_t table = (export_table_t)dlsym(lib, "cuGetExportTable");
    const unsigned char cudart_id[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                         0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
    const unsigned char hooks_id[16] = {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74,
                                        0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66};
    const unsigned char checks_id[16] = {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43,
                                         0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e};
    const unsigned char integrity_id[16] = {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b,
                                            0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2};
    /* The runtimes' optional shortcut (absent: CUDA_ERROR_NOT_FOUND, quietly) and a table no
     * one asks for (CUDA_ERROR_NOT_SUPPORTED, named in the log). */
    const unsigned char shortcut_id[16] = {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                                           0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9};
    const unsigned char unknown_id[16] = {0x57, 0x48, 0x57, 0x48, 0x57, 0x48, 0x57, 0x48,
                                          0x57, 0x48, 0x57, 0x48, 0x57, 0x48, 0x57, 0x48};
    const uintptr_t *t = NULL;
    EXPECT(table((const void **)&t, cudart_id) == 0 && t && t[0] == 13 * 8,
           "CUDART_INTERFACE must be served with 13 slots");
    if (t) {
        typedef int (*slot4_t)(void);
        EXPECT(((slot4_t)t[4])() == 801, "an unknown slot must be CUDA_ERROR_NOT_SUPPORTED");
    }
    t = NULL;
    EXPECT(table((const void **)&t, hooks_id) == 0 && t && t[0] > 0x30, "the callback hooks");
    if (t) {
        typedef void (*flags_t)(uint32_t **, size_t *);
        uint32_t *flags = NULL;
        size_t n = 0;
        ((flags_t)t[2])(&flags, &n);
        int all_zero = flags != NULL;
        for (size_t i = 0; flags && i < n; i++) all_zero &= flags[i] == 0;
        EXPECT(n > 566 && all_zero, "the tracing flags: more than 566, all off (%zu)", n);
    }
    t = NULL;
    EXPECT(table((const void **)&t, checks_id) == 0 && t, "the context checks");
    if (t) {
        typedef unsigned (*flag_t)(void);
        EXPECT(((flag_t)t[3])() == 0, "the context checks' flag");
    }
    t = NULL;
    EXPECT(table((const void **)&t, integrity_id) == 0 && t && t[0] == 3 * 8, "the integrity check");
    if (t) {
        typedef int (*check_t)(unsigned, uint64_t, uint64_t *);
        uint64_t out[2] = {0, 0};
        EXPECT(((check_t)t[1])(13000, (uint64_t)time(NULL), out) == 0 && out[0] == 0x3341181C03CB675CULL,
               "the integrity check's fixed first answer");
    }
    t = (const uintptr_t *)1;
    EXPECT(table((const void **)&t, shortcut_id) == 500 && t == NULL, "the shortcut table must be absent");
    t = (const uintptr_t *)1;
    EXPECT(table((const void **)&t, unknown_id) == 801 && t == NULL, "an unknown table must fail");

    /* Entry points not forwarded (a graph call, a GL interop call): NOT_SUPPORTED. */
    nullary_t graph = (nullary_t)dlsym(lib, "cuGraphClone");
    nullary_t gl = (nullary_t)dlsym(lib, "cuGLInit");
    EXPECT(graph && graph() == 801, "cuGraphClone must be CUDA_ERROR_NOT_SUPPORTED");
    EXPECT(gl && gl() == 801, "cuGLInit must be CUDA_ERROR_NOT_SUPPORTED");

    /* Before cuInit, what needs the driver initialised is refused, as natively. */
    int before = -1;
    EXPECT(((version_t)dlsym(lib, "cuDeviceGetCount"))(&before) == 3, "cuDeviceGetCount before cuInit");
    typedef int (*with_handle_t)(void *);
    int st = ((with_handle_t)dlsym(lib, "cuStreamSynchronize"))((void *)0x1234);
    EXPECT(st == 3, "cuStreamSynchronize of a bogus stream before cuInit -> %d, expected 3", st);

    /* The driver API version, then no device, quickly. */
    int v = 0;
    EXPECT(((version_t)dlsym(lib, "cuDriverGetVersion"))(&v) == 0 && v >= 13000, "cuDriverGetVersion %d", v);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int r = ((init_t)dlsym(lib, "cuInit"))(0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    EXPECT(r == 100, "cuInit -> %d, expected CUDA_ERROR_NO_DEVICE", r);
    EXPECT(ms < 1000, "cuInit took %.0f ms", ms);
    int count = -1;
    EXPECT(((version_t)dlsym(lib, "cuDeviceGetCount"))(&count) == 3, "cuDeviceGetCount after a failed cuInit: CUDA_ERROR_NOT_INITIALIZED");

    printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
