/* A stand-in libnvidia-ml.so.1 for the GPU-state tests (tests/fakenvml.py builds it).
 *
 * The real function names, argument lists and struct layouts of nvml.h (the ones
 * ebpf_cuda/gpu/nvml.py calls); the values come from a script file named by FAKENVML_SCRIPT,
 * one statement a line, `key=value` words after the first:
 *
 *   dev INDEX name=NAME uuid=UUID gpu=PCT mem=PCT total=BYTES used=BYTES power=MW temp=C
 *       sm_clock=MHZ mem_clock=MHZ reasons=MASK pcie_tx=KBS pcie_rx=KBS ecc_sbe=N ecc_dbe=N
 *       gpm=0|1 gr_active=PCT sm_active=PCT occupancy=PCT tensor=PCT dram=PCT mig=0|1
 *       nvlink_tx=KBS nvlink_rx=KBS   (NVLink's data rates over all links, as NVML's counters
 *       of KiB grow at them; a device without these words has no NVLink. Rates in
 *       thousands, so that the counters, read at whole milliseconds, stay exact)
 *   proc DEV comm=COMM mem=BYTES sm=PCT memutil=PCT   (every process whose comm is COMM:
 *       NVML lists the processes that hold the GPU; the stand-in, those with that name)
 *   xid DEV after_ms=MS code=N                         (an Xid event MS after nvmlInit)
 *   xid DEV when_file=PATH code=N                      (... once PATH exists)
 *   unsupported NAME                                   (NAME returns NVML_ERROR_NOT_SUPPORTED)
 *   block NAME                                         (NAME never returns: a hung driver)
 *   block_when_file NAME PATH                          (... once PATH exists)
 *   fail_init 1                                        (nvmlInit_v2 returns DRIVER_NOT_LOADED)
 *
 * FAKENVML_DELAY_US=N (read at nvmlInit_v2): every call but the event set's sleeps N µs first
 * (a slow driver). `fakenvml_calls` (exported) counts the calls made, the event set's left out
 * (nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes, nvmlDeviceRegisterEvents,
 * nvmlEventSetWait_v2: the event thread's, which waits all along): a test reads it through
 * ctypes to see whether something called NVML.
 *
 * Built with -DOMIT_PROCESS_UTILIZATION or -DOMIT_GPM, those functions are not exported (an
 * older driver's library).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10

#define MAX_DEV 8
#define MAX_PROC 16
#define MAX_XID 16
#define MAX_NAMES 16

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid; unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
struct dev;
typedef struct dev *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device; unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct gpm_sample { struct dev *dev; long stamp; } *nvmlGpmSample_t;
typedef struct {
    unsigned int version, numMetrics; nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[1];  /* (NVML_GPM_METRIC_MAX in nvml.h: the caller's size) */
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    signed long long sllVal; signed int siVal; unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId; long long timestamp, latencyUsec;
    unsigned int valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value;
} nvmlFieldValue_t;

struct dev {
    int present;
    char name[96], uuid[96];
    unsigned int gpu, mem, power, temp, sm_clock, mem_clock, pcie_tx, pcie_rx, gpm, mig;
    unsigned long long total, used, reasons, ecc_sbe, ecc_dbe;
    double gr_active, sm_active, occupancy, tensor, dram;
    int nvlink; unsigned long long nvlink_tx, nvlink_rx;
};
struct proc { int dev; char comm[64]; unsigned long long mem; unsigned int sm, memutil; };
struct xid { int dev; long after_ms; unsigned long long code; int fired; char file[256]; };

static struct dev devs[MAX_DEV], migs[MAX_DEV];  /* migs[i]: device i's MIG device */
static struct proc procs[MAX_PROC];
static struct xid xids[MAX_XID];
static int ndev, nproc, nxid, nunsup, nblock, fail_init;
static char unsupported[MAX_NAMES][64], blocking[MAX_NAMES][64], block_file[MAX_NAMES][256];
static struct timespec started;
static useconds_t delay_us;
unsigned long fakenvml_calls;
static long long started_wall_us;

static long since_init_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - started.tv_sec) * 1000 + (now.tv_nsec - started.tv_nsec) / 1000000;
}

static const char *value_of(const char *line, const char *key) {
    char pattern[40];
    snprintf(pattern, sizeof pattern, " %s=", key);
    const char *at = strstr(line, pattern);
    return at ? at + strlen(pattern) : NULL;
}

static unsigned long long num(const char *line, const char *key) {
    const char *at = value_of(line, key);
    return at ? strtoull(at, NULL, 0) : 0;
}

static void word(const char *line, const char *key, char *out, size_t size) {
    const char *at = value_of(line, key);
    size_t n = 0;
    while (at && at[n] && at[n] != ' ' && at[n] != '\n' && n + 1 < size) {
        out[n] = at[n];
        n++;
    }
    out[n] = 0;
}

static void parse_dev(const char *line, int i) {
    if (i < 0 || i >= MAX_DEV) return;
    struct dev *d = &devs[i];
    d->present = 1;
    word(line, "name", d->name, sizeof d->name);
    word(line, "uuid", d->uuid, sizeof d->uuid);
    d->gpu = num(line, "gpu"); d->mem = num(line, "mem"); d->total = num(line, "total");
    d->used = num(line, "used"); d->power = num(line, "power"); d->temp = num(line, "temp");
    d->sm_clock = num(line, "sm_clock"); d->mem_clock = num(line, "mem_clock");
    d->reasons = num(line, "reasons"); d->pcie_tx = num(line, "pcie_tx");
    d->pcie_rx = num(line, "pcie_rx"); d->ecc_sbe = num(line, "ecc_sbe");
    d->ecc_dbe = num(line, "ecc_dbe"); d->gpm = num(line, "gpm"); d->mig = num(line, "mig");
    d->gr_active = num(line, "gr_active"); d->sm_active = num(line, "sm_active"); d->occupancy = num(line, "occupancy");
    d->tensor = num(line, "tensor"); d->dram = num(line, "dram");
    d->nvlink = value_of(line, "nvlink_tx") != NULL;
    d->nvlink_tx = num(line, "nvlink_tx"); d->nvlink_rx = num(line, "nvlink_rx");
    if (d->mig) {  /* one MIG device (GPU instance 1) in the first of two slots */
        migs[i] = *d;
        snprintf(migs[i].name, sizeof migs[i].name, "%s-MIG-1g.10gb", d->name);
        snprintf(migs[i].uuid, sizeof migs[i].uuid, "MIG-%s", d->uuid);
    }
    if (i + 1 > ndev) ndev = i + 1;
}

static void parse_line(const char *line) {
    char what[32], name[64];
    int index = 0;
    if (sscanf(line, "%31s", what) != 1) return;
    if (!strcmp(what, "dev") && sscanf(line, "%*s %d", &index) == 1) {
        parse_dev(line, index);
    } else if (!strcmp(what, "proc") && nproc < MAX_PROC && sscanf(line, "%*s %d", &index) == 1) {
        struct proc *p = &procs[nproc++];
        p->dev = index;
        word(line, "comm", p->comm, sizeof p->comm);
        p->mem = num(line, "mem"); p->sm = num(line, "sm"); p->memutil = num(line, "memutil");
    } else if (!strcmp(what, "xid") && nxid < MAX_XID && sscanf(line, "%*s %d", &index) == 1) {
        struct xid *x = &xids[nxid++];
        x->dev = index; x->after_ms = num(line, "after_ms"); x->code = num(line, "code");
        word(line, "when_file", x->file, sizeof x->file);
    } else if (!strcmp(what, "unsupported") && nunsup < MAX_NAMES
               && sscanf(line, "%*s %63s", name) == 1) {
        strcpy(unsupported[nunsup++], name);
    } else if (!strcmp(what, "block") && nblock < MAX_NAMES
               && sscanf(line, "%*s %63s", name) == 1) {
        block_file[nblock][0] = 0;
        strcpy(blocking[nblock++], name);
    } else if (!strcmp(what, "block_when_file") && nblock < MAX_NAMES
               && sscanf(line, "%*s %63s %255s", name, block_file[nblock]) == 2) {
        strcpy(blocking[nblock++], name);
    } else if (!strcmp(what, "fail_init")) {
        fail_init = 1;
    }
}

static void load_script(void) {
    const char *path = getenv("FAKENVML_SCRIPT");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[1024];
    ndev = nproc = nxid = nunsup = nblock = fail_init = 0;
    memset(devs, 0, sizeof devs);
    memset(migs, 0, sizeof migs);
    while (f && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n && line[n - 1] == '\n') line[n - 1] = 0;
        strcat(line, " ");
        parse_line(line);
    }
    if (f) fclose(f);
    const char *delay = getenv("FAKENVML_DELAY_US");
    delay_us = delay ? (useconds_t)strtoul(delay, NULL, 10) : 0;
}

static int is_event_call(const char *fn) {
    return !strncmp(fn, "nvmlEventSet", 12) || !strcmp(fn, "nvmlDeviceGetSupportedEventTypes")
           || !strcmp(fn, "nvmlDeviceRegisterEvents");
}

/* Each entry point first: NOT_SUPPORTED when the script says so, forever when it blocks. */
static int gate(const char *fn) {
    if (!is_event_call(fn)) {
        __atomic_fetch_add(&fakenvml_calls, 1, __ATOMIC_RELAXED);
        if (delay_us) usleep(delay_us);
    }
    for (int i = 0; i < nblock; i++)
        if (!strcmp(blocking[i], fn) && (!block_file[i][0] || access(block_file[i], F_OK) == 0))
            for (;;) pause();
    for (int i = 0; i < nunsup; i++)
        if (!strcmp(unsupported[i], fn)) return 1;
    return 0;
}
#define GATE() do { if (gate(__func__)) return NVML_ERROR_NOT_SUPPORTED; } while (0)
#define DEV(h) do { if (!(h) || (h) < devs || (h) >= devs + ndev) \
                        return NVML_ERROR_INVALID_ARGUMENT; } while (0)

nvmlReturn_t nvmlInit_v2(void) {
    load_script();
    clock_gettime(CLOCK_MONOTONIC, &started);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    started_wall_us = wall.tv_sec * 1000000LL + wall.tv_nsec / 1000;
    for (int i = 0; i < nxid; i++) xids[i].fired = 0;
    GATE();
    return fail_init ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { GATE(); *count = ndev; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    GATE();
    if (i >= (unsigned)ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *h = &devs[i];
    return 0;
}
#define DEV_OR_MIG(h) do { if (!((h) >= migs && (h) < migs + ndev && (h)->mig)) DEV(h); } \
                           while (0)
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int len) {
    GATE(); DEV_OR_MIG(h); snprintf(name, len, "%s", h->name); return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int len) {
    GATE(); DEV_OR_MIG(h); snprintf(uuid, len, "%s", h->uuid); return 0;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned int *count) {
    GATE(); DEV(h); *count = h->mig ? 2 : 0; return 0;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int i,
                                                 nvmlDevice_t *mig) {
    GATE(); DEV(h);
    if (!h->mig || i >= 2) return NVML_ERROR_INVALID_ARGUMENT;
    if (i == 1) return 6;  /* NVML_ERROR_NOT_FOUND: an empty slot */
    *mig = &migs[h - devs];
    return 0;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t h, unsigned int *id) {
    GATE(); DEV_OR_MIG(h); *id = 1; return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    GATE(); DEV(h); u->gpu = h->gpu; u->memory = h->mem; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    GATE(); DEV(h); m->total = h->total; m->used = h->used; m->free = h->total - h->used;
    return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) {
    GATE(); DEV(h); *mw = h->power; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *t) {
    GATE(); DEV(h); if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; *t = h->temp; return 0;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    GATE(); DEV(h);
    if (type == 1) *mhz = h->sm_clock;
    else if (type == 2) *mhz = h->mem_clock;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return 0;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *r) {
    GATE(); DEV(h); *r = h->reasons; return 0;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, int counter, unsigned int *kbs) {
    GATE(); DEV(h);
    if (counter == 0) *kbs = h->pcie_tx;
    else if (counter == 1) *kbs = h->pcie_rx;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int type, int counter,
                                         unsigned long long *n) {
    GATE(); DEV(h);
    if (counter != 0) return NVML_ERROR_INVALID_ARGUMENT;  /* volatile, as the sampler asks */
    *n = type == 0 ? h->ecc_sbe : h->ecc_dbe;
    return 0;
}
/* NVLink's data counters (fields 138, 139), all links summed (scope UINT_MAX; a single link's
 * scope is refused, so that a caller asking for link 0 alone is caught): KiB since a start of
 * 1 GiB, growing at the scripted rates, stamped at whole milliseconds since nvmlInit. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int count, nvmlFieldValue_t *values) {
    GATE(); DEV(h);
    long ms = since_init_ms();
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        unsigned long long rate = v->fieldId == 138 ? h->nvlink_tx : h->nvlink_rx;
        v->timestamp = started_wall_us + ms * 1000LL; v->latencyUsec = 0;
        v->valueType = 3;  /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
        if (!h->nvlink || (v->fieldId != 138 && v->fieldId != 139))
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else if (v->scopeId != 0xFFFFFFFFu)
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        else {
            v->nvmlReturn = NVML_SUCCESS;
            v->value.ullVal = (1ULL << 20) + rate * (unsigned long long)ms / 1000;
        }
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending) {
    GATE(); DEV(h); *current = *pending = h->mig; return 0;
}

static int proc_pids(const struct proc *p, unsigned int *out, int max) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) && n < max) {
        char path[300], comm[64] = "";
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/comm", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        if (!strcmp(comm, p->comm)) out[n++] = pid;
    }
    if (d) closedir(d);
    return n;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    GATE(); DEV(h);
    unsigned int n = 0, pids[64];
    nvmlProcessInfo_t found[64];
    for (int i = 0; i < nproc; i++) {
        if (&devs[procs[i].dev] != h) continue;
        int k = proc_pids(&procs[i], pids, 64);
        for (int j = 0; j < k && n < 64; j++, n++) {
            found[n].pid = pids[j]; found[n].usedGpuMemory = procs[i].mem;
            found[n].gpuInstanceId = h->mig ? 1 : 0xFFFFFFFF;
            found[n].computeInstanceId = h->mig ? 0 : 0xFFFFFFFF;
        }
    }
    if (!infos || *count < n) { *count = n; return n ? NVML_ERROR_INSUFFICIENT_SIZE : 0; }
    memcpy(infos, found, n * sizeof *infos);
    *count = n;
    return 0;
}

#ifndef OMIT_PROCESS_UTILIZATION
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long last) {
    GATE(); DEV(h);
    unsigned int n = 0, pids[64];
    nvmlProcessUtilizationSample_t found[64];
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    unsigned long long now_us = wall.tv_sec * 1000000ULL + wall.tv_nsec / 1000;
    (void)last;
    for (int i = 0; i < nproc; i++) {
        if (&devs[procs[i].dev] != h) continue;
        int k = proc_pids(&procs[i], pids, 64);
        for (int j = 0; j < k && n < 64; j++, n++) {
            memset(&found[n], 0, sizeof found[n]);
            found[n].pid = pids[j]; found[n].timeStamp = now_us;
            found[n].smUtil = procs[i].sm; found[n].memUtil = procs[i].memutil;
        }
    }
    if (!samples) { *count = n ? n : 1; return NVML_ERROR_INSUFFICIENT_SIZE; }
    if (*count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    memcpy(samples, found, n * sizeof *samples);
    *count = n;
    return 0;
}
#endif

#ifndef OMIT_GPM
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t h, nvmlGpmSupport_t *s) {
    GATE(); DEV(h); s->isSupportedDevice = h->gpm; return 0;
}
nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    GATE(); *s = calloc(1, sizeof **s); return *s ? 0 : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) { free(s); return 0; }
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t h, nvmlGpmSample_t s) {
    GATE(); DEV(h);
    if (!h->gpm) return NVML_ERROR_NOT_SUPPORTED;
    s->dev = h; s->stamp = since_init_ms();
    return 0;
}
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    GATE();
    if (m->version != 1 || !m->sample1 || !m->sample2 || !m->sample1->dev
        || m->sample1->dev != m->sample2->dev)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct dev *d = m->sample1->dev;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        x->nvmlReturn = 0;
        switch (x->metricId) {
        case 1: x->value = d->gr_active; break;    /* NVML_GPM_METRIC_GRAPHICS_UTIL */
        case 2: x->value = d->sm_active; break;    /* NVML_GPM_METRIC_SM_UTIL */
        case 3: x->value = d->occupancy; break;    /* NVML_GPM_METRIC_SM_OCCUPANCY */
        case 5: x->value = d->tensor; break;       /* NVML_GPM_METRIC_ANY_TENSOR_UTIL */
        case 10: x->value = d->dram; break;        /* NVML_GPM_METRIC_DRAM_BW_UTIL */
        default: x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return 0;
}
#endif

/* Events: the scripted Xids, each once, when its time has come. */
typedef struct { unsigned long long mask[MAX_DEV]; } *nvmlEventSet_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    GATE(); *set = calloc(1, sizeof **set); return 0;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { free(set); return 0; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types) {
    GATE(); DEV(h); *types = 0x8 | 0x1 | 0x2; return 0;  /* Xid, ECC single and double */
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types,
                                      nvmlEventSet_t set) {
    GATE(); DEV(h); set->mask[h - devs] |= types; return 0;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
    GATE();
    long until = since_init_ms() + ms;
    for (;;) {
        for (int i = 0; i < nxid; i++) {
            struct xid *x = &xids[i];
            if (x->fired || since_init_ms() < x->after_ms || !(set->mask[x->dev] & 0x8)
                || (x->file[0] && access(x->file, F_OK) != 0))
                continue;
            x->fired = 1;
            memset(data, 0, sizeof *data);
            data->device = &devs[x->dev]; data->eventType = 0x8; data->eventData = x->code;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            return 0;
        }
        if (since_init_ms() >= until) return NVML_ERROR_TIMEOUT;
        usleep(5000);
    }
}
