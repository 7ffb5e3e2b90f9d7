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

    /* Export tables are not served: an error and a log line, never a silent success. */
    export_table_t table = (export_table_t)dlsym(lib, "cuGetExportTable");
    const unsigned char uuid[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                    0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
    const void *t = (const void *)1;
    EXPECT(table(&t, uuid) == 801 && t == NULL, "cuGetExportTable must fail");

    /* Entry points not forwarded (a graph call, a GL interop call): NOT_SUPPORTED. */
    nullary_t graph = (nullary_t)dlsym(lib, "cuGraphCreate");
    nullary_t gl = (nullary_t)dlsym(lib, "cuGLInit");
    EXPECT(graph && graph() == 801, "cuGraphCreate must be CUDA_ERROR_NOT_SUPPORTED");
    EXPECT(gl && gl() == 801, "cuGLInit must be CUDA_ERROR_NOT_SUPPORTED");

    /* Before cuInit, what needs the driver initialised is refused, as natively. */
    int before = -1;
    EXPECT(((version_t)dlsym(lib, "cuDeviceGetCount"))(&before) == 3, "cuDeviceGetCount before cuInit");

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
