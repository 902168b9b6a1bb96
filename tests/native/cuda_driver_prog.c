/*
 * cuda_driver_prog.c: calls CUDA runtime functions as told on the command line, one line of
 * output per call, so a test can compare what a tracer saw with what the program saw.
 *
 * Build (tests/fakecuda.py does this) against the stand-in or a real libcudart:
 *   gcc -O2 -g -fno-omit-frame-pointer cuda_driver_prog.c -L DIR -l:libcudart.so.12
 *       -Wl,-rpath,DIR -lpthread
 *
 * Usage: cuda_driver_prog [--sleep-before MS] [--wait-stdin] OP...
 *   --sleep-before MS   sleep MS milliseconds before the first op (time to attach with -d PID)
 *   --wait-stdin        print "ready pid=<pid>" and wait for a line (or EOF) on stdin first
 *
 * Output, one line per CUDA call, fields separated by single spaces:
 *   <op> ret=<decimal cudaError_t> out=<0x-hex value written through the out-parameter, or ->
 *        fn=<CUDA function called> [<argument>=<value> ...]
 * `out` is the out-parameter variable after the call, also when the call failed (it starts as
 * 0; as -1, printed 0xffffffff, for int outputs). Pointers and handles print as 0x-hex, sizes and
 * enums as decimal. `loop` and `threads` print one summary line instead (ret = the first
 * non-zero result or 0, n = calls made, errors = non-zero results).
 *
 * Values (REF): `last` (default) = the value most recently produced by this thread of the kind
 * the argument needs (device pointer, host pointer, stream, event, graph, graph exec); `@N` = the
 * N-th (0-based) such value produced by this thread; otherwise a number (0x-hex or decimal).
 * Before any value of a kind was produced, `last` is 0 (NULL).
 * DIMS are `x,y,z` (missing parts are 1). Brackets mark optional fields.
 *
 *   malloc:SIZE                      cudaMalloc             out = device pointer
 *   mallocmanaged:SIZE[:FLAGS=1]     cudaMallocManaged      out = device pointer
 *   mallocasync:SIZE[:STREAM=0]      cudaMallocAsync        out = device pointer
 *   mallocpitch:W:H                  cudaMallocPitch        out = device pointer, pitch=
 *   mallochost:SIZE                  cudaMallocHost         out = host pointer
 *   hostalloc:SIZE[:FLAGS=0]         cudaHostAlloc          out = host pointer
 *   free[:PTR]                       cudaFree
 *   freehost[:HOSTPTR]               cudaFreeHost
 *   hostregister:SIZE[:FLAGS=0]      cudaHostRegister of the static host buffer
 *   hostunregister                   cudaHostUnregister of the static host buffer
 *   freeasync[:PTR[:STREAM=0]]       cudaFreeAsync
 *   memcpy:COUNT:KIND[:DST:SRC]      cudaMemcpy             (also memcpyptds: cudaMemcpy_ptds)
 *   memcpyasync:COUNT:KIND[:STREAM[:DST:SRC]]   cudaMemcpyAsync (memcpyasyncptsz: _ptsz)
 *   memcpy2d:W:H:KIND[:DPITCH:SPITCH]           cudaMemcpy2D (pitches default to 512)
 *   memcpy2dasync:W:H:KIND[:STREAM[:DPITCH:SPITCH]]   cudaMemcpy2DAsync
 *   memcpypeer:COUNT:DSTDEV:SRCDEV   cudaMemcpyPeer (dst = src = last device pointer)
 *   memset:VALUE:COUNT[:PTR]         cudaMemset
 *   memsetasync:VALUE:COUNT[:STREAM[:PTR]]      cudaMemsetAsync (memsetasyncptsz: _ptsz)
 *   meminfo                          cudaMemGetInfo         out = free, total=
 *   getdevicecount                   cudaGetDeviceCount     out = count
 *   getdevice                        cudaGetDevice          out = device
 *   setdevice:N                      cudaSetDevice
 *   devsync | devreset               cudaDeviceSynchronize | cudaDeviceReset
 *   streamcreate                     cudaStreamCreate       out = stream
 *   streamcreateflags:FLAGS          cudaStreamCreateWithFlags     out = stream
 *   streamcreateprio:FLAGS:PRIO      cudaStreamCreateWithPriority  out = stream
 *   streamdestroy[:S] | streamsync[:S] | streamsyncptsz[:S] | streamquery[:S]
 *   streamwait[:S[:E[:FLAGS=0]]]     cudaStreamWaitEvent
 *   eventcreate                      cudaEventCreate        out = event
 *   eventcreateflags:FLAGS           cudaEventCreateWithFlags      out = event
 *   eventrecord[:E[:S=0]] | eventrecordptsz[:E[:S=0]]
 *   eventsync[:E] | eventquery[:E] | eventdestroy[:E]
 *   elapsed:E1:E2                    cudaEventElapsedTime   out = float bits, ms=
 *   launch:GRID:BLOCK[:SMEM=0[:STREAM=0]]   cudaLaunchKernel with func = vec_add_kernel (a host
 *                                    function: NVIDIA's runtime answers 400 for it) and
 *                                    args = {&a, &b, &c, &n} (the last 3 device pointers, n = 1000);
 *                                    GRID and BLOCK are DIMS
 *   launchptsz, coop (cudaLaunchCooperativeKernel), launchex (cudaLaunchKernelExC): same fields
 *   launchnull:GRID:BLOCK            cudaLaunchKernel with func = NULL
 *   getkernel | cudagetkernel        __cudaGetKernel | cudaGetKernel of vec_add_kernel
 *                                    out = the kernel handle
 *   launchhandle:GRID:BLOCK          cudaLaunchKernel with func = the last kernel handle
 *   stublaunch:GRID:BLOCK            the same through __device_stub__Z14vec_add_kernelPKfS0_Pfi,
 *                                    as nvcc's code does
 *   register:NAME                    __cudaRegisterFunction(stub = vec_add_kernel, NAME)
 *   capture[:S[:MODE=0]]             cudaStreamBeginCapture
 *   endcapture[:S]                   cudaStreamEndCapture   out = graph
 *   instantiate[:GRAPH]              cudaGraphInstantiate   out = graph exec
 *   graphlaunch[:EXEC[:S=0]]         cudaGraphLaunch
 * Graph construction (DEP: a node, the new node's one dependency; none by default):
 *   capturetograph:GRAPH[:S[:MODE=0]]   cudaStreamBeginCaptureToGraph (no dependencies)
 *   exchangemode:MODE                cudaThreadExchangeStreamCaptureMode   out = previous mode
 *   graphcreate                      cudaGraphCreate (flags 0)   out = graph
 *   addkernel:GRID:BLOCK[:SMEM=0[:GRAPH[:DEP]]]   cudaGraphAddKernelNode of vec_add_kernel
 *                                    out = node (so for every add*)
 *   addmemcpy:COUNT:KIND[:GRAPH[:DEP]]   cudaGraphAddMemcpyNode (extent COUNT x 1 x 1)
 *   addmemcpy1d:COUNT:KIND[:GRAPH[:DEP]] cudaGraphAddMemcpyNode1D
 *   addtosymbol:COUNT[:GRAPH] | addfromsymbol:COUNT[:GRAPH]   cudaGraphAddMemcpyNodeTo/FromSymbol
 *                                    (a static symbol, offset 0, kind 1 / 2)
 *   addmemset:VALUE:ELEM:WIDTH[:HEIGHT=1[:GRAPH[:DEP]]]   cudaGraphAddMemsetNode
 *   addchild:CHILD[:GRAPH[:DEP]]     cudaGraphAddChildGraphNode (CHILD: a graph)
 *   addempty[:GRAPH[:DEP]]           cudaGraphAddEmptyNode
 *   addeventrecord:EVENT[:GRAPH] | addeventwait:EVENT[:GRAPH]   cudaGraphAddEventRecord/WaitNode
 *   instantiateflags[:GRAPH[:FLAGS=0]] | instantiateparams[:GRAPH]
 *                                    cudaGraphInstantiateWithFlags | WithParams   out = exec
 *   execkernelupdate:GRID:BLOCK[:SMEM=0[:EXEC[:NODE]]]   cudaGraphExecKernelNodeSetParams
 *   execupdate[:EXEC[:GRAPH]]        cudaGraphExecUpdate
 *   graphdestroy[:GRAPH] | execdestroy[:EXEC]   cudaGraphDestroy | cudaGraphExecDestroy
 *   getlasterror | peeklasterror     cudaGetLastError | cudaPeekAtLastError
 *   loop:N:OP                        run OP N times in this thread; one summary line
 *   threads:T:N:OP                   T threads each run OP N times; one summary line
 *   sleep:MS                         sleep (no CUDA call, no line)
 *
 * Exit status: 0 whatever the CUDA results, 2 on a malformed op.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the CUDA runtime API used here (real signatures) ---- */
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaMallocManaged(void **, size_t, unsigned int);
cudaError_t cudaMallocAsync(void **, size_t, cudaStream_t);
cudaError_t cudaMallocPitch(void **, size_t *, size_t, size_t);
cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
cudaError_t cudaFree(void *);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaHostRegister(void *, size_t, unsigned int);
cudaError_t cudaHostUnregister(void *);
cudaError_t cudaFreeAsync(void *, cudaStream_t);
cudaError_t cudaMemcpy(void *, const void *, size_t, int);
cudaError_t cudaMemcpy_ptds(void *, const void *, size_t, int);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, int, cudaStream_t);
cudaError_t cudaMemcpyAsync_ptsz(void *, const void *, size_t, int, cudaStream_t);
cudaError_t cudaMemcpy2D(void *, size_t, const void *, size_t, size_t, size_t, int);
cudaError_t cudaMemcpy2DAsync(void *, size_t, const void *, size_t, size_t, size_t, int,
                              cudaStream_t);
cudaError_t cudaMemcpyPeer(void *, int, const void *, int, size_t);
cudaError_t cudaMemset(void *, int, size_t);
cudaError_t cudaMemsetAsync(void *, int, size_t, cudaStream_t);
cudaError_t cudaMemsetAsync_ptsz(void *, int, size_t, cudaStream_t);
cudaError_t cudaMemGetInfo(size_t *, size_t *);
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaSetDevice(int);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaStreamCreate(cudaStream_t *);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *, unsigned int, int);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t);
cudaError_t cudaStreamQuery(cudaStream_t);
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int);
cudaError_t cudaEventCreate(cudaEvent_t *);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *, unsigned int);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventQuery(cudaEvent_t);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventElapsedTime(float *, cudaEvent_t, cudaEvent_t);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchCooperativeKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *, const void *, void **);
cudaError_t cudaStreamBeginCapture(cudaStream_t, int);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
typedef void *cudaGraphNode_t;
struct cudaKernelNodeParams {
    void *func;
    dim3 gridDim;
    dim3 blockDim;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
};
struct cudaPos { size_t x, y, z; };
struct cudaPitchedPtr { void *ptr; size_t pitch, xsize, ysize; };
struct cudaExtent { size_t width, height, depth; };
struct cudaMemcpy3DParms {
    void *srcArray;
    struct cudaPos srcPos;
    struct cudaPitchedPtr srcPtr;
    void *dstArray;
    struct cudaPos dstPos;
    struct cudaPitchedPtr dstPtr;
    struct cudaExtent extent;
    int kind;
};
struct cudaMemsetParams {
    void *dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
};
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                          const void *, size_t, int);
cudaError_t cudaThreadExchangeStreamCaptureMode(int *);
cudaError_t cudaGraphCreate(cudaGraph_t *, unsigned int);
cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                   size_t, const struct cudaKernelNodeParams *);
cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                   size_t, const struct cudaMemcpy3DParms *);
cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                     size_t, void *, const void *, size_t, int);
cudaError_t cudaGraphAddMemcpyNodeToSymbol(cudaGraphNode_t *, cudaGraph_t,
                                           const cudaGraphNode_t *, size_t, const void *,
                                           const void *, size_t, size_t, int);
cudaError_t cudaGraphAddMemcpyNodeFromSymbol(cudaGraphNode_t *, cudaGraph_t,
                                             const cudaGraphNode_t *, size_t, void *,
                                             const void *, size_t, size_t, int);
cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                   size_t, const struct cudaMemsetParams *);
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                       size_t, cudaGraph_t);
cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                  size_t);
cudaError_t cudaGraphAddEventRecordNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                        size_t, cudaEvent_t);
cudaError_t cudaGraphAddEventWaitNode(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *,
                                      size_t, cudaEvent_t);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *, cudaGraph_t, void *);
cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t, cudaGraphNode_t,
                                             const struct cudaKernelNodeParams *);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t, cudaGraph_t, void *);
cudaError_t cudaGraphDestroy(cudaGraph_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

/* The "kernel" passed to launches: a host function, so its address symbolizes to a name. */
__attribute__((noinline, used)) void vec_add_kernel(const float *a, const float *b, float *c,
                                                     int n) {
    for (int i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

/* ---- values produced earlier, per thread ---- */
enum kind { DEV, HOST, STREAM, EVENT, GRAPH, EXEC, NODE, KINDS };
#define KEPT 256

struct values {
    uintptr_t kept[KINDS][KEPT];
    unsigned long count[KINDS];
};

static __thread struct values produced;
static char host_buffer[1 << 20];   /* the host side of copies; the stand-in never touches it */

static void remember(enum kind kind, const void *value) {
    unsigned long n = produced.count[kind]++;
    if (n < KEPT)
        produced.kept[kind][n] = (uintptr_t)value;
}

static uintptr_t last_of(enum kind kind) {
    unsigned long n = produced.count[kind];
    if (n == 0)
        return 0;
    return produced.kept[kind][n <= KEPT ? n - 1 : KEPT - 1];
}

static uintptr_t nth_from_end(enum kind kind, unsigned long back) {
    unsigned long n = produced.count[kind];
    if (n > KEPT)
        n = KEPT;
    return back < n ? produced.kept[kind][n - 1 - back] : 0;
}

/* ---- parsing ---- */
#define MAX_FIELDS 16

struct op {
    const char *text;                 /* the whole op, for messages */
    char *field[MAX_FIELDS];          /* field[0] = name */
    int nfields;
};

static void die(const char *what, const char *text) {
    fprintf(stderr, "cuda_driver_prog: %s: %s\n", what, text);
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

static long long signed_number(const char *s, const char *text) {
    char *end;
    long long v;
    if (*s == '\0')
        die("empty number in", text);
    v = strtoll(s, &end, 0);
    if (*end != '\0')
        die("bad number in", text);
    return v;
}

static int has(const struct op *op, int i) { return i < op->nfields && op->field[i][0] != '\0'; }

static unsigned long long num_at(const struct op *op, int i, unsigned long long fallback) {
    return has(op, i) ? number(op->field[i], op->text) : fallback;
}

static long long int_at(const struct op *op, int i, long long fallback) {
    return has(op, i) ? signed_number(op->field[i], op->text) : fallback;
}

static unsigned long long need_num(const struct op *op, int i) {
    if (!has(op, i))
        die("missing field in", op->text);
    return number(op->field[i], op->text);
}

static void *ref_at(const struct op *op, int i, enum kind kind) {
    const char *s;
    if (!has(op, i) || strcmp(op->field[i], "last") == 0)
        return (void *)last_of(kind);
    s = op->field[i];
    if (s[0] == '@') {
        unsigned long long want = number(s + 1, op->text);
        unsigned long n = produced.count[kind];
        if (want >= KEPT || want >= n)
            die("no such earlier value", op->text);
        return (void *)produced.kept[kind][want];
    }
    return (void *)(uintptr_t)number(s, op->text);
}

/* A reference whose default is not `last` but the given literal (e.g. stream 0). */
static void *ref_or(const struct op *op, int i, enum kind kind, uintptr_t fallback) {
    return has(op, i) ? ref_at(op, i, kind) : (void *)fallback;
}

static dim3 dims_at(const struct op *op, int i) {
    dim3 d = {1, 1, 1};
    unsigned int *part[3] = {&d.x, &d.y, &d.z};
    char copy[64], *save = NULL, *tok;
    int n = 0;
    if (!has(op, i))
        die("missing dimensions in", op->text);
    snprintf(copy, sizeof copy, "%s", op->field[i]);
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == 3)
            die("more than 3 dimensions in", op->text);
        *part[n++] = (unsigned int)number(tok, op->text);
    }
    return d;
}

/* Splits `text` at ':' into op->field; the copy lives as long as the op. */
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
    op->field[op->nfields++] = p;   /* the rest, colons included (loop/threads bodies) */
}

/* ---- running one op ---- */
struct outcome {
    cudaError_t ret;
    int printed_out;                  /* out is meaningful */
    uintptr_t out;
    const char *fn;
    char extra[256];                  /* " name=value ..." */
};

static void add(struct outcome *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* glibc prints a NULL %p as "(nil)": rewrite it as 0x0 so every pointer reads as hex. */
static void nil_as_zero(char *s) {
    char *nil;
    while ((nil = strstr(s, "(nil)")) != NULL) {
        memcpy(nil, "0x0", 3);
        memmove(nil + 3, nil + 5, strlen(nil + 5) + 1);
    }
}

static void add(struct outcome *r, const char *fmt, ...) {
    size_t used = strlen(r->extra);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->extra + used, sizeof r->extra - used, fmt, ap);
    va_end(ap);
    nil_as_zero(r->extra + used);
}

static void produced_value(struct outcome *r, enum kind kind, void *value) {
    r->printed_out = 1;
    r->out = (uintptr_t)value;
    if (r->ret == 0)
        remember(kind, value);
}

static void do_alloc(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    void *ptr = NULL;
    if (strcmp(name, "malloc") == 0) {
        size_t size = need_num(op, 1);
        r->fn = "cudaMalloc";
        r->ret = cudaMalloc(&ptr, size);
        add(r, " size=%zu", size);
        produced_value(r, DEV, ptr);
    } else if (strcmp(name, "mallocmanaged") == 0) {
        size_t size = need_num(op, 1);
        unsigned flags = num_at(op, 2, 1);
        r->fn = "cudaMallocManaged";
        r->ret = cudaMallocManaged(&ptr, size, flags);
        add(r, " size=%zu flags=%u", size, flags);
        produced_value(r, DEV, ptr);
    } else if (strcmp(name, "mallocasync") == 0) {
        size_t size = need_num(op, 1);
        void *stream = ref_or(op, 2, STREAM, 0);
        r->fn = "cudaMallocAsync";
        r->ret = cudaMallocAsync(&ptr, size, stream);
        add(r, " size=%zu stream=%p", size, stream);
        produced_value(r, DEV, ptr);
    } else if (strcmp(name, "mallocpitch") == 0) {
        size_t w = need_num(op, 1), h = need_num(op, 2), pitch = 0;
        r->fn = "cudaMallocPitch";
        r->ret = cudaMallocPitch(&ptr, &pitch, w, h);
        add(r, " pitch=%zu width=%zu height=%zu", pitch, w, h);
        produced_value(r, DEV, ptr);
    } else if (strcmp(name, "mallochost") == 0) {
        size_t size = need_num(op, 1);
        r->fn = "cudaMallocHost";
        r->ret = cudaMallocHost(&ptr, size);
        add(r, " size=%zu", size);
        produced_value(r, HOST, ptr);
    } else {   /* hostalloc */
        size_t size = need_num(op, 1);
        unsigned flags = num_at(op, 2, 0);
        r->fn = "cudaHostAlloc";
        r->ret = cudaHostAlloc(&ptr, size, flags);
        add(r, " size=%zu flags=%u", size, flags);
        produced_value(r, HOST, ptr);
    }
}

/* Default copy endpoints: the host buffer on the host side, the last device pointer otherwise. */
static void copy_ends(const struct op *op, int i, int kind, void **dst, void **src) {
    void *dev = (void *)last_of(DEV);
    *dst = (kind == 0 || kind == 2) ? (void *)host_buffer : dev;
    *src = (kind == 0 || kind == 1) ? (void *)host_buffer : dev;
    if (has(op, i))
        *dst = ref_at(op, i, DEV);
    if (has(op, i + 1))
        *src = ref_at(op, i + 1, DEV);
}

static void do_copy(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    void *dst, *src, *stream = NULL;
    if (strcmp(name, "memcpy") == 0 || strcmp(name, "memcpyptds") == 0) {
        size_t count = need_num(op, 1);
        int kind = (int)int_at(op, 2, 1);
        copy_ends(op, 3, kind, &dst, &src);
        if (name[6] == '\0') {
            r->fn = "cudaMemcpy";
            r->ret = cudaMemcpy(dst, src, count, kind);
        } else {
            r->fn = "cudaMemcpy_ptds";
            r->ret = cudaMemcpy_ptds(dst, src, count, kind);
        }
        add(r, " dst=%p src=%p count=%zu kind=%d", dst, src, count, kind);
    } else if (strcmp(name, "memcpyasync") == 0 || strcmp(name, "memcpyasyncptsz") == 0) {
        size_t count = need_num(op, 1);
        int kind = (int)int_at(op, 2, 1);
        stream = ref_or(op, 3, STREAM, 0);
        copy_ends(op, 4, kind, &dst, &src);
        if (name[11] == '\0') {
            r->fn = "cudaMemcpyAsync";
            r->ret = cudaMemcpyAsync(dst, src, count, kind, stream);
        } else {
            r->fn = "cudaMemcpyAsync_ptsz";
            r->ret = cudaMemcpyAsync_ptsz(dst, src, count, kind, stream);
        }
        add(r, " dst=%p src=%p count=%zu kind=%d stream=%p", dst, src, count, kind, stream);
    } else if (strcmp(name, "memcpy2d") == 0 || strcmp(name, "memcpy2dasync") == 0) {
        size_t w = need_num(op, 1), h = need_num(op, 2);
        int kind = (int)need_num(op, 3), async = name[8] != '\0', at = async ? 5 : 4;
        size_t dpitch = num_at(op, at, 512), spitch = num_at(op, at + 1, 512);
        copy_ends(op, MAX_FIELDS, kind, &dst, &src);
        if (async) {
            stream = ref_or(op, 4, STREAM, 0);
            r->fn = "cudaMemcpy2DAsync";
            r->ret = cudaMemcpy2DAsync(dst, dpitch, src, spitch, w, h, kind, stream);
            add(r, " stream=%p", stream);
        } else {
            r->fn = "cudaMemcpy2D";
            r->ret = cudaMemcpy2D(dst, dpitch, src, spitch, w, h, kind);
        }
        add(r, " dst=%p dpitch=%zu src=%p spitch=%zu width=%zu height=%zu kind=%d", dst, dpitch,
            src, spitch, w, h, kind);
    } else {   /* memcpypeer */
        size_t count = need_num(op, 1);
        int dd = (int)int_at(op, 2, 0), sd = (int)int_at(op, 3, 0);
        dst = src = (void *)last_of(DEV);
        r->fn = "cudaMemcpyPeer";
        r->ret = cudaMemcpyPeer(dst, dd, src, sd, count);
        add(r, " dst=%p dstDevice=%d src=%p srcDevice=%d count=%zu", dst, dd, src, sd, count);
    }
}

static void do_memset(const struct op *op, struct outcome *r) {
    int value = (int)int_at(op, 1, 0);
    size_t count = need_num(op, 2);
    if (strcmp(op->field[0], "memset") == 0) {
        void *ptr = ref_at(op, 3, DEV);
        r->fn = "cudaMemset";
        r->ret = cudaMemset(ptr, value, count);
        add(r, " ptr=%p value=%d count=%zu", ptr, value, count);
    } else {
        void *stream = ref_or(op, 3, STREAM, 0), *ptr = ref_at(op, 4, DEV);
        int ptsz = strcmp(op->field[0], "memsetasyncptsz") == 0;
        r->fn = ptsz ? "cudaMemsetAsync_ptsz" : "cudaMemsetAsync";
        r->ret = ptsz ? cudaMemsetAsync_ptsz(ptr, value, count, stream)
                      : cudaMemsetAsync(ptr, value, count, stream);
        add(r, " ptr=%p value=%d count=%zu stream=%p", ptr, value, count, stream);
    }
}

cudaError_t __cudaGetKernel(void **kernel, const void *entry);
cudaError_t cudaGetKernel(void **kernel, const void *entry);
static __thread void *last_kernel;

static void do_get_kernel(const struct op *op, struct outcome *r) {
    int public = strcmp(op->field[0], "cudagetkernel") == 0;
    void *kernel = NULL;
    r->fn = public ? "cudaGetKernel" : "__cudaGetKernel";
    r->ret = public ? cudaGetKernel(&kernel, (const void *)vec_add_kernel)
                    : __cudaGetKernel(&kernel, (const void *)vec_add_kernel);
    if (r->ret == 0)
        last_kernel = kernel;
    r->printed_out = 1;
    r->out = (uintptr_t)kernel;
    add(r, " entry=%p", (const void *)vec_add_kernel);
}

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, void *tid, void *bid,
                            void *bDim, void *gDim, int *wSize);

static void do_register(const struct op *op, struct outcome *r) {
    static void *fat_cubin;
    char *name = (char *)op->field[1];
    r->fn = "__cudaRegisterFunction";
    __cudaRegisterFunction(&fat_cubin, (const char *)vec_add_kernel, name, name, -1, NULL, NULL,
                           NULL, NULL, NULL);
    r->ret = 0;
    add(r, " stub=%p name=%s", (const void *)vec_add_kernel, name);
}

/* registermany:N:LEN: N registrations of N different stubs (vec_add_kernel + i: only
 * addresses to the runtime) with names of LEN bytes, as a framework's start-up makes them
 * (PyTorch: ~30,000 of a few hundred bytes). */
static void do_register_many(const struct op *op, struct outcome *r) {
    static void *fat_cubin;
    unsigned long long count = num_at(op, 1, 1), len = num_at(op, 2, 64);
    char name[4096];
    if (len < 16 || len >= sizeof name)
        die("name length out of 16..4095", op->text);
    r->fn = "__cudaRegisterFunction";
    for (unsigned long long i = 0; i < count; i++) {
        int head = snprintf(name, sizeof name, "_Z6k%08lluv", i);
        memset(name + head, 'x', len - head);
        name[len] = '\0';
        __cudaRegisterFunction(&fat_cubin, (const char *)vec_add_kernel + i, name, name, -1,
                               NULL, NULL, NULL, NULL, NULL);
    }
    r->ret = 0;
    add(r, " count=%llu stub=%p", count, (const void *)vec_add_kernel);
}

/* What nvcc generates for vec_add_kernel's `<<<>>>`: a host stub named after the mangled kernel
 * that launches it (here with the kernel handle of the last getkernel: CUDA 13's way). */
__attribute__((noinline, used)) cudaError_t
__device_stub__Z14vec_add_kernelPKfS0_Pfi(dim3 grid, dim3 block) {
    void *args[1] = {NULL};
    return cudaLaunchKernel(last_kernel, grid, block, args, 0, NULL);
}

static void do_launch(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    static int n = 1000;   /* static: `args` must point at storage that outlives the call */
    static __thread void *a, *b, *c;
    void *args[4] = {&a, &b, &c, &n};
    const void *func = strcmp(name, "launchnull") == 0 ? NULL : (const void *)vec_add_kernel;
    if (strcmp(name, "launchhandle") == 0)
        func = last_kernel;
    dim3 grid = dims_at(op, 1), block = dims_at(op, 2);
    size_t smem = num_at(op, 3, 0);
    void *stream = ref_or(op, 4, STREAM, 0);
    a = (void *)nth_from_end(DEV, 2);
    b = (void *)nth_from_end(DEV, 1);
    c = (void *)nth_from_end(DEV, 0);
    if (strcmp(name, "launch") == 0 || strcmp(name, "launchnull") == 0
        || strcmp(name, "launchhandle") == 0) {
        r->fn = "cudaLaunchKernel";
        r->ret = cudaLaunchKernel(func, grid, block, args, smem, stream);
    } else if (strcmp(name, "stublaunch") == 0) {
        r->fn = "cudaLaunchKernel";
        r->ret = __device_stub__Z14vec_add_kernelPKfS0_Pfi(grid, block);
    } else if (strcmp(name, "launchptsz") == 0) {
        r->fn = "cudaLaunchKernel_ptsz";
        r->ret = cudaLaunchKernel_ptsz(func, grid, block, args, smem, stream);
    } else if (strcmp(name, "coop") == 0) {
        r->fn = "cudaLaunchCooperativeKernel";
        r->ret = cudaLaunchCooperativeKernel(func, grid, block, args, smem, stream);
    } else {   /* launchex */
        cudaLaunchConfig_t config = {grid, block, smem, stream, NULL, 0};
        r->fn = "cudaLaunchKernelExC";
        r->ret = cudaLaunchKernelExC(&config, func, args);
        add(r, " config=%p", (void *)&config);   /* gone after the call; printed for matching */
    }
    add(r, " func=%p grid=%u,%u,%u block=%u,%u,%u args=%p smem=%zu stream=%p", func, grid.x,
        grid.y, grid.z, block.x, block.y, block.z, (void *)args, smem, stream);
}

static void do_stream(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    void *s = NULL;
    if (strcmp(name, "streamcreate") == 0) {
        r->fn = "cudaStreamCreate";
        r->ret = cudaStreamCreate(&s);
        produced_value(r, STREAM, s);
    } else if (strcmp(name, "streamcreateflags") == 0) {
        unsigned flags = need_num(op, 1);
        r->fn = "cudaStreamCreateWithFlags";
        r->ret = cudaStreamCreateWithFlags(&s, flags);
        add(r, " flags=%u", flags);
        produced_value(r, STREAM, s);
    } else if (strcmp(name, "streamcreateprio") == 0) {
        unsigned flags = need_num(op, 1);
        int prio = (int)int_at(op, 2, 0);
        r->fn = "cudaStreamCreateWithPriority";
        r->ret = cudaStreamCreateWithPriority(&s, flags, prio);
        add(r, " flags=%u priority=%d", flags, prio);
        produced_value(r, STREAM, s);
    } else if (strcmp(name, "streamwait") == 0) {
        void *e = ref_at(op, 2, EVENT);
        unsigned flags = num_at(op, 3, 0);
        s = ref_at(op, 1, STREAM);
        r->fn = "cudaStreamWaitEvent";
        r->ret = cudaStreamWaitEvent(s, e, flags);
        add(r, " stream=%p event=%p flags=%u", s, e, flags);
    } else {
        s = ref_at(op, 1, STREAM);
        if (strcmp(name, "streamdestroy") == 0) {
            r->fn = "cudaStreamDestroy";
            r->ret = cudaStreamDestroy(s);
        } else if (strcmp(name, "streamsync") == 0) {
            r->fn = "cudaStreamSynchronize";
            r->ret = cudaStreamSynchronize(s);
        } else if (strcmp(name, "streamsyncptsz") == 0) {
            r->fn = "cudaStreamSynchronize_ptsz";
            r->ret = cudaStreamSynchronize_ptsz(s);
        } else {
            r->fn = "cudaStreamQuery";
            r->ret = cudaStreamQuery(s);
        }
        add(r, " stream=%p", s);
    }
}

static void do_event(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    void *e = NULL;
    if (strcmp(name, "eventcreate") == 0) {
        r->fn = "cudaEventCreate";
        r->ret = cudaEventCreate(&e);
        produced_value(r, EVENT, e);
    } else if (strcmp(name, "eventcreateflags") == 0) {
        unsigned flags = need_num(op, 1);
        r->fn = "cudaEventCreateWithFlags";
        r->ret = cudaEventCreateWithFlags(&e, flags);
        add(r, " flags=%u", flags);
        produced_value(r, EVENT, e);
    } else if (strcmp(name, "eventrecord") == 0 || strcmp(name, "eventrecordptsz") == 0) {
        void *s = ref_or(op, 2, STREAM, 0);
        int ptsz = name[11] != '\0';
        e = ref_at(op, 1, EVENT);
        r->fn = ptsz ? "cudaEventRecord_ptsz" : "cudaEventRecord";
        r->ret = ptsz ? cudaEventRecord_ptsz(e, s) : cudaEventRecord(e, s);
        add(r, " event=%p stream=%p", e, s);
    } else if (strcmp(name, "elapsed") == 0) {
        void *start = ref_at(op, 1, EVENT), *end = ref_at(op, 2, EVENT);
        float ms = 0;
        uint32_t bits;
        r->fn = "cudaEventElapsedTime";
        r->ret = cudaEventElapsedTime(&ms, start, end);
        memcpy(&bits, &ms, sizeof bits);
        r->printed_out = 1;
        r->out = bits;
        add(r, " ms=%g start=%p end=%p", ms, start, end);
    } else {
        e = ref_at(op, 1, EVENT);
        if (strcmp(name, "eventsync") == 0) {
            r->fn = "cudaEventSynchronize";
            r->ret = cudaEventSynchronize(e);
        } else if (strcmp(name, "eventquery") == 0) {
            r->fn = "cudaEventQuery";
            r->ret = cudaEventQuery(e);
        } else {
            r->fn = "cudaEventDestroy";
            r->ret = cudaEventDestroy(e);
        }
        add(r, " event=%p", e);
    }
}

/* ---- graph construction ---- */
static char graph_symbol[1 << 16];   /* the "symbol" of the symbol copies */

/* The new node's dependencies: the node at field i, if given (else none). */
static size_t deps_at(const struct op *op, int i, cudaGraphNode_t *dep) {
    if (!has(op, i))
        return 0;
    *dep = ref_at(op, i, NODE);
    return 1;
}

static struct cudaKernelNodeParams kernel_params(const struct op *op, int i) {
    static int n = 1000;
    static void *args[4];
    struct cudaKernelNodeParams p = {(void *)vec_add_kernel, dims_at(op, i), dims_at(op, i + 1),
                                     (unsigned int)num_at(op, i + 2, 0), args, NULL};
    args[3] = &n;
    return p;
}

static void added_node(struct outcome *r, cudaGraphNode_t node, void *graph, size_t ndeps,
                       cudaGraphNode_t dep) {
    add(r, " graph=%p deps=%zu dep=%p", graph, ndeps, ndeps ? dep : NULL);
    produced_value(r, NODE, node);
}

static void do_add_node(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    cudaGraphNode_t node = NULL, dep = NULL;
    void *g;
    size_t ndeps;
    if (strcmp(name, "addkernel") == 0) {
        struct cudaKernelNodeParams p = kernel_params(op, 1);
        g = ref_at(op, 4, GRAPH);
        ndeps = deps_at(op, 5, &dep);
        r->fn = "cudaGraphAddKernelNode";
        r->ret = cudaGraphAddKernelNode(&node, g, &dep, ndeps, &p);
        add(r, " func=%p grid=%u,%u,%u block=%u,%u,%u smem=%u", p.func, p.gridDim.x,
            p.gridDim.y, p.gridDim.z, p.blockDim.x, p.blockDim.y, p.blockDim.z,
            p.sharedMemBytes);
    } else if (strcmp(name, "addmemcpy") == 0 || strcmp(name, "addmemcpy1d") == 0) {
        size_t count = need_num(op, 1);
        int kind = (int)int_at(op, 2, 1);
        void *dst, *src;
        copy_ends(op, MAX_FIELDS, kind, &dst, &src);
        g = ref_at(op, 3, GRAPH);
        ndeps = deps_at(op, 4, &dep);
        if (name[9] == '\0') {
            struct cudaMemcpy3DParms p;
            memset(&p, 0, sizeof p);
            p.srcPtr.ptr = (void *)src;
            p.srcPtr.pitch = p.srcPtr.xsize = count;
            p.srcPtr.ysize = 1;
            p.dstPtr = p.srcPtr;
            p.dstPtr.ptr = dst;
            p.extent.width = count;
            p.extent.height = p.extent.depth = 1;
            p.kind = kind;
            r->fn = "cudaGraphAddMemcpyNode";
            r->ret = cudaGraphAddMemcpyNode(&node, g, &dep, ndeps, &p);
        } else {
            r->fn = "cudaGraphAddMemcpyNode1D";
            r->ret = cudaGraphAddMemcpyNode1D(&node, g, &dep, ndeps, dst, src, count, kind);
        }
        add(r, " dst=%p src=%p count=%zu kind=%d", dst, src, count, kind);
    } else if (strcmp(name, "addtosymbol") == 0 || strcmp(name, "addfromsymbol") == 0) {
        size_t count = need_num(op, 1);
        int to = name[3] == 't';
        g = ref_at(op, 2, GRAPH);
        ndeps = 0;
        if (to) {
            r->fn = "cudaGraphAddMemcpyNodeToSymbol";
            r->ret = cudaGraphAddMemcpyNodeToSymbol(&node, g, NULL, 0, graph_symbol, host_buffer,
                                                    count, 0, 1);
        } else {
            r->fn = "cudaGraphAddMemcpyNodeFromSymbol";
            r->ret = cudaGraphAddMemcpyNodeFromSymbol(&node, g, NULL, 0, host_buffer,
                                                      graph_symbol, count, 0, 2);
        }
        add(r, " symbol=%p host=%p count=%zu", (void *)graph_symbol, (void *)host_buffer, count);
    } else if (strcmp(name, "addmemset") == 0) {
        struct cudaMemsetParams p = {(void *)last_of(DEV), 0, (unsigned int)int_at(op, 1, 0),
                                     (unsigned int)need_num(op, 2), need_num(op, 3),
                                     num_at(op, 4, 1)};
        p.pitch = p.width * p.elementSize;
        g = ref_at(op, 5, GRAPH);
        ndeps = deps_at(op, 6, &dep);
        r->fn = "cudaGraphAddMemsetNode";
        r->ret = cudaGraphAddMemsetNode(&node, g, &dep, ndeps, &p);
        add(r, " ptr=%p value=%u elem=%u width=%zu height=%zu", p.dst, p.value, p.elementSize,
            p.width, p.height);
    } else if (strcmp(name, "addchild") == 0) {
        void *child = ref_at(op, 1, GRAPH);
        g = ref_at(op, 2, GRAPH);
        ndeps = deps_at(op, 3, &dep);
        r->fn = "cudaGraphAddChildGraphNode";
        r->ret = cudaGraphAddChildGraphNode(&node, g, &dep, ndeps, child);
        add(r, " child=%p", child);
    } else if (strcmp(name, "addempty") == 0) {
        g = ref_at(op, 1, GRAPH);
        ndeps = deps_at(op, 2, &dep);
        r->fn = "cudaGraphAddEmptyNode";
        r->ret = cudaGraphAddEmptyNode(&node, g, &dep, ndeps);
    } else {   /* addeventrecord, addeventwait */
        void *e = ref_at(op, 1, EVENT);
        int wait = strcmp(name, "addeventwait") == 0;
        g = ref_at(op, 2, GRAPH);
        ndeps = 0;
        r->fn = wait ? "cudaGraphAddEventWaitNode" : "cudaGraphAddEventRecordNode";
        r->ret = wait ? cudaGraphAddEventWaitNode(&node, g, NULL, 0, e)
                      : cudaGraphAddEventRecordNode(&node, g, NULL, 0, e);
        add(r, " event=%p", e);
    }
    added_node(r, node, g, ndeps, dep);
}

static void do_graph_exec(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    if (strcmp(name, "capturetograph") == 0) {
        void *g = ref_at(op, 1, GRAPH), *s = ref_at(op, 2, STREAM);
        int mode = (int)int_at(op, 3, 0);
        r->fn = "cudaStreamBeginCaptureToGraph";
        r->ret = cudaStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, mode);
        add(r, " stream=%p graph=%p mode=%d", s, g, mode);
    } else if (strcmp(name, "exchangemode") == 0) {
        int mode = (int)int_at(op, 1, 0);
        r->fn = "cudaThreadExchangeStreamCaptureMode";
        add(r, " mode=%d", mode);
        r->ret = cudaThreadExchangeStreamCaptureMode(&mode);
        r->printed_out = 1;
        r->out = (uintptr_t)(unsigned)mode;
    } else if (strcmp(name, "graphcreate") == 0) {
        void *g = NULL;
        r->fn = "cudaGraphCreate";
        r->ret = cudaGraphCreate(&g, 0);
        produced_value(r, GRAPH, g);
    } else if (strcmp(name, "instantiateflags") == 0 || strcmp(name, "instantiateparams") == 0) {
        void *g = ref_at(op, 1, GRAPH), *x = NULL;
        if (name[11] == 'f') {
            unsigned long long flags = num_at(op, 2, 0);
            r->fn = "cudaGraphInstantiateWithFlags";
            r->ret = cudaGraphInstantiateWithFlags(&x, g, flags);
            add(r, " graph=%p flags=%llu", g, flags);
        } else {
            r->fn = "cudaGraphInstantiateWithParams";
            r->ret = cudaGraphInstantiateWithParams(&x, g, NULL);
            add(r, " graph=%p", g);
        }
        produced_value(r, EXEC, x);
    } else if (strcmp(name, "execkernelupdate") == 0) {
        struct cudaKernelNodeParams p = kernel_params(op, 1);
        void *x = ref_at(op, 4, EXEC), *node = ref_at(op, 5, NODE);
        r->fn = "cudaGraphExecKernelNodeSetParams";
        r->ret = cudaGraphExecKernelNodeSetParams(x, node, &p);
        add(r, " exec=%p node=%p func=%p grid=%u,%u,%u block=%u,%u,%u smem=%u", x, node, p.func,
            p.gridDim.x,
            p.gridDim.y, p.gridDim.z, p.blockDim.x, p.blockDim.y, p.blockDim.z,
            p.sharedMemBytes);
    } else if (strcmp(name, "execupdate") == 0) {
        void *x = ref_at(op, 1, EXEC), *g = ref_at(op, 2, GRAPH);
        r->fn = "cudaGraphExecUpdate";
        r->ret = cudaGraphExecUpdate(x, g, NULL);
        add(r, " exec=%p graph=%p", x, g);
    } else if (strcmp(name, "graphdestroy") == 0) {
        void *g = ref_at(op, 1, GRAPH);
        r->fn = "cudaGraphDestroy";
        r->ret = cudaGraphDestroy(g);
        add(r, " graph=%p", g);
    } else {   /* execdestroy */
        void *x = ref_at(op, 1, EXEC);
        r->fn = "cudaGraphExecDestroy";
        r->ret = cudaGraphExecDestroy(x);
        add(r, " exec=%p", x);
    }
}

static void do_graph(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    if (strcmp(name, "capture") == 0) {
        void *s = ref_at(op, 1, STREAM);
        int mode = (int)int_at(op, 2, 0);
        r->fn = "cudaStreamBeginCapture";
        r->ret = cudaStreamBeginCapture(s, mode);
        add(r, " stream=%p mode=%d", s, mode);
    } else if (strcmp(name, "endcapture") == 0) {
        void *s = ref_at(op, 1, STREAM), *g = NULL;
        r->fn = "cudaStreamEndCapture";
        r->ret = cudaStreamEndCapture(s, &g);
        add(r, " stream=%p", s);
        produced_value(r, GRAPH, g);
    } else if (strcmp(name, "instantiate") == 0) {
        void *g = ref_at(op, 1, GRAPH), *x = NULL;
        r->fn = "cudaGraphInstantiate";
        r->ret = cudaGraphInstantiate(&x, g, 0);
        add(r, " graph=%p flags=0", g);
        produced_value(r, EXEC, x);
    } else {   /* graphlaunch */
        void *x = ref_at(op, 1, EXEC), *s = ref_or(op, 2, STREAM, 0);
        r->fn = "cudaGraphLaunch";
        r->ret = cudaGraphLaunch(x, s);
        add(r, " exec=%p stream=%p", x, s);
    }
}

static void do_device(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    if (strcmp(name, "getdevice") == 0 || strcmp(name, "getdevicecount") == 0) {
        int value = -1;
        int count = name[9] != '\0';
        r->fn = count ? "cudaGetDeviceCount" : "cudaGetDevice";
        r->ret = count ? cudaGetDeviceCount(&value) : cudaGetDevice(&value);
        r->printed_out = 1;
        r->out = (uintptr_t)(unsigned)value;
    } else if (strcmp(name, "setdevice") == 0) {
        int device = (int)signed_number(has(op, 1) ? op->field[1] : "", op->text);
        r->fn = "cudaSetDevice";
        r->ret = cudaSetDevice(device);
        add(r, " device=%d", device);
    } else if (strcmp(name, "meminfo") == 0) {
        size_t free_bytes = 0, total = 0;
        r->fn = "cudaMemGetInfo";
        r->ret = cudaMemGetInfo(&free_bytes, &total);
        r->printed_out = 1;
        r->out = free_bytes;
        add(r, " total=%zu", total);
    } else if (strcmp(name, "devsync") == 0) {
        r->fn = "cudaDeviceSynchronize";
        r->ret = cudaDeviceSynchronize();
    } else if (strcmp(name, "devreset") == 0) {
        r->fn = "cudaDeviceReset";
        r->ret = cudaDeviceReset();
    } else if (strcmp(name, "getlasterror") == 0) {
        r->fn = "cudaGetLastError";
        r->ret = cudaGetLastError();
    } else {   /* peeklasterror */
        r->fn = "cudaPeekAtLastError";
        r->ret = cudaPeekAtLastError();
    }
}

static void do_free(const struct op *op, struct outcome *r) {
    const char *name = op->field[0];
    if (strcmp(name, "free") == 0) {
        void *ptr = ref_at(op, 1, DEV);
        r->fn = "cudaFree";
        r->ret = cudaFree(ptr);
        add(r, " ptr=%p", ptr);
    } else if (strcmp(name, "freehost") == 0) {
        void *ptr = ref_at(op, 1, HOST);
        r->fn = "cudaFreeHost";
        r->ret = cudaFreeHost(ptr);
        add(r, " ptr=%p", ptr);
    } else if (strcmp(name, "hostregister") == 0) {
        size_t size = need_num(op, 1);
        unsigned flags = (unsigned)num_at(op, 2, 0);
        r->fn = "cudaHostRegister";
        r->ret = cudaHostRegister(host_buffer, size, flags);
        add(r, " ptr=%p size=%zu flags=%u", (void *)host_buffer, size, flags);
    } else if (strcmp(name, "hostunregister") == 0) {
        r->fn = "cudaHostUnregister";
        r->ret = cudaHostUnregister(host_buffer);
        add(r, " ptr=%p", (void *)host_buffer);
    } else {   /* freeasync */
        void *ptr = ref_at(op, 1, DEV), *stream = ref_or(op, 2, STREAM, 0);
        r->fn = "cudaFreeAsync";
        r->ret = cudaFreeAsync(ptr, stream);
        add(r, " ptr=%p stream=%p", ptr, stream);
    }
}

typedef void (*handler)(const struct op *, struct outcome *);

static const struct {
    const char *name;
    handler run;
} HANDLERS[] = {
    {"malloc", do_alloc}, {"mallocmanaged", do_alloc}, {"mallocasync", do_alloc},
    {"mallocpitch", do_alloc}, {"mallochost", do_alloc}, {"hostalloc", do_alloc},
    {"free", do_free}, {"freehost", do_free}, {"freeasync", do_free},
    {"hostregister", do_free}, {"hostunregister", do_free},
    {"memcpy", do_copy}, {"memcpyptds", do_copy}, {"memcpyasync", do_copy},
    {"memcpyasyncptsz", do_copy}, {"memcpy2d", do_copy}, {"memcpy2dasync", do_copy},
    {"memcpypeer", do_copy},
    {"memset", do_memset}, {"memsetasync", do_memset}, {"memsetasyncptsz", do_memset},
    {"meminfo", do_device}, {"getdevicecount", do_device}, {"getdevice", do_device},
    {"setdevice", do_device}, {"devsync", do_device}, {"devreset", do_device},
    {"getlasterror", do_device}, {"peeklasterror", do_device},
    {"streamcreate", do_stream}, {"streamcreateflags", do_stream},
    {"streamcreateprio", do_stream}, {"streamdestroy", do_stream}, {"streamsync", do_stream},
    {"streamsyncptsz", do_stream}, {"streamquery", do_stream}, {"streamwait", do_stream},
    {"eventcreate", do_event}, {"eventcreateflags", do_event}, {"eventrecord", do_event},
    {"eventrecordptsz", do_event}, {"eventsync", do_event}, {"eventquery", do_event},
    {"eventdestroy", do_event}, {"elapsed", do_event},
    {"launch", do_launch}, {"launchptsz", do_launch}, {"coop", do_launch},
    {"launchex", do_launch}, {"launchnull", do_launch}, {"launchhandle", do_launch}, {"stublaunch", do_launch},
    {"getkernel", do_get_kernel}, {"cudagetkernel", do_get_kernel},
    {"register", do_register}, {"registermany", do_register_many},
    {"capture", do_graph}, {"endcapture", do_graph}, {"instantiate", do_graph},
    {"graphlaunch", do_graph},
    {"addkernel", do_add_node}, {"addmemcpy", do_add_node}, {"addmemcpy1d", do_add_node},
    {"addtosymbol", do_add_node}, {"addfromsymbol", do_add_node}, {"addmemset", do_add_node},
    {"addchild", do_add_node}, {"addempty", do_add_node}, {"addeventrecord", do_add_node},
    {"addeventwait", do_add_node},
    {"capturetograph", do_graph_exec}, {"exchangemode", do_graph_exec},
    {"graphcreate", do_graph_exec}, {"instantiateflags", do_graph_exec},
    {"instantiateparams", do_graph_exec}, {"execkernelupdate", do_graph_exec},
    {"execupdate", do_graph_exec}, {"graphdestroy", do_graph_exec},
    {"execdestroy", do_graph_exec},
};

static handler find_handler(const char *name) {
    for (size_t i = 0; i < sizeof HANDLERS / sizeof HANDLERS[0]; i++)
        if (strcmp(HANDLERS[i].name, name) == 0)
            return HANDLERS[i].run;
    return NULL;
}

static void print_outcome(const char *name, const struct outcome *r) {
    if (r->printed_out)
        printf("%s ret=%d out=0x%lx fn=%s%s\n", name, r->ret, (unsigned long)r->out, r->fn,
               r->extra);
    else
        printf("%s ret=%d out=- fn=%s%s\n", name, r->ret, r->fn, r->extra);
}

/* Parses a single CUDA op (not loop/threads/sleep); exits 2 if it is malformed or unknown. */
static handler parse_call(struct op *op, const char *text) {
    handler run;
    split(op, text, MAX_FIELDS);
    run = find_handler(op->field[0]);
    if (run == NULL)
        die("unknown op", text);
    return run;
}

struct repeat {
    struct op op;
    handler run;
    unsigned long times;
    unsigned long errors;
    cudaError_t first_error;
    const char *fn;
};

static void *repeat_calls(void *arg) {
    struct repeat *rep = arg;
    for (unsigned long i = 0; i < rep->times; i++) {
        struct outcome r = {0};
        rep->run(&rep->op, &r);
        rep->fn = r.fn;
        if (r.ret != 0) {
            if (rep->errors++ == 0)
                rep->first_error = r.ret;
        }
    }
    return NULL;
}

static void run_loop(const char *text) {
    struct op head;
    struct repeat rep = {0};
    split(&head, text, 3);
    if (head.nfields < 3)
        die("loop needs loop:N:OP", text);
    rep.times = number(head.field[1], text);
    rep.run = parse_call(&rep.op, head.field[2]);
    rep.fn = "-";
    repeat_calls(&rep);
    printf("loop ret=%d out=- fn=%s n=%lu errors=%lu op=%s\n", rep.first_error, rep.fn,
           rep.times, rep.errors, head.field[2]);
}

static void run_threads(const char *text) {
    struct op head;
    unsigned long nthreads, errors = 0;
    cudaError_t first = 0;
    const char *fn = "-";
    struct repeat *reps;
    pthread_t *tids;
    split(&head, text, 4);
    if (head.nfields < 4)
        die("threads needs threads:T:N:OP", text);
    nthreads = number(head.field[1], text);
    reps = calloc(nthreads ? nthreads : 1, sizeof *reps);
    tids = calloc(nthreads ? nthreads : 1, sizeof *tids);
    for (unsigned long t = 0; t < nthreads; t++) {
        reps[t].times = number(head.field[2], text);
        reps[t].run = parse_call(&reps[t].op, head.field[3]);
        if (pthread_create(&tids[t], NULL, repeat_calls, &reps[t]) != 0)
            die("pthread_create failed for", text);
    }
    for (unsigned long t = 0; t < nthreads; t++) {
        pthread_join(tids[t], NULL);
        if (reps[t].fn)
            fn = reps[t].fn;
        if (reps[t].errors && errors == 0)
            first = reps[t].first_error;
        errors += reps[t].errors;
    }
    printf("threads ret=%d out=- fn=%s t=%lu n=%lu errors=%lu op=%s\n", first, fn, nthreads,
           nthreads * (unsigned long)number(head.field[2], text), errors, head.field[3]);
    free(reps);
    free(tids);
}

static void sleep_ms(unsigned long long ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void run_op(const char *text) {
    struct op op;
    struct outcome r = {0};
    handler run;
    if (strncmp(text, "loop:", 5) == 0) {
        run_loop(text);
        return;
    }
    if (strncmp(text, "threads:", 8) == 0) {
        run_threads(text);
        return;
    }
    if (strncmp(text, "sleep:", 6) == 0) {
        sleep_ms(number(text + 6, text));
        return;
    }
    run = parse_call(&op, text);
    run(&op, &r);
    print_outcome(op.field[0], &r);
}

int main(int argc, char **argv) {
    int i = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a test reads lines while the program runs */
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--sleep-before") == 0 && i + 1 < argc) {
            i++;
            sleep_ms(number(argv[i], argv[i]));
        } else if (strcmp(argv[i], "--wait-stdin") == 0) {
            char line[64];
            printf("ready pid=%d\n", (int)getpid());
            if (fgets(line, sizeof line, stdin) == NULL) {
                /* EOF also means go */
            }
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
