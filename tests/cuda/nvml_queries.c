/* What a tenant learns from NVML (libnvidia-ml.so.1), loaded the way bindings and frameworks
 * load it: dlopen. On standard output, what a tenant of the forwarded GPU should see as a
 * program on the GPU's machine does (the GPU test compares the two); on standard error, what
 * may differ (readings that change by the second, what Wormhole does not forward).
 *
 * Without a GPU (through Wormhole against a server without NVIDIA's driver) it checks NVML's
 * rules that hold with no device: the status texts, NVML_ERROR_UNINITIALIZED before nvmlInit
 * and after the last nvmlShutdown, and nvmlInit's "driver not loaded" within a second.
 * Exit: 0 every answer as expected, 2 no NVML driver (after those checks), 1 a failure. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef void *device_t;
typedef int (*nullary_t)(void);
typedef const char *(*error_string_t)(int);
typedef int (*count_t)(unsigned *);
typedef int (*by_index_t)(unsigned, device_t *);
typedef int (*by_string_t)(const char *, device_t *);
typedef int (*text_t)(device_t, char *, unsigned);
typedef int (*sys_text_t)(char *, unsigned);
typedef int (*u32_t)(device_t, unsigned *);
typedef int (*two_ints_t)(device_t, int *, int *);
typedef int (*bytes_t)(device_t, void *);
typedef int (*int_out_t)(int *);
typedef int (*processes_t)(device_t, unsigned *, void *);

struct memory { unsigned long long total, free, used; };
struct memory_v2 { unsigned version; unsigned long long total, reserved, free, used; };
struct pci { char bus_id_legacy[16]; unsigned domain, bus, device, pci_device_id, pci_subsystem_id; char bus_id[32]; };
struct utilization { unsigned gpu, memory; };

static void *lib;
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

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p != NULL, "libnvidia-ml.so.1 lacks %s", name);
    return p;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { printf("no NVML: %s\n", dlerror()); return 2; }
    fprintf(stderr, "Wormhole's NVML: %s\n", dlsym(lib, "wormhole_nvml_client") ? "yes" : "no");
    error_string_t error_string = (error_string_t)sym("nvmlErrorString");
    nullary_t init = (nullary_t)sym("nvmlInit_v2"), shutdown = (nullary_t)sym("nvmlShutdown");
    count_t count = (count_t)sym("nvmlDeviceGetCount_v2");
    if (failures) return 1;

    /* The rules that hold with no device. */
    EXPECT(strcmp(error_string(0), "Success") == 0, "nvmlErrorString(0) = %s", error_string(0));
    EXPECT(strcmp(error_string(9), "Driver Not Loaded") == 0, "nvmlErrorString(9) = %s", error_string(9));
    unsigned n = 12345;
    int r = count(&n);
    EXPECT(r == 1 && n == 12345, "nvmlDeviceGetCount_v2 before nvmlInit -> %d (expected 1, Uninitialized)", r);
    r = shutdown();
    EXPECT(r == 1, "nvmlShutdown before nvmlInit -> %d (expected 1, Uninitialized)", r);
    char early[8];
    r = ((text_t)sym("nvmlDeviceGetName"))((device_t)0x1234, early, sizeof early);
    EXPECT(r == 1, "nvmlDeviceGetName of a bogus device before nvmlInit -> %d (expected 1, Uninitialized)", r);

    double t0 = now_ms();
    r = init();
    double took = now_ms() - t0;
    fprintf(stderr, "nvmlInit_v2: %.1f ms\n", took);
    if (r != 0) {
        printf("nvmlInit_v2 -> %d %s\n", r, error_string(r));
        EXPECT(took < 1000, "nvmlInit_v2 took %.0f ms to fail", took);
        return failures ? 1 : 2;
    }

    char text[256];
    r = ((sys_text_t)sym("nvmlSystemGetDriverVersion"))(text, sizeof text);
    printf("driver version -> %d %s\n", r, r ? "" : text);
    int cuda = 0;
    r = ((int_out_t)sym("nvmlSystemGetCudaDriverVersion_v2"))(&cuda);
    printf("CUDA driver version -> %d %d\n", r, cuda);
    r = count(&n);
    printf("devices -> %d %u\n", r, n);
    for (unsigned i = 0; r == 0 && i < n; i++) {
        device_t d = NULL;
        int s = ((by_index_t)sym("nvmlDeviceGetHandleByIndex_v2"))(i, &d);
        printf("device %u -> %d\n", i, s);
        if (s) continue;
        device_t again = NULL;
        ((by_index_t)sym("nvmlDeviceGetHandleByIndex_v2"))(i, &again);
        EXPECT(again == d, "device %u: a second lookup gave another handle", i);
        s = ((text_t)sym("nvmlDeviceGetName"))(d, text, sizeof text);
        printf("  name -> %d %s\n", s, s ? "" : text);
        char uuid[96];
        s = ((text_t)sym("nvmlDeviceGetUUID"))(d, uuid, sizeof uuid);
        printf("  uuid -> %d %s\n", s, s ? "" : uuid);
        device_t by_uuid = NULL;
        s = ((by_string_t)sym("nvmlDeviceGetHandleByUUID"))(uuid, &by_uuid);
        EXPECT(s == 0 && by_uuid == d, "device %u: by UUID -> %d, another handle", i, s);
        s = ((text_t)sym("nvmlDeviceGetName"))(d, text, 2);
        printf("  name in 2 bytes -> %d\n", s);
        unsigned index = 99;
        s = ((u32_t)sym("nvmlDeviceGetIndex"))(d, &index);
        printf("  index -> %d %u\n", s, index);
        int major = 0, minor = 0;
        s = ((two_ints_t)sym("nvmlDeviceGetCudaComputeCapability"))(d, &major, &minor);
        printf("  compute capability -> %d %d.%d\n", s, major, minor);
        struct pci pci;
        s = ((bytes_t)sym("nvmlDeviceGetPciInfo_v3"))(d, &pci);
        printf("  pci -> %d %s %04x\n", s, s ? "" : pci.bus_id, s ? 0 : pci.pci_device_id >> 16);
        device_t by_pci = NULL;
        s = ((by_string_t)sym("nvmlDeviceGetHandleByPciBusId_v2"))(pci.bus_id, &by_pci);
        EXPECT(s == 0 && by_pci == d, "device %u: by PCI bus id -> %d, another handle", i, s);
        /* The unversioned lookups NCCL makes by name, and lookups with nowhere to answer. */
        device_t v1 = NULL, v1_pci = NULL;
        unsigned v1_count = 0;
        printf("  v1: count -> %d, by index -> %d, by PCI bus id -> %d",
               ((count_t)sym("nvmlDeviceGetCount"))(&v1_count),
               ((by_index_t)sym("nvmlDeviceGetHandleByIndex"))(i, &v1),
               ((by_string_t)sym("nvmlDeviceGetHandleByPciBusId"))(pci.bus_id, &v1_pci));
        printf(", the same device %s\n", v1 == d && v1_pci == d ? "yes" : "no");
        printf("  lookups into NULL: by UUID -> %d, by PCI bus id -> %d, memory -> %d\n",
               ((by_string_t)sym("nvmlDeviceGetHandleByUUID"))(uuid, NULL),
               ((by_string_t)sym("nvmlDeviceGetHandleByPciBusId_v2"))(pci.bus_id, NULL),
               ((bytes_t)sym("nvmlDeviceGetMemoryInfo"))(d, NULL));
        struct memory m;
        s = ((bytes_t)sym("nvmlDeviceGetMemoryInfo"))(d, &m);
        printf("  memory -> %d total %llu\n", s, m.total);
        EXPECT(s || m.free <= m.total, "device %u: free %llu of %llu", i, m.free, m.total);
        fprintf(stderr, "  memory free %llu used %llu\n", m.free, m.used);
        struct memory_v2 m2 = {.version = 40 | 2 << 24};
        s = ((bytes_t)sym("nvmlDeviceGetMemoryInfo_v2"))(d, &m2);
        printf("  memory v2 -> %d total %llu\n", s, m2.total);
        EXPECT(s || m2.free + m2.used + m2.reserved == m2.total, "device %u: v2 parts do not add up", i);
        m2.version = 1;
        s = ((bytes_t)sym("nvmlDeviceGetMemoryInfo_v2"))(d, &m2);
        printf("  memory v2 of version 1 -> %d\n", s);
        struct utilization u;
        s = ((bytes_t)sym("nvmlDeviceGetUtilizationRates"))(d, &u);
        printf("  utilization -> %d\n", s);
        fprintf(stderr, "  utilization gpu %u%% memory %u%%\n", u.gpu, u.memory);
        unsigned count_p = 0;
        s = ((processes_t)sym("nvmlDeviceGetComputeRunningProcesses_v3"))(d, &count_p, NULL);
        fprintf(stderr, "  running processes -> %d %u\n", s, count_p);
    }
    /* A handle the program made up is refused, not followed (Wormhole's promise: NVIDIA's
     * library may follow it). */
    if (dlsym(lib, "wormhole_nvml_client")) {
        char fake[64] = {0};
        r = ((text_t)sym("nvmlDeviceGetName"))((device_t)fake, text, sizeof text);
        EXPECT(r == 2, "a made-up device -> %d (expected 2, Invalid Argument)", r);
    }

    r = shutdown();
    printf("shutdown -> %d\n", r);
    r = count(&n);
    printf("devices after shutdown -> %d\n", r);
    return failures ? 1 : 0;
}
