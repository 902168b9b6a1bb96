/*
 * cu_driver_prog.c: calls CUDA driver-API functions as told on the command line, one line of
 * output per call, so a test can compare what a tracer saw with what the program saw.
 *
 * Build (tests/fakecuda_driver.py does this) against the stand-in or a real libcuda:
 *   gcc -O2 -g -fno-omit-frame-pointer cu_driver_prog.c -L DIR -l:libcuda.so.1
 *       -Wl,-rpath,DIR
 *
 * Usage: cu_driver_prog [--sleep-before MS] OP...
 *
 * Output, one line per call, fields separated by single spaces (the format of
 * cuda_driver_prog.c, plus the process id):
 *   <op> ret=<decimal CUresult> out=<0x-hex out-parameter after the call, or -> fn=<function>
 *        pid=<pid> [<argument>=<value> ...]
 * `out` starts as 0, also for failed calls. Pointers and handles print as 0x-hex, sizes and
 * flags as decimal, dimensions as x,y,z. `loop` prints one summary line (n=, errors=).
 *
 * Values (REF): `last` (default) = the value of the kind the argument needs (device pointer,
 * host pointer, context, reservation, allocation handle, module, library, kernel, function)
 * most recently produced by this process; `@N` = the N-th (0-based) such value; otherwise a
 * number (0x-hex or decimal). Streams, events and graph execs are plain numbers (default 0).
 * DIMS are `x,y,z` (missing parts are 1). NAME is a literal name, or `=N` for a generated
 * C++-mangled-looking name of exactly N characters (printed in full as name=).
 *
 *   init[:FLAGS=0]                      cuInit
 *   ctxcreate[:FLAGS=0[:DEV=0]]         cuCtxCreate_v2           out = context
 *   ctxcreate4[:FLAGS=0[:DEV=0]]        cuCtxCreate_v4 (params NULL)   out = context
 *   primaryctx[:DEV=0]                  cuDevicePrimaryCtxRetain out = context
 *   ctxdestroy[:CTX] | ctxsync          cuCtxDestroy_v2 | cuCtxSynchronize
 *   setctx[:CTX] | pushctx[:CTX]       cuCtxSetCurrent | cuCtxPushCurrent_v2
 *   popctx                             cuCtxPopCurrent_v2        out = context
 *   malloc:SIZE                         cuMemAlloc_v2            out = device pointer
 *   mallocasync:SIZE[:STREAM=0]         cuMemAllocAsync (mallocasyncptsz: _ptsz)
 *   mallocmanaged:SIZE[:FLAGS=1]        cuMemAllocManaged        out = device pointer
 *   hostalloc:SIZE[:FLAGS=0]            cuMemHostAlloc           out = host pointer
 *   allochost:SIZE                      cuMemAllocHost_v2        out = host pointer
 *   mallocpitch:W:H[:ELEM=4]            cuMemAllocPitch_v2       out = device pointer, pitch=
 *   freehost[:HOSTPTR]                  cuMemFreeHost
 *   hostregister:SIZE[:FLAGS=0]         cuMemHostRegister_v2 of the static host buffer
 *   hostunregister                      cuMemHostUnregister of the static host buffer
 *   free[:PTR]                          cuMemFree_v2
 *   freeasync[:PTR[:STREAM=0]]          cuMemFreeAsync (freeasyncptsz: _ptsz)
 *   memcpy:N[:DST[:SRC]]                cuMemcpy (memcpyptds)    dst, src default: last device ptr
 *   htod:N[:DST] | dtoh:N[:SRC] | dtod:N[:DST[:SRC]]
 *                                       cuMemcpyHtoD_v2 | DtoH_v2 | DtoD_v2 (suffix ptds: _ptds);
 *                                       the host side is a static buffer
 *   memcpyasync:N[:STREAM=0[:DST[:SRC]]] | htodasync:N[:STREAM=0[:DST]] |
 *   dtohasync:N[:STREAM=0[:SRC]] | dtodasync:N[:STREAM=0[:DST[:SRC]]]
 *                                       cuMemcpyAsync | HtoDAsync_v2 | ... (suffix ptsz: _ptsz)
 *   memsetd8:VALUE:N[:PTR] | memsetd32:VALUE:N[:PTR]        cuMemsetD8_v2 | D32_v2 (+ptds)
 *   memsetd8async:VALUE:N[:STREAM=0[:PTR]] | memsetd32async:...   cuMemsetD8Async | D32Async (+ptsz)
 *   memcreate:SIZE[:FLAGS=0]            cuMemCreate (prop = a local struct)   out = handle
 *   reserve:SIZE[:ALIGN=0[:ADDR=0]]     cuMemAddressReserve      out = reservation
 *   memmap:SIZE[:VA[:HANDLE[:OFFSET=0]]]   cuMemMap (flags 0)
 *   memunmap:SIZE[:VA] | memrelease[:HANDLE]   cuMemUnmap | cuMemRelease
 *   moduleload[:IMAGE=ptx]              cuModuleLoadData; IMAGE `ptx` (PTX text) or `empty` ("")
 *   moduleloadex[:NOPTIONS=0[:IMAGE=ptx]]   cuModuleLoadDataEx (options arrays of NOPTIONS zeros)
 *   libraryload[:IMAGE=ptx]             cuLibraryLoadData (no options)   out = library
 *   getfunction:NAME[:MODULE]           cuModuleGetFunction      out = function
 *   getkernel:NAME[:LIBRARY]            cuLibraryGetKernel       out = kernel
 *   kernelfunction[:KERNEL]             cuKernelGetFunction      out = function
 *   funcname[:FUNCTION]                 cuFuncGetName            out = name pointer, name=
 *   launch:GRID:BLOCK[:SMEM=0[:STREAM=0[:FUNCTION]]]   cuLaunchKernel (launchptsz: _ptsz,
 *                                       coop: cuLaunchCooperativeKernel, coopptsz: its _ptsz)
 *   launchex:GRID:BLOCK[:SMEM=0[:STREAM=0[:FUNCTION]]]  cuLaunchKernelEx (launchexptsz), config=
 *   graphlaunch:EXEC[:STREAM=0]         cuGraphLaunch (graphlaunchptsz)
 * CUDA graphs (GRAPH, NODE, EXEC: references to values produced before, like pointers):
 *   capture:STREAM[:MODE=0]             cuStreamBeginCapture_v2 (captureptsz: its _ptsz)
 *   capturetograph:GRAPH:STREAM[:MODE=0]   cuStreamBeginCaptureToGraph (no dependencies;
 *                                       capturetographptsz: its _ptsz)
 *   endcapture:STREAM                   cuStreamEndCapture (endcaptureptsz)   out = graph
 *   exchangemode:MODE                   cuThreadExchangeStreamCaptureMode   out = previous mode
 *   graphcreate                         cuGraphCreate            out = graph
 *   addkernel:GRID:BLOCK[:SMEM=0[:GRAPH[:FUNCTION]]]   cuGraphAddKernelNode_v2   out = node
 *   addmemcpy:COUNT:SRCTYPE:DSTTYPE[:GRAPH]   cuGraphAddMemcpyNode (CUmemorytype numbers,
 *                                       WidthInBytes COUNT, Height and Depth 1)   out = node
 *   addmemset:VALUE:ELEM:WIDTH[:HEIGHT=1[:GRAPH]]   cuGraphAddMemsetNode   out = node
 *   addchild:CHILD[:GRAPH] | addempty[:GRAPH] | addeventrecord:EVENT[:GRAPH] |
 *   addeventwait:EVENT[:GRAPH]          cuGraphAddChildGraphNode | EmptyNode | EventRecordNode
 *                                       | EventWaitNode (EVENT a number)   out = node
 *   instantiate[:GRAPH[:FLAGS=0]] | instantiate2[:GRAPH] | instantiateparams[:GRAPH]
 *                                       cuGraphInstantiateWithFlags | _v2 | WithParams
 *                                       (instantiateparamsptsz: its _ptsz)
 *                                       out = exec
 *   execkernelupdate:GRID:BLOCK[:SMEM=0[:EXEC[:NODE[:FUNCTION]]]]
 *                                       cuGraphExecKernelNodeSetParams_v2
 *   execupdate[:EXEC[:GRAPH]] | graphdestroy[:GRAPH] | execdestroy[:EXEC]
 *                                       cuGraphExecUpdate_v2 | cuGraphDestroy | cuGraphExecDestroy
 *   streamsync[:STREAM=0]               cuStreamSynchronize (streamsyncptsz)
 *   eventsync[:EVENT=0]                 cuEventSynchronize
 *   loop:N:OP                           OP N times; one summary line
 *   sleep:MS                            sleep (no call, no line)
 *   fork:OP[+OP...]                     a child process runs the OPs (sharing this process's
 *                                       values) and exits; this one waits for it
 *   spawn:OP[+OP...]                    a child process execs this program with the OPs as
 *                                       arguments; this one waits for it
 *
 * Exit status: 0 whatever the CUDA results, 2 on a malformed op.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the CUDA driver API used here (real signatures) ---- */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction, *CUlibrary, *CUkernel,
    *CUgraphExec;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef struct {   /* CUmemAllocationProp: only its size and a few fields matter here */
    int type, requestedHandleTypes;
    struct { int type, id; } location;
    void *win32HandleMetaData;
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} CUmemAllocationProp;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxCreate_v4(CUcontext *, void *, unsigned int, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned int);
CUresult cuMemHostUnregister(void *);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpy_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleLoadDataEx(CUmodule *, const void *, unsigned int, int *, void **);
CUresult cuLibraryLoadData(CUlibrary *, const void *, int *, void **, unsigned int, int *,
                           void **, unsigned int);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);
CUresult cuFuncGetName(const char **, CUfunction);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void **,
                             void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, unsigned int,
                                   CUstream, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int,
                                        unsigned int, unsigned int, unsigned int, unsigned int,
                                        CUstream, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuEventSynchronize(CUevent);
typedef void *CUgraph, *CUgraphNode;
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams, **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray, *reserved0;
    size_t srcPitch, srcHeight, dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray, *reserved1;
    size_t dstPitch, dstHeight, WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
} CUDA_MEMSET_NODE_PARAMS;
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, int);
CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode *, const void *,
                                     size_t, int);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode *, const void *,
                                          size_t, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuThreadExchangeStreamCaptureMode(int *);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                 const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphAddMemcpyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_MEMCPY3D *, CUcontext);
CUresult cuGraphAddMemsetNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphAddEmptyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t);
CUresult cuGraphAddEventRecordNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUevent);
CUresult cuGraphAddEventWaitNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUevent);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, void *);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *, CUgraph, void *);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec, CUgraphNode,
                                           const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, void *);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphExecDestroy(CUgraphExec);

static const char PTX[] =
    "//\n// vec_add: c[i] = a[i] + b[i]\n//\n.version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry vec_add(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n"
    "{\n\tret;\n}\n";

/* ---- values produced earlier, per process ---- */
enum kind { DEV, HOST, CTX, VA, MEMH, MODULE, LIBRARY, KERNEL, FUNC, GRAPH, NODE, EXEC, KINDS };
#define KEPT 256

static uintptr_t kept[KINDS][KEPT];
static unsigned long count[KINDS];
static char host_buffer[1 << 16];   /* the host side of copies; the stand-in never touches it */

static void remember(enum kind kind, uintptr_t value) {
    unsigned long n = count[kind]++;
    if (n < KEPT)
        kept[kind][n] = value;
}

static uintptr_t last_of(enum kind kind) {
    unsigned long n = count[kind];
    return n == 0 ? 0 : kept[kind][n <= KEPT ? n - 1 : KEPT - 1];
}

/* ---- parsing ---- */
#define MAX_FIELDS 16

struct op {
    const char *text;
    char *field[MAX_FIELDS];
    int nfields;
};

static void die(const char *what, const char *text) {
    fprintf(stderr, "cu_driver_prog: %s: %s\n", what, text);
    exit(2);
}

static unsigned long long number(const char *s, const char *text) {
    char *end;
    unsigned long long v;
    if (*s == '\0')
        die("empty number in", text);
    v = strtoull(s, &end, 0);
    if (*end != '\0')
        die("bad number in", text);
    return v;
}

static int has(const struct op *op, int i) { return i < op->nfields && op->field[i][0] != '\0'; }

static unsigned long long num_at(const struct op *op, int i, unsigned long long fallback) {
    return has(op, i) ? number(op->field[i], op->text) : fallback;
}

static unsigned long long need_num(const struct op *op, int i) {
    if (!has(op, i))
        die("missing field in", op->text);
    return number(op->field[i], op->text);
}

static uintptr_t ref_at(const struct op *op, int i, enum kind kind) {
    const char *s;
    if (!has(op, i) || strcmp(op->field[i], "last") == 0)
        return last_of(kind);
    s = op->field[i];
    if (s[0] == '@') {
        unsigned long long want = number(s + 1, op->text);
        if (want >= KEPT || want >= count[kind])
            die("no such earlier value", op->text);
        return kept[kind][want];
    }
    return (uintptr_t)number(s, op->text);
}

static void dims_at(const struct op *op, int i, unsigned int d[3]) {
    char copy[64], *save = NULL, *tok;
    int n = 0;
    d[0] = d[1] = d[2] = 1;
    if (!has(op, i))
        die("missing dimensions in", op->text);
    snprintf(copy, sizeof copy, "%s", op->field[i]);
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == 3)
            die("more than 3 dimensions in", op->text);
        d[n++] = (unsigned int)number(tok, op->text);
    }
}

static void split(struct op *op, const char *text, int max_fields) {
    char *copy = strdup(text), *p = copy;
    op->text = text;
    op->nfields = 0;
    while (op->nfields < max_fields - 1) {
        char *colon = strchr(p, ':');
        op->field[op->nfields++] = p;
        if (!colon)
            return;
        *colon = '\0';
        p = colon + 1;
    }
    op->field[op->nfields++] = p;
}

/* NAME: a literal, or `=N`: N characters of a C++-mangled-looking kernel name. */
static const char *name_at(const struct op *op, int i) {
    static const char PART[] = "N7cutlass6KernelINS_4gemm6kernel13GemmUniversalIfLi128ELi256EEEE";
    static char generated[8192];
    unsigned long long n, k;
    if (!has(op, i))
        die("missing name in", op->text);
    if (op->field[i][0] != '=')
        return op->field[i];
    n = number(op->field[i] + 1, op->text);
    if (n >= sizeof generated || n < 2)
        die("generated name length out of range in", op->text);
    generated[0] = '_';
    generated[1] = 'Z';
    for (k = 2; k < n; k++)
        generated[k] = PART[(k - 2) % (sizeof PART - 1)];
    generated[n] = '\0';
    return generated;
}

/* ---- running one op ---- */
struct outcome {
    CUresult ret;
    int printed_out;
    uintptr_t out;
    const char *fn;
    char extra[8192];
};

static void add(struct outcome *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(struct outcome *r, const char *fmt, ...) {
    size_t used = strlen(r->extra);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->extra + used, sizeof r->extra - used, fmt, ap);
    va_end(ap);
}

static void produced(struct outcome *r, enum kind kind, uintptr_t value) {
    r->printed_out = 1;
    r->out = value;
    if (r->ret == 0)
        remember(kind, value);
}

static int is(const struct op *op, const char *name) { return strcmp(op->field[0], name) == 0; }

static void do_context(const struct op *op, struct outcome *r) {
    CUcontext ctx = NULL;
    if (is(op, "init")) {
        unsigned flags = num_at(op, 1, 0);
        r->fn = "cuInit";
        r->ret = cuInit(flags);
        add(r, " flags=%u", flags);
    } else if (is(op, "ctxcreate") || is(op, "ctxcreate4")) {
        unsigned flags = num_at(op, 1, 0);
        int dev = (int)num_at(op, 2, 0);
        if (is(op, "ctxcreate")) {
            r->fn = "cuCtxCreate_v2";
            r->ret = cuCtxCreate_v2(&ctx, flags, dev);
        } else {
            r->fn = "cuCtxCreate_v4";
            r->ret = cuCtxCreate_v4(&ctx, NULL, flags, dev);
        }
        add(r, " flags=%u device=%d", flags, dev);
        produced(r, CTX, (uintptr_t)ctx);
    } else if (is(op, "primaryctx")) {
        int dev = (int)num_at(op, 1, 0);
        r->fn = "cuDevicePrimaryCtxRetain";
        r->ret = cuDevicePrimaryCtxRetain(&ctx, dev);
        add(r, " device=%d", dev);
        produced(r, CTX, (uintptr_t)ctx);
    } else if (is(op, "ctxdestroy")) {
        uintptr_t c = ref_at(op, 1, CTX);
        r->fn = "cuCtxDestroy_v2";
        r->ret = cuCtxDestroy_v2((CUcontext)c);
        add(r, " ctx=0x%lx", (unsigned long)c);
    } else if (is(op, "setctx") || is(op, "pushctx")) {
        uintptr_t c = ref_at(op, 1, CTX);
        r->fn = is(op, "setctx") ? "cuCtxSetCurrent" : "cuCtxPushCurrent_v2";
        r->ret = is(op, "setctx") ? cuCtxSetCurrent((CUcontext)c)
                                  : cuCtxPushCurrent_v2((CUcontext)c);
        add(r, " ctx=0x%lx", (unsigned long)c);
    } else if (is(op, "popctx")) {
        r->fn = "cuCtxPopCurrent_v2";
        r->ret = cuCtxPopCurrent_v2(&ctx);
        produced(r, CTX, (uintptr_t)ctx);
    } else {   /* ctxsync */
        r->fn = "cuCtxSynchronize";
        r->ret = cuCtxSynchronize();
    }
}

static void do_alloc(const struct op *op, struct outcome *r) {
    CUdeviceptr ptr = 0;
    size_t size = need_num(op, 1);
    if (is(op, "malloc")) {
        r->fn = "cuMemAlloc_v2";
        r->ret = cuMemAlloc_v2(&ptr, size);
        add(r, " size=%zu", size);
    } else if (is(op, "mallocasync") || is(op, "mallocasyncptsz")) {
        CUstream s = (CUstream)(uintptr_t)num_at(op, 2, 0);
        int ptsz = is(op, "mallocasyncptsz");
        r->fn = ptsz ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync";
        r->ret = ptsz ? cuMemAllocAsync_ptsz(&ptr, size, s) : cuMemAllocAsync(&ptr, size, s);
        add(r, " size=%zu stream=0x%lx", size, (unsigned long)(uintptr_t)s);
    } else if (is(op, "mallocmanaged")) {
        unsigned flags = num_at(op, 2, 1);
        r->fn = "cuMemAllocManaged";
        r->ret = cuMemAllocManaged(&ptr, size, flags);
        add(r, " size=%zu flags=%u", size, flags);
    } else if (is(op, "mallocpitch")) {
        size_t pitch = 0, height = need_num(op, 2);
        unsigned elem = num_at(op, 3, 4);
        r->fn = "cuMemAllocPitch_v2";
        r->ret = cuMemAllocPitch_v2(&ptr, &pitch, size, height, elem);
        add(r, " width=%zu height=%zu elementSize=%u pitch=%zu", size, height, elem, pitch);
    } else if (is(op, "allochost")) {
        void *host = NULL;
        r->fn = "cuMemAllocHost_v2";
        r->ret = cuMemAllocHost_v2(&host, size);
        add(r, " size=%zu", size);
        produced(r, HOST, (uintptr_t)host);
        return;
    } else {   /* hostalloc */
        void *host = NULL;
        unsigned flags = num_at(op, 2, 0);
        r->fn = "cuMemHostAlloc";
        r->ret = cuMemHostAlloc(&host, size, flags);
        add(r, " size=%zu flags=%u", size, flags);
        produced(r, HOST, (uintptr_t)host);
        return;
    }
    produced(r, DEV, (uintptr_t)ptr);
}

static void do_free(const struct op *op, struct outcome *r) {
    CUdeviceptr ptr = ref_at(op, 1, DEV);
    if (is(op, "hostregister")) {
        size_t size = need_num(op, 1);
        unsigned flags = num_at(op, 2, 0);
        r->fn = "cuMemHostRegister_v2";
        r->ret = cuMemHostRegister_v2(host_buffer, size, flags);
        add(r, " ptr=0x%lx size=%zu flags=%u", (unsigned long)(uintptr_t)host_buffer, size,
            flags);
    } else if (is(op, "hostunregister")) {
        r->fn = "cuMemHostUnregister";
        r->ret = cuMemHostUnregister(host_buffer);
        add(r, " ptr=0x%lx", (unsigned long)(uintptr_t)host_buffer);
    } else if (is(op, "freehost")) {
        void *host = (void *)(uintptr_t)ref_at(op, 1, HOST);
        r->fn = "cuMemFreeHost";
        r->ret = cuMemFreeHost(host);
        add(r, " ptr=0x%lx", (unsigned long)(uintptr_t)host);
    } else if (is(op, "free")) {
        r->fn = "cuMemFree_v2";
        r->ret = cuMemFree_v2(ptr);
        add(r, " ptr=0x%llx", ptr);
    } else {
        CUstream s = (CUstream)(uintptr_t)num_at(op, 2, 0);
        int ptsz = is(op, "freeasyncptsz");
        r->fn = ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync";
        r->ret = ptsz ? cuMemFreeAsync_ptsz(ptr, s) : cuMemFreeAsync(ptr, s);
        add(r, " ptr=0x%llx stream=0x%lx", ptr, (unsigned long)(uintptr_t)s);
    }
}

/* Calls `plain` or, for an op with a ptds/ptsz suffix (`variant`), `suffixed`. */
#define CALL(plain, suffixed, ...) \
    do { r->fn = variant ? #suffixed : #plain; \
         r->ret = variant ? suffixed(__VA_ARGS__) : plain(__VA_ARGS__); } while (0)

/* Copies: `base` is the op name without a ptds/ptsz suffix. */
static void do_copy(const struct op *op, struct outcome *r) {
    char base[32];
    size_t len = strlen(op->field[0]);
    int variant = len > 4 && (strcmp(op->field[0] + len - 4, "ptds") == 0 ||
                              strcmp(op->field[0] + len - 4, "ptsz") == 0);
    int async, at;
    size_t n = need_num(op, 1);
    CUstream s = NULL;
    uintptr_t host = (uintptr_t)host_buffer, dst, src;
    snprintf(base, sizeof base, "%.*s", (int)(variant ? len - 4 : len), op->field[0]);
    async = strstr(base, "async") != NULL;
    at = async ? 3 : 2;
    if (async)
        s = (CUstream)(uintptr_t)num_at(op, 2, 0);
    dst = strncmp(base, "dtoh", 4) == 0 ? host : ref_at(op, at, DEV);
    src = strncmp(base, "htod", 4) == 0 ? host
        : ref_at(op, strncmp(base, "dtoh", 4) == 0 ? at : at + 1, DEV);
    if (strcmp(base, "memcpy") == 0)
        CALL(cuMemcpy, cuMemcpy_ptds, dst, src, n);
    else if (strcmp(base, "htod") == 0)
        CALL(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, dst, (const void *)src, n);
    else if (strcmp(base, "dtoh") == 0)
        CALL(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void *)dst, src, n);
    else if (strcmp(base, "dtod") == 0)
        CALL(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, dst, src, n);
    else if (strcmp(base, "memcpyasync") == 0)
        CALL(cuMemcpyAsync, cuMemcpyAsync_ptsz, dst, src, n, s);
    else if (strcmp(base, "htodasync") == 0)
        CALL(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz, dst, (const void *)src, n, s);
    else if (strcmp(base, "dtohasync") == 0)
        CALL(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, (void *)dst, src, n, s);
    else
        CALL(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, dst, src, n, s);
    add(r, " dst=0x%lx src=0x%lx count=%zu", (unsigned long)dst, (unsigned long)src, n);
    if (async)
        add(r, " stream=0x%lx", (unsigned long)(uintptr_t)s);
}

static void do_memset(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    unsigned value = need_num(op, 1);
    size_t n = need_num(op, 2);
    int wide = strncmp(name, "memsetd32", 9) == 0;
    int async = strstr(name, "async") != NULL;
    int variant = strstr(name, "pt") != NULL;
    CUstream s = async ? (CUstream)(uintptr_t)num_at(op, 3, 0) : NULL;
    CUdeviceptr p = ref_at(op, async ? 4 : 3, DEV);
    if (!async && !wide)
        CALL(cuMemsetD8_v2, cuMemsetD8_v2_ptds, p, (unsigned char)value, n);
    else if (!async)
        CALL(cuMemsetD32_v2, cuMemsetD32_v2_ptds, p, value, n);
    else if (!wide)
        CALL(cuMemsetD8Async, cuMemsetD8Async_ptsz, p, (unsigned char)value, n, s);
    else
        CALL(cuMemsetD32Async, cuMemsetD32Async_ptsz, p, value, n, s);
    add(r, " ptr=0x%llx value=%u count=%zu", p, wide ? value : (unsigned char)value, n);
    if (async)
        add(r, " stream=0x%lx", (unsigned long)(uintptr_t)s);
}

static void do_vmm(const struct op *op, struct outcome *r) {
    if (is(op, "memcreate")) {
        static CUmemAllocationProp prop = {1, 0, {1, 0}, NULL, 0, 0, 0, {0}};
        CUmemGenericAllocationHandle h = 0;
        size_t size = need_num(op, 1);
        unsigned long long flags = num_at(op, 2, 0);
        r->fn = "cuMemCreate";
        r->ret = cuMemCreate(&h, size, &prop, flags);
        add(r, " size=%zu prop=%p flags=%llu", size, (void *)&prop, flags);
        produced(r, MEMH, h);
    } else if (is(op, "reserve")) {
        CUdeviceptr va = 0;
        size_t size = need_num(op, 1), align = num_at(op, 2, 0);
        CUdeviceptr addr = num_at(op, 3, 0);
        r->fn = "cuMemAddressReserve";
        r->ret = cuMemAddressReserve(&va, size, align, addr, 0);
        add(r, " size=%zu alignment=%zu addr=0x%llx flags=0", size, align, addr);
        produced(r, VA, va);
    } else if (is(op, "memmap")) {
        size_t size = need_num(op, 1), offset = num_at(op, 4, 0);
        CUdeviceptr va = ref_at(op, 2, VA);
        CUmemGenericAllocationHandle h = ref_at(op, 3, MEMH);
        r->fn = "cuMemMap";
        r->ret = cuMemMap(va, size, offset, h, 0);
        add(r, " ptr=0x%llx size=%zu offset=%zu handle=0x%llx flags=0", va, size, offset, h);
    } else if (is(op, "memunmap")) {
        size_t size = need_num(op, 1);
        CUdeviceptr va = ref_at(op, 2, VA);
        r->fn = "cuMemUnmap";
        r->ret = cuMemUnmap(va, size);
        add(r, " ptr=0x%llx size=%zu", va, size);
    } else {   /* memrelease */
        CUmemGenericAllocationHandle h = ref_at(op, 1, MEMH);
        r->fn = "cuMemRelease";
        r->ret = cuMemRelease(h);
        add(r, " handle=0x%llx", h);
    }
}

static const char *image_at(const struct op *op, int i) {
    if (!has(op, i) || strcmp(op->field[i], "ptx") == 0)
        return PTX;
    if (strcmp(op->field[i], "empty") == 0)
        return "";
    die("IMAGE must be ptx or empty in", op->text);
    return NULL;
}

static void do_module(const struct op *op, struct outcome *r) {
    if (is(op, "moduleload") || is(op, "moduleloadex")) {
        CUmodule m = NULL;
        int ex = is(op, "moduleloadex");
        unsigned nopt = ex ? (unsigned)num_at(op, 1, 0) : 0;
        const char *image = image_at(op, ex ? 2 : 1);
        static int options[16];
        static void *values[16];
        if (nopt > 16)
            die("at most 16 options in", op->text);
        r->fn = ex ? "cuModuleLoadDataEx" : "cuModuleLoadData";
        r->ret = ex ? cuModuleLoadDataEx(&m, image, nopt, options, values)
                    : cuModuleLoadData(&m, image);
        add(r, " image=%p", (const void *)image);
        if (ex)
            add(r, " numOptions=%u", nopt);
        produced(r, MODULE, (uintptr_t)m);
    } else if (is(op, "libraryload")) {
        CUlibrary l = NULL;
        const char *image = image_at(op, 1);
        r->fn = "cuLibraryLoadData";
        r->ret = cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0);
        add(r, " code=%p", (const void *)image);
        produced(r, LIBRARY, (uintptr_t)l);
    } else if (is(op, "getfunction") || is(op, "getkernel")) {
        void *h = NULL;
        const char *name = name_at(op, 1);
        int kernel = is(op, "getkernel");
        uintptr_t from = ref_at(op, 2, kernel ? LIBRARY : MODULE);
        r->fn = kernel ? "cuLibraryGetKernel" : "cuModuleGetFunction";
        r->ret = kernel ? cuLibraryGetKernel((CUkernel *)&h, (CUlibrary)from, name)
                        : cuModuleGetFunction((CUfunction *)&h, (CUmodule)from, name);
        add(r, " %s=0x%lx name=%s", kernel ? "library" : "module", (unsigned long)from, name);
        produced(r, kernel ? KERNEL : FUNC, (uintptr_t)h);
    } else if (is(op, "kernelfunction")) {
        CUfunction f = NULL;
        uintptr_t k = ref_at(op, 1, KERNEL);
        r->fn = "cuKernelGetFunction";
        r->ret = cuKernelGetFunction(&f, (CUkernel)k);
        add(r, " kernel=0x%lx", (unsigned long)k);
        produced(r, FUNC, (uintptr_t)f);
    } else {   /* funcname */
        const char *name = NULL;
        uintptr_t f = ref_at(op, 1, FUNC);
        r->fn = "cuFuncGetName";
        r->ret = cuFuncGetName(&name, (CUfunction)f);
        r->printed_out = 1;
        r->out = (uintptr_t)name;
        add(r, " function=0x%lx name=%s", (unsigned long)f, name ? name : "-");
    }
}

static void do_launch(const struct op *op, struct outcome *r) {
    static int n = 1000;
    static void *a, *b, *c;
    void *params[4] = {&a, &b, &c, &n};
    unsigned grid[3], block[3];
    unsigned smem;
    CUstream s;
    CUfunction f;
    dims_at(op, 1, grid);
    dims_at(op, 2, block);
    smem = (unsigned)num_at(op, 3, 0);
    s = (CUstream)(uintptr_t)num_at(op, 4, 0);
    f = (CUfunction)ref_at(op, 5, FUNC);
    a = b = c = (void *)last_of(DEV);
    if (is(op, "launch") || is(op, "launchptsz")) {
        int ptsz = is(op, "launchptsz");
        r->fn = ptsz ? "cuLaunchKernel_ptsz" : "cuLaunchKernel";
        r->ret = (ptsz ? cuLaunchKernel_ptsz : cuLaunchKernel)(
            f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, s, params, NULL);
    } else if (is(op, "coop") || is(op, "coopptsz")) {
        int ptsz = is(op, "coopptsz");
        r->fn = ptsz ? "cuLaunchCooperativeKernel_ptsz" : "cuLaunchCooperativeKernel";
        r->ret = (ptsz ? cuLaunchCooperativeKernel_ptsz : cuLaunchCooperativeKernel)(
            f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, s, params);
    } else {   /* launchex, launchexptsz */
        CUlaunchConfig config = {grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                 smem, s, NULL, 0};
        int ptsz = is(op, "launchexptsz");
        r->fn = ptsz ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx";
        r->ret = (ptsz ? cuLaunchKernelEx_ptsz : cuLaunchKernelEx)(&config, f, params, NULL);
        add(r, " config=%p", (void *)&config);
    }
    add(r, " func=0x%lx grid=%u,%u,%u block=%u,%u,%u smem=%u stream=0x%lx params=%p",
        (unsigned long)(uintptr_t)f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
        smem, (unsigned long)(uintptr_t)s, (void *)params);
}

static void do_sync(const struct op *op, struct outcome *r) {
    if (is(op, "graphlaunch") || is(op, "graphlaunchptsz")) {
        uintptr_t x = need_num(op, 1), s = num_at(op, 2, 0);
        int ptsz = is(op, "graphlaunchptsz");
        r->fn = ptsz ? "cuGraphLaunch_ptsz" : "cuGraphLaunch";
        r->ret = (ptsz ? cuGraphLaunch_ptsz : cuGraphLaunch)((CUgraphExec)x, (CUstream)s);
        add(r, " exec=0x%lx stream=0x%lx", (unsigned long)x, (unsigned long)s);
    } else if (is(op, "streamsync") || is(op, "streamsyncptsz")) {
        uintptr_t s = num_at(op, 1, 0);
        int ptsz = is(op, "streamsyncptsz");
        r->fn = ptsz ? "cuStreamSynchronize_ptsz" : "cuStreamSynchronize";
        r->ret = (ptsz ? cuStreamSynchronize_ptsz : cuStreamSynchronize)((CUstream)s);
        add(r, " stream=0x%lx", (unsigned long)s);
    } else {   /* eventsync */
        uintptr_t e = num_at(op, 1, 0);
        r->fn = "cuEventSynchronize";
        r->ret = cuEventSynchronize((CUevent)e);
        add(r, " event=0x%lx", (unsigned long)e);
    }
}

static CUDA_KERNEL_NODE_PARAMS kernel_params(const struct op *op, int i, int function_at) {
    static int n = 1000;
    static void *params[4] = {NULL, NULL, NULL, &n};
    unsigned grid[3], block[3];
    CUDA_KERNEL_NODE_PARAMS p;
    dims_at(op, i, grid);
    dims_at(op, i + 1, block);
    memset(&p, 0, sizeof p);
    p.func = (CUfunction)ref_at(op, function_at, FUNC);
    p.gridDimX = grid[0], p.gridDimY = grid[1], p.gridDimZ = grid[2];
    p.blockDimX = block[0], p.blockDimY = block[1], p.blockDimZ = block[2];
    p.sharedMemBytes = (unsigned)num_at(op, i + 2, 0);
    p.kernelParams = params;
    return p;
}

static void kernel_text(struct outcome *r, const CUDA_KERNEL_NODE_PARAMS *p) {
    add(r, " func=0x%lx grid=%u,%u,%u block=%u,%u,%u smem=%u", (unsigned long)(uintptr_t)p->func,
        p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
        p->sharedMemBytes);
}

static void do_add_node(const struct op *op, struct outcome *r) {
    CUgraphNode node = NULL;
    CUgraph g;
    if (is(op, "addkernel")) {
        CUDA_KERNEL_NODE_PARAMS p = kernel_params(op, 1, 5);
        g = (CUgraph)ref_at(op, 4, GRAPH);
        r->fn = "cuGraphAddKernelNode_v2";
        r->ret = cuGraphAddKernelNode_v2(&node, g, NULL, 0, &p);
        kernel_text(r, &p);
    } else if (is(op, "addmemcpy")) {
        CUDA_MEMCPY3D p;
        memset(&p, 0, sizeof p);
        p.WidthInBytes = need_num(op, 1);
        p.srcMemoryType = (int)need_num(op, 2);
        p.dstMemoryType = (int)need_num(op, 3);
        p.Height = p.Depth = 1;
        p.srcHost = p.dstHost = host_buffer;
        p.srcDevice = p.dstDevice = last_of(DEV);
        g = (CUgraph)ref_at(op, 4, GRAPH);
        r->fn = "cuGraphAddMemcpyNode";
        r->ret = cuGraphAddMemcpyNode(&node, g, NULL, 0, &p, NULL);
        add(r, " count=%zu srctype=%d dsttype=%d", p.WidthInBytes, p.srcMemoryType,
            p.dstMemoryType);
    } else if (is(op, "addmemset")) {
        CUDA_MEMSET_NODE_PARAMS p = {last_of(DEV), 0, (unsigned)num_at(op, 1, 0),
                                     (unsigned)need_num(op, 2), need_num(op, 3),
                                     num_at(op, 4, 1)};
        p.pitch = p.width * p.elementSize;
        g = (CUgraph)ref_at(op, 5, GRAPH);
        r->fn = "cuGraphAddMemsetNode";
        r->ret = cuGraphAddMemsetNode(&node, g, NULL, 0, &p, NULL);
        add(r, " ptr=0x%llx value=%u elem=%u width=%zu height=%zu", p.dst, p.value,
            p.elementSize, p.width, p.height);
    } else if (is(op, "addchild")) {
        CUgraph child = (CUgraph)ref_at(op, 1, GRAPH);
        g = (CUgraph)ref_at(op, 2, GRAPH);
        r->fn = "cuGraphAddChildGraphNode";
        r->ret = cuGraphAddChildGraphNode(&node, g, NULL, 0, child);
        add(r, " child=0x%lx", (unsigned long)(uintptr_t)child);
    } else if (is(op, "addempty")) {
        g = (CUgraph)ref_at(op, 1, GRAPH);
        r->fn = "cuGraphAddEmptyNode";
        r->ret = cuGraphAddEmptyNode(&node, g, NULL, 0);
    } else {   /* addeventrecord, addeventwait */
        CUevent e = (CUevent)(uintptr_t)need_num(op, 1);
        int wait = is(op, "addeventwait");
        g = (CUgraph)ref_at(op, 2, GRAPH);
        r->fn = wait ? "cuGraphAddEventWaitNode" : "cuGraphAddEventRecordNode";
        r->ret = (wait ? cuGraphAddEventWaitNode : cuGraphAddEventRecordNode)(&node, g, NULL, 0,
                                                                              e);
        add(r, " event=0x%lx", (unsigned long)(uintptr_t)e);
    }
    add(r, " graph=0x%lx", (unsigned long)(uintptr_t)g);
    produced(r, NODE, (uintptr_t)node);
}

static void do_graph(const struct op *op, struct outcome *r) {
    if (is(op, "capture") || is(op, "captureptsz") || is(op, "capturetograph")
        || is(op, "capturetographptsz")) {
        int to = strncmp(op->field[0], "capturetograph", 14) == 0;
        int ptsz = strstr(op->field[0], "ptsz") != NULL;
        CUgraph g = to ? (CUgraph)ref_at(op, 1, GRAPH) : NULL;
        CUstream s = (CUstream)(uintptr_t)need_num(op, to ? 2 : 1);
        int mode = (int)num_at(op, to ? 3 : 2, 0);
        if (to) {
            r->fn = ptsz ? "cuStreamBeginCaptureToGraph_ptsz" : "cuStreamBeginCaptureToGraph";
            r->ret = (ptsz ? cuStreamBeginCaptureToGraph_ptsz : cuStreamBeginCaptureToGraph)(
                s, g, NULL, NULL, 0, mode);
            add(r, " graph=0x%lx", (unsigned long)(uintptr_t)g);
        } else {
            r->fn = ptsz ? "cuStreamBeginCapture_v2_ptsz" : "cuStreamBeginCapture_v2";
            r->ret = (ptsz ? cuStreamBeginCapture_v2_ptsz : cuStreamBeginCapture_v2)(s, mode);
        }
        add(r, " stream=0x%lx mode=%d", (unsigned long)(uintptr_t)s, mode);
    } else if (is(op, "endcapture") || is(op, "endcaptureptsz")) {
        CUstream s = (CUstream)(uintptr_t)need_num(op, 1);
        CUgraph g = NULL;
        int ptsz = is(op, "endcaptureptsz");
        r->fn = ptsz ? "cuStreamEndCapture_ptsz" : "cuStreamEndCapture";
        r->ret = (ptsz ? cuStreamEndCapture_ptsz : cuStreamEndCapture)(s, &g);
        add(r, " stream=0x%lx", (unsigned long)(uintptr_t)s);
        produced(r, GRAPH, (uintptr_t)g);
    } else if (is(op, "exchangemode")) {
        int mode = (int)need_num(op, 1);
        r->fn = "cuThreadExchangeStreamCaptureMode";
        add(r, " mode=%d", mode);
        r->ret = cuThreadExchangeStreamCaptureMode(&mode);
        r->printed_out = 1;
        r->out = (uintptr_t)(unsigned)mode;
    } else if (is(op, "graphcreate")) {
        CUgraph g = NULL;
        r->fn = "cuGraphCreate";
        r->ret = cuGraphCreate(&g, 0);
        produced(r, GRAPH, (uintptr_t)g);
    } else if (is(op, "instantiate") || is(op, "instantiate2") || is(op, "instantiateparams")
               || is(op, "instantiateparamsptsz")) {
        CUgraph g = (CUgraph)ref_at(op, 1, GRAPH);
        CUgraphExec x = NULL;
        if (is(op, "instantiate")) {
            unsigned long long flags = num_at(op, 2, 0);
            r->fn = "cuGraphInstantiateWithFlags";
            r->ret = cuGraphInstantiateWithFlags(&x, g, flags);
            add(r, " flags=%llu", flags);
        } else if (is(op, "instantiate2")) {
            r->fn = "cuGraphInstantiate_v2";
            r->ret = cuGraphInstantiate_v2(&x, g, NULL, NULL, 0);
        } else if (is(op, "instantiateparams")) {
            r->fn = "cuGraphInstantiateWithParams";
            r->ret = cuGraphInstantiateWithParams(&x, g, NULL);
        } else {
            r->fn = "cuGraphInstantiateWithParams_ptsz";
            r->ret = cuGraphInstantiateWithParams_ptsz(&x, g, NULL);
        }
        add(r, " graph=0x%lx", (unsigned long)(uintptr_t)g);
        produced(r, EXEC, (uintptr_t)x);
    } else if (is(op, "execkernelupdate")) {
        CUDA_KERNEL_NODE_PARAMS p = kernel_params(op, 1, 6);
        CUgraphExec x = (CUgraphExec)ref_at(op, 4, EXEC);
        CUgraphNode node = (CUgraphNode)ref_at(op, 5, NODE);
        r->fn = "cuGraphExecKernelNodeSetParams_v2";
        r->ret = cuGraphExecKernelNodeSetParams_v2(x, node, &p);
        kernel_text(r, &p);
        add(r, " exec=0x%lx node=0x%lx", (unsigned long)(uintptr_t)x,
            (unsigned long)(uintptr_t)node);
    } else if (is(op, "execupdate")) {
        CUgraphExec x = (CUgraphExec)ref_at(op, 1, EXEC);
        CUgraph g = (CUgraph)ref_at(op, 2, GRAPH);
        r->fn = "cuGraphExecUpdate_v2";
        r->ret = cuGraphExecUpdate_v2(x, g, NULL);
        add(r, " exec=0x%lx graph=0x%lx", (unsigned long)(uintptr_t)x,
            (unsigned long)(uintptr_t)g);
    } else if (is(op, "graphdestroy")) {
        CUgraph g = (CUgraph)ref_at(op, 1, GRAPH);
        r->fn = "cuGraphDestroy";
        r->ret = cuGraphDestroy(g);
        add(r, " graph=0x%lx", (unsigned long)(uintptr_t)g);
    } else {   /* execdestroy */
        CUgraphExec x = (CUgraphExec)ref_at(op, 1, EXEC);
        r->fn = "cuGraphExecDestroy";
        r->ret = cuGraphExecDestroy(x);
        add(r, " exec=0x%lx", (unsigned long)(uintptr_t)x);
    }
}

typedef void (*handler)(const struct op *, struct outcome *);

static const struct {
    const char *name;
    handler run;
} HANDLERS[] = {
    {"init", do_context}, {"ctxcreate", do_context}, {"ctxcreate4", do_context},
    {"primaryctx", do_context}, {"ctxdestroy", do_context}, {"ctxsync", do_context},
    {"setctx", do_context}, {"pushctx", do_context}, {"popctx", do_context},
    {"malloc", do_alloc}, {"mallocasync", do_alloc}, {"mallocasyncptsz", do_alloc},
    {"mallocmanaged", do_alloc}, {"hostalloc", do_alloc}, {"mallocpitch", do_alloc},
    {"allochost", do_alloc}, {"freehost", do_free}, {"hostregister", do_free},
    {"hostunregister", do_free},
    {"free", do_free}, {"freeasync", do_free}, {"freeasyncptsz", do_free},
    {"memcpy", do_copy}, {"memcpyptds", do_copy}, {"htod", do_copy}, {"htodptds", do_copy},
    {"dtoh", do_copy}, {"dtohptds", do_copy}, {"dtod", do_copy}, {"dtodptds", do_copy},
    {"memcpyasync", do_copy}, {"memcpyasyncptsz", do_copy}, {"htodasync", do_copy},
    {"htodasyncptsz", do_copy}, {"dtohasync", do_copy}, {"dtohasyncptsz", do_copy},
    {"dtodasync", do_copy}, {"dtodasyncptsz", do_copy},
    {"memsetd8", do_memset}, {"memsetd8ptds", do_memset}, {"memsetd32", do_memset},
    {"memsetd32ptds", do_memset}, {"memsetd8async", do_memset},
    {"memsetd8asyncptsz", do_memset}, {"memsetd32async", do_memset},
    {"memsetd32asyncptsz", do_memset},
    {"memcreate", do_vmm}, {"reserve", do_vmm}, {"memmap", do_vmm}, {"memunmap", do_vmm},
    {"memrelease", do_vmm},
    {"moduleload", do_module}, {"moduleloadex", do_module}, {"libraryload", do_module},
    {"getfunction", do_module}, {"getkernel", do_module}, {"kernelfunction", do_module},
    {"funcname", do_module},
    {"launch", do_launch}, {"launchptsz", do_launch}, {"coop", do_launch},
    {"coopptsz", do_launch}, {"launchex", do_launch}, {"launchexptsz", do_launch},
    {"addkernel", do_add_node}, {"addmemcpy", do_add_node}, {"addmemset", do_add_node},
    {"addchild", do_add_node}, {"addempty", do_add_node}, {"addeventrecord", do_add_node},
    {"addeventwait", do_add_node},
    {"capture", do_graph}, {"capturetograph", do_graph}, {"endcapture", do_graph},
    {"captureptsz", do_graph}, {"capturetographptsz", do_graph}, {"endcaptureptsz", do_graph},
    {"instantiateparamsptsz", do_graph},
    {"exchangemode", do_graph}, {"graphcreate", do_graph}, {"instantiate", do_graph},
    {"instantiate2", do_graph}, {"instantiateparams", do_graph}, {"execkernelupdate", do_graph},
    {"execupdate", do_graph}, {"graphdestroy", do_graph}, {"execdestroy", do_graph},
    {"graphlaunch", do_sync}, {"graphlaunchptsz", do_sync}, {"streamsync", do_sync},
    {"streamsyncptsz", do_sync}, {"eventsync", do_sync},
};

static handler parse_call(struct op *op, const char *text) {
    split(op, text, MAX_FIELDS);
    for (size_t i = 0; i < sizeof HANDLERS / sizeof HANDLERS[0]; i++)
        if (strcmp(HANDLERS[i].name, op->field[0]) == 0)
            return HANDLERS[i].run;
    die("unknown op", text);
    return NULL;
}

static void print_outcome(const char *name, const struct outcome *r) {
    if (r->printed_out)
        printf("%s ret=%d out=0x%lx fn=%s pid=%d%s\n", name, r->ret, (unsigned long)r->out,
               r->fn, (int)getpid(), r->extra);
    else
        printf("%s ret=%d out=- fn=%s pid=%d%s\n", name, r->ret, r->fn, (int)getpid(), r->extra);
}

static void sleep_ms(unsigned long long ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void run_op(const char *text);

static void run_loop(const char *text) {
    struct op head, op;
    unsigned long times, errors = 0;
    CUresult first = 0;
    const char *fn = "-";
    handler run;
    split(&head, text, 3);
    if (head.nfields < 3)
        die("loop needs loop:N:OP", text);
    times = number(head.field[1], text);
    run = parse_call(&op, head.field[2]);
    for (unsigned long i = 0; i < times; i++) {
        struct outcome r = {0};
        run(&op, &r);
        fn = r.fn;
        if (r.ret != 0 && errors++ == 0)
            first = r.ret;
    }
    printf("loop ret=%d out=- fn=%s pid=%d n=%lu errors=%lu op=%s\n", first, fn, (int)getpid(),
           times, errors, head.field[2]);
}

/* fork:OPS / spawn:OPS, OPS separated by '+'; waits for the child. */
static void run_child(const char *text, int exec_self) {
    char *ops = strdup(strchr(text, ':') + 1), *argv[64], *save = NULL, *tok;
    int argc = 0, status;
    pid_t pid;
    argv[argc++] = "cu_driver_prog";
    for (tok = strtok_r(ops, "+", &save); tok && argc < 63; tok = strtok_r(NULL, "+", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;
    fflush(stdout);
    pid = fork();
    if (pid < 0)
        die("fork failed for", text);
    if (pid == 0) {
        if (exec_self) {
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        for (int i = 1; i < argc; i++)
            run_op(argv[i]);
        fflush(stdout);
        _exit(0);
    }
    waitpid(pid, &status, 0);
}

static void run_op(const char *text) {
    struct op op;
    struct outcome r = {0};
    handler run;
    if (strncmp(text, "loop:", 5) == 0) {
        run_loop(text);
        return;
    }
    if (strncmp(text, "sleep:", 6) == 0) {
        sleep_ms(number(text + 6, text));
        return;
    }
    if (strncmp(text, "fork:", 5) == 0 || strncmp(text, "spawn:", 6) == 0) {
        run_child(text, text[0] == 's');
        return;
    }
    run = parse_call(&op, text);
    run(&op, &r);
    print_outcome(op.field[0], &r);
}

int main(int argc, char **argv) {
    int i = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--sleep-before") == 0 && i + 1 < argc) {
            i++;
            sleep_ms(number(argv[i], argv[i]));
        } else if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else {
            die("unknown option", argv[i]);
        }
    }
    for (; i < argc; i++)
        run_op(argv[i]);
    return 0;
}
