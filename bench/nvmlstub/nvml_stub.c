/* A stand-in libnvidia-ml.so.1 for the real pynvml binding: the NVML calls gpufeed makes, answered at the
 * cost of a C function (no driver, no ioctl, no lock).
 *
 * What it is for: the daemon under `serve --simulate` talks to the strict fake NVML, a Python object; a real
 * host's daemon talks to pynvml, which marshals ctypes arguments and calls the driver's library. Loading this
 * library under the real binding gives the floor of what a real host pays per call (pynvml's Python and the
 * ctypes call, the driver's work taken as zero), so bench/simcost.py can bound the part of the simulated
 * daemon's CPU that only the simulation pays. tests/gpu/test_real_binding.py runs the backend through the real
 * binding over it: every argument and buffer crosses a real ctypes call.
 *
 * The answers are plausible, not a scenario: STUB_GPUS H100s (NVML_STUB_GPUS, default 8), GPM supported, MIG
 * off, one compute process per GPU, counters growing with CLOCK_MONOTONIC, the driver's utilisation samples
 * every 1/6 s. Layouts follow nvml.h (and pynvml's ctypes mirrors of it); nvml_stub_sizeof() lets a test compare
 * them with the binding's.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SUCCESS 0
#define ERROR_INVALID_ARGUMENT 2
#define ERROR_NOT_SUPPORTED 3
#define ERROR_NOT_FOUND 6
#define ERROR_INSUFFICIENT_SIZE 7
#define ERROR_TIMEOUT 10

#define VT_UINT 1
#define VT_ULL 3
#define MAX_GPUS 64
#define SAMPLE_PERIOD_US 166667ULL /* the driver's utilisation sample period on recent GPUs */
#define SAMPLES_KEPT 120           /* how far back the driver's buffer goes (20 s) */

typedef struct { int index; } device_t;
typedef device_t *nvmlDevice_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; }
    nvmlProcessUtilizationSample_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { int device; unsigned long long t_us; } gpm_sample_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; int nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample_t *sample1, *sample2;
    nvmlGpmMetric_t metrics[]; /* NVML_GPM_METRIC_MAX of them in the caller's struct */
} nvmlGpmMetricsGet_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId,
                 computeInstanceId; } nvmlEventData_t;
typedef struct { int unused; } event_set_t;

static device_t devices[MAX_GPUS];
static int gpu_count = 8; /* NVML_STUB_GPUS, read by nvmlInitWithFlags: not at every call */

static int gpus(void) { return gpu_count; }

static unsigned long long offset_us; /* nvml_stub_advance(): the stub's clock ahead of CLOCK_MONOTONIC */

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL + offset_us;
}

/* Move the stub's clock forward (a benchmark replays seconds of sampling without sleeping through them). */
void nvml_stub_advance(unsigned long long us) { offset_us += us; }

static int valid(nvmlDevice_t d) { return d != NULL && d >= devices && d < devices + gpus(); }

/* The layouts of the structs above, for a test to compare with the binding's ctypes mirrors: the size of a struct
 * (field NULL) or the offset of one of its fields, by the names pynvml gives them; (size_t)-1 for a name not here. */
#define FIELD(T, F) {#T, #F, offsetof(T, F)}
#define SIZE(T) {#T, NULL, sizeof(T)}
static const struct { const char *type, *field; size_t at; } layout[] = {
    SIZE(nvmlFieldValue_t), FIELD(nvmlFieldValue_t, fieldId), FIELD(nvmlFieldValue_t, scopeId),
    FIELD(nvmlFieldValue_t, timestamp), FIELD(nvmlFieldValue_t, latencyUsec), FIELD(nvmlFieldValue_t, valueType),
    FIELD(nvmlFieldValue_t, nvmlReturn), FIELD(nvmlFieldValue_t, value),
    SIZE(nvmlSample_t), FIELD(nvmlSample_t, timeStamp), FIELD(nvmlSample_t, sampleValue),
    SIZE(nvmlPciInfo_t), FIELD(nvmlPciInfo_t, busIdLegacy), FIELD(nvmlPciInfo_t, domain), FIELD(nvmlPciInfo_t, bus),
    FIELD(nvmlPciInfo_t, device), FIELD(nvmlPciInfo_t, pciDeviceId), FIELD(nvmlPciInfo_t, pciSubSystemId),
    FIELD(nvmlPciInfo_t, busId),
    SIZE(nvmlMemory_t), FIELD(nvmlMemory_t, total), FIELD(nvmlMemory_t, free), FIELD(nvmlMemory_t, used),
    SIZE(nvmlMemory_v2_t), FIELD(nvmlMemory_v2_t, version), FIELD(nvmlMemory_v2_t, total),
    FIELD(nvmlMemory_v2_t, reserved), FIELD(nvmlMemory_v2_t, free), FIELD(nvmlMemory_v2_t, used),
    SIZE(nvmlUtilization_t), FIELD(nvmlUtilization_t, gpu), FIELD(nvmlUtilization_t, memory),
    SIZE(nvmlProcessInfo_t), FIELD(nvmlProcessInfo_t, pid), FIELD(nvmlProcessInfo_t, usedGpuMemory),
    FIELD(nvmlProcessInfo_t, gpuInstanceId), FIELD(nvmlProcessInfo_t, computeInstanceId),
    SIZE(nvmlProcessUtilizationSample_t), FIELD(nvmlProcessUtilizationSample_t, pid),
    FIELD(nvmlProcessUtilizationSample_t, timeStamp), FIELD(nvmlProcessUtilizationSample_t, smUtil),
    FIELD(nvmlProcessUtilizationSample_t, memUtil), FIELD(nvmlProcessUtilizationSample_t, encUtil),
    FIELD(nvmlProcessUtilizationSample_t, decUtil),
    SIZE(nvmlGpmSupport_t), FIELD(nvmlGpmSupport_t, version), FIELD(nvmlGpmSupport_t, isSupportedDevice),
    SIZE(nvmlGpmMetric_t), FIELD(nvmlGpmMetric_t, metricId), FIELD(nvmlGpmMetric_t, nvmlReturn),
    FIELD(nvmlGpmMetric_t, value), FIELD(nvmlGpmMetric_t, metricInfo),
    FIELD(nvmlGpmMetricsGet_t, version), FIELD(nvmlGpmMetricsGet_t, numMetrics), FIELD(nvmlGpmMetricsGet_t, sample1),
    FIELD(nvmlGpmMetricsGet_t, sample2), FIELD(nvmlGpmMetricsGet_t, metrics),
    SIZE(nvmlEventData_t), FIELD(nvmlEventData_t, device), FIELD(nvmlEventData_t, eventType),
    FIELD(nvmlEventData_t, eventData), FIELD(nvmlEventData_t, gpuInstanceId), FIELD(nvmlEventData_t, computeInstanceId),
};

size_t nvml_stub_layout(const char *type, const char *field) {
    for (size_t i = 0; i < sizeof(layout) / sizeof(layout[0]); i++) {
        if (strcmp(layout[i].type, type)) continue;
        if (field == NULL ? layout[i].field == NULL : layout[i].field != NULL && !strcmp(layout[i].field, field))
            return layout[i].at;
    }
    return (size_t)-1;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *env = getenv("NVML_STUB_GPUS");
    int n = env ? atoi(env) : 8;
    gpu_count = n < 0 ? 0 : n > MAX_GPUS ? MAX_GPUS : n;
    for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    return SUCCESS;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return SUCCESS; }

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    snprintf(version, length, "550.54.15");
    return SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count) { *count = (unsigned int)gpus(); return SUCCESS; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if ((int)index >= gpus()) return ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    snprintf(uuid, length, "GPU-5f0c0000-0000-4000-8000-%012d", d->index);
    return SUCCESS;
}

int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    snprintf(name, length, "NVIDIA H100 80GB HBM3");
    return SUCCESS;
}

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->bus = 0x18 + 0x10 * (unsigned int)d->index;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    return SUCCESS;
}

int nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < size; i++) set[i] = 0;
    if (size > 0) set[0] = ~0UL; /* CPUs 0-63 */
    return SUCCESS;
}

int nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set, int scope) {
    (void)scope;
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < size; i++) set[i] = 0;
    if (size > 0) set[0] = 1UL; /* node 0 */
    return SUCCESS;
}

int nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) { (void)d; (void)node; return ERROR_NOT_SUPPORTED; }

int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *current = *pending = 0;
    return SUCCESS;
}

int nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    support->isSupportedDevice = 1;
    return SUCCESS;
}

int nvmlGpmSampleAlloc(gpm_sample_t **sample) {
    *sample = calloc(1, sizeof(gpm_sample_t));
    return *sample ? SUCCESS : ERROR_INVALID_ARGUMENT;
}

int nvmlGpmSampleFree(gpm_sample_t *sample) { free(sample); return SUCCESS; }

int nvmlGpmSampleGet(nvmlDevice_t d, gpm_sample_t *sample) {
    if (!valid(d) || sample == NULL) return ERROR_INVALID_ARGUMENT;
    sample->device = d->index;
    sample->t_us = now_us();
    return SUCCESS;
}

int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    if (mg == NULL || mg->sample1 == NULL || mg->sample2 == NULL) return ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < mg->numMetrics; i++) {
        mg->metrics[i].nvmlReturn = SUCCESS;
        mg->metrics[i].value = 60.0 + (double)(mg->metrics[i].metricId % 7);
    }
    return SUCCESS;
}

int nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    if (!valid(d) || count < 0) return ERROR_INVALID_ARGUMENT;
    unsigned long long t = now_us();
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)t;
        v->latencyUsec = 0;
        v->nvmlReturn = SUCCESS;
        v->valueType = VT_ULL;
        v->value.ullVal = 0;
        switch (v->fieldId) {
        case 197: case 198: /* PCIe TX/RX bytes, 32-bit counters at 200 MB/s */
            v->valueType = VT_UINT;
            v->value.uiVal = (unsigned int)(t * 200ULL);
            break;
        case 83: /* energy, mJ: 500 W */
            v->value.ullVal = t / 2ULL;
            break;
        case 186: /* instantaneous power, mW */
            v->valueType = VT_UINT;
            v->value.uiVal = 500000U;
            break;
        default:
            break;
        }
    }
    return SUCCESS;
}

int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    (void)type;
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *mhz = 1980;
    return SUCCESS;
}

int nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) { return nvmlDeviceGetClockInfo(d, type, mhz); }

int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *mw = 500000U;
    return SUCCESS;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *mw = 700000U;
    return SUCCESS;
}

/* The driver's buffered samples newer than last_seen, one per period, oldest first; NOT_FOUND when none. */
int nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long last_seen, int *value_type,
                         unsigned int *count, nvmlSample_t *samples) {
    (void)type;
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    unsigned long long newest = now_us() / SAMPLE_PERIOD_US * SAMPLE_PERIOD_US;
    unsigned long long first = newest - (SAMPLES_KEPT - 1) * SAMPLE_PERIOD_US;
    if (last_seen >= first) first = (last_seen / SAMPLE_PERIOD_US + 1) * SAMPLE_PERIOD_US;
    unsigned int n = first > newest ? 0 : (unsigned int)((newest - first) / SAMPLE_PERIOD_US + 1);
    *value_type = VT_UINT;
    if (n == 0) return ERROR_NOT_FOUND;
    if (samples == NULL) { *count = n; return SUCCESS; }
    if (*count < n) n = *count;
    for (unsigned int i = 0; i < n; i++) {
        samples[i].timeStamp = first + i * SAMPLE_PERIOD_US;
        samples[i].sampleValue.uiVal = 95U;
    }
    *count = n;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    u->gpu = 95;
    u->memory = 40;
    return SUCCESS;
}

int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
    (void)sensor;
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *c = 62;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    m->total = 85899345920ULL;
    m->used = 42949672960ULL;
    m->free = m->total - m->used;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    m->total = 85899345920ULL;
    m->reserved = 0;
    m->used = 42949672960ULL;
    m->free = m->total - m->used;
    return SUCCESS;
}

static int link(nvmlDevice_t d, unsigned int *out, unsigned int v) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *out = v;
    return SUCCESS;
}

int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return link(d, v, 5); }
int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return link(d, v, 16); }
int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return link(d, v, 5); }
int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return link(d, v, 16); }
int nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return link(d, v, 5); }

int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *reasons = 0;
    return SUCCESS;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}

/* One compute process per GPU (pid 20000 + index), as the driver answers: the size first, then the list. */
static int processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    if (infos == NULL || *count < 1) { *count = 1; return ERROR_INSUFFICIENT_SIZE; }
    infos[0].pid = 20000U + (unsigned int)d->index;
    infos[0].usedGpuMemory = 42949672960ULL;
    infos[0].gpuInstanceId = infos[0].computeInstanceId = 0xFFFFFFFFU;
    *count = 1;
    return SUCCESS;
}

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return processes(d, c, p);
}

int nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return processes(d, c, p);
}

int nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples, unsigned int *count,
                                    unsigned long long last_seen) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    unsigned long long t = now_us();
    if (last_seen >= t) return ERROR_NOT_FOUND;
    if (samples == NULL || *count < 1) { *count = 1; return ERROR_INSUFFICIENT_SIZE; }
    samples[0].pid = 20000U + (unsigned int)d->index;
    samples[0].timeStamp = t;
    samples[0].smUtil = 90;
    samples[0].memUtil = 40;
    samples[0].encUtil = samples[0].decUtil = 0;
    *count = 1;
    return SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) { return link(d, n, 7); }

int nvmlEventSetCreate(event_set_t **set) {
    *set = calloc(1, sizeof(event_set_t));
    return *set ? SUCCESS : ERROR_INVALID_ARGUMENT;
}

int nvmlEventSetFree(event_set_t *set) { free(set); return SUCCESS; }

int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    if (!valid(d)) return ERROR_INVALID_ARGUMENT;
    *types = 0x8ULL; /* nvmlEventTypeXidCriticalError */
    return SUCCESS;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, event_set_t *set) {
    (void)types;
    return valid(d) && set != NULL ? SUCCESS : ERROR_INVALID_ARGUMENT;
}

/* No Xid ever comes: the wait lasts its timeout, as the driver's does. */
int nvmlEventSetWait_v2(event_set_t *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)data;
    if (set == NULL) return ERROR_INVALID_ARGUMENT;
    struct timespec ts = {(time_t)(timeout_ms / 1000U), (long)(timeout_ms % 1000U) * 1000000L};
    nanosleep(&ts, NULL);
    return ERROR_TIMEOUT;
}
