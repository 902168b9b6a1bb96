/*
 * fakecuda_driver.c: a stand-in for NVIDIA's CUDA driver library (libcuda.so.1), for
 * end-to-end tests of the driver-API rows without a GPU.
 *
 * Built by tests (tests/fakecuda_driver.py) as `libcuda.so.1` (soname libcuda.so.1) with
 *   gcc -O2 -g -shared -fPIC -fno-omit-frame-pointer -fcf-protection=none -fno-shrink-wrap
 *       -fno-ipa-icf -fno-optimize-sibling-calls -Wl,-soname,libcuda.so.1
 * so every exported function begins with `push %rbp` and no two share an address.
 *
 * Every function has the real signature (cuda.h of CUDA 12/13) and a deterministic result.
 * Nothing touches memory except the documented out-parameters; "pointers" are not backed.
 *
 * Counters are process-wide, atomic, start at 0 ("k" = the value before the call) and count
 * successful calls only:
 *   contexts      cuCtxCreate_v2/_v4, cuDevicePrimaryCtxRetain   *ctx = 0xc000 + k
 *   device memory cuMemAlloc_v2, cuMemAllocAsync, cuMemAllocManaged
 *                                     *ptr = 0x7d0000000000 + k * 0x100000
 *   host memory   cuMemHostAlloc      *ptr = 0x7c0000000000 + k * 0x100000
 *   reservations  cuMemAddressReserve *ptr = addr if addr != 0, else 0x7b0000000000 + k * 0x100000
 *   allocations   cuMemCreate         *handle = 0xa000 + k
 *   modules       cuModuleLoadData/Ex *module = 0x3000 + k
 *   libraries     cuLibraryLoadData   *library = 0x4000 + k
 *   kernels       cuLibraryGetKernel  *kernel = 0x20000 + k * 0x10
 *   functions     cuModuleGetFunction, cuKernelGetFunction   *function = 0x10000 + k * 0x10
 * Functions and kernels remember their name (up to 1023 bytes, 256 of each); cuFuncGetName
 * returns a pointer to the remembered copy, cuKernelGetFunction gives the kernel's name to the
 * new function.
 *
 * Results, CUresult (first matching rule wins; otherwise 0 = CUDA_SUCCESS):
 *   every function but cuInit          3 (NOT_INITIALIZED) before a successful cuInit
 *   cuInit(flags)                      1 (INVALID_VALUE) if flags != 0
 *   cuCtxCreate_v2(p, flags, dev)      1 if p NULL; 101 (INVALID_DEVICE) if dev not in [0, 2)
 *   cuCtxCreate_v4(p, params, f, dev)  as cuCtxCreate_v2 (params may be NULL)
 *   cuDevicePrimaryCtxRetain(p, dev)   as cuCtxCreate_v2
 *   cuCtxDestroy_v2(ctx)               201 (INVALID_CONTEXT) if ctx NULL
 *   cuCtxSynchronize()                 201 if no context was ever created
 *   cuCtxSetCurrent(ctx)               0 (NULL unbinds the thread's context)
 *   cuCtxPushCurrent_v2(ctx)           201 if ctx NULL; else the thread's stack grows
 *   cuCtxPopCurrent_v2(p)              201 if the thread's stack is empty; *p = its top
 *   cuMemAlloc_v2(p, n), cuMemAllocAsync(p, n, s) (+_ptsz), cuMemAllocManaged(p, n, flags)
 *                                      1 if p NULL or n == 0 (or managed flags not 1/2);
 *                                      2 (OUT_OF_MEMORY) if n > 1<<40
 *   cuMemHostAlloc(p, n, flags)        1 if p NULL or flags > 15; 2 if n > 1<<40
 *   cuMemFree_v2, cuMemFreeAsync(+_ptsz)   0 (NULL too)
 *   cuMemAllocHost_v2(p, n)            a host pointer, as cuMemHostAlloc; cuMemFreeHost 0
 *   cuMemHostRegister_v2(p, n, flags)  1 (INVALID_VALUE) if p NULL or n 0; cuMemHostUnregister(p)
 *                                      1 if p NULL
 *   cuMemAllocPitch_v2(p, pitch, w, h, e)  *pitch = w rounded up to 512, a device pointer of
 *                                      pitch * h bytes; 1 if pitch NULL or e not 4, 8 or 16
 *   cuMemcpy*(dst, src, n[, stream])   1 if dst or src is 0; copies nothing (all variants)
 *   cuMemsetD8/D32(_v2, Async)(p, v, n[, s])   1 if p is 0
 *   cuMemCreate(h, size, prop, flags)  1 if h or prop NULL, size 0 or flags != 0
 *   cuMemAddressReserve(p, size, align, addr, flags)   1 if p NULL or size 0
 *   cuMemMap(ptr, size, off, h, flags) 1 if ptr, size or h is 0
 *   cuMemUnmap(ptr, size)              1 if ptr or size is 0
 *   cuMemRelease(h)                    1 if h is 0
 *   cuLaunchKernel(f, gx,gy,gz, bx,by,bz, smem, stream, params, extra) (+_ptsz),
 *   cuLaunchCooperativeKernel(... params) (+_ptsz)   400 (INVALID_HANDLE) if f NULL; 1 if a grid/block
 *                                      dimension is 0 or bx*by*bz > 1024;
 *                                      701 (LAUNCH_OUT_OF_RESOURCES) if smem > 0xc000
 *   cuLaunchKernelEx(config, f, params, extra) (+_ptsz)   1 if config NULL; then as cuLaunchKernel
 *   cuGraphLaunch(exec, stream) (+_ptsz)   400 if exec NULL
 * CUDA graphs (handles: graphs *g = 0x60000 + k, execs *x = 0x70000 + k, nodes *n = 0x80000 + k,
 * one counter each, successful calls only):
 *   cuStreamBeginCapture_v2(s, mode) (+_ptsz)   1 if mode > 2
 *   cuStreamBeginCaptureToGraph(s, g, deps, data, n, mode) (+_ptsz)   1 if mode > 2; 400 if g NULL
 *   cuStreamEndCapture(s, g) (+_ptsz)  1 if g NULL; *g = next graph
 *   cuThreadExchangeStreamCaptureMode(m)   1 if m NULL; swaps *m with the thread's mode
 *   cuGraphCreate(g, flags)            1 if g NULL or flags != 0; *g = next graph
 *   cuGraphAdd*Node(node, graph, deps, n, ...)   1 if node NULL, or deps NULL with n > 0;
 *                                      400 if graph NULL; KernelNode_v2(..., params): 1 if
 *                                      params NULL, 400 if its func NULL; MemcpyNode(..., p3d,
 *                                      ctx), MemsetNode(..., params, ctx): 1 if NULL;
 *                                      ChildGraphNode(..., child), EventRecord/WaitNode(..., e):
 *                                      400 if NULL; EmptyNode: 0. Success: *node = next node
 *   cuGraphInstantiateWithFlags(x, g, flags), cuGraphInstantiate_v2(x, g, err, log, size),
 *   cuGraphInstantiateWithParams(x, g, p) (+_ptsz)   1 if x NULL; 400 if g NULL; *x = next exec
 *   cuGraphExecKernelNodeSetParams_v2(x, node, params)   400 if x or node NULL; 1 if params NULL
 *   cuGraphExecUpdate_v2(x, g, info)   400 if x or g NULL
 *   cuGraphDestroy(g), cuGraphExecDestroy(x)   400 if NULL
 *   cuStreamSynchronize(s) (+_ptsz)    0
 *   cuEventSynchronize(e)              400 if e NULL
 *   cuModuleLoadData(m, image), cuModuleLoadDataEx(m, image, n, opts, vals),
 *   cuLibraryLoadData(l, code, ...)    1 if out NULL or image NULL; 200 (INVALID_IMAGE) if the
 *                                      image is an empty string
 *   cuModuleGetFunction(f, mod, name), cuLibraryGetKernel(k, lib, name)
 *                                      1 if f or name NULL; 400 if mod NULL; 500 (NOT_FOUND)
 *                                      if name is empty or starts with "missing"
 *   cuKernelGetFunction(f, kernel)     1 if f NULL; 400 if kernel unknown
 *   cuFuncGetName(name, f)             1 if name NULL; 400 if f unknown
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#pragma GCC optimize("no-optimize-sibling-calls", "no-shrink-wrap", "no-ipa-icf")

#define EXPORT __attribute__((visibility("default")))
#define HELPER static __attribute__((noinline))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUlibrary;
typedef void *CUkernel;
typedef void *CUgraphExec;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef struct CUctxCreateParams_st CUctxCreateParams;   /* opaque here */
typedef struct CUmemAllocationProp_st CUmemAllocationProp; /* opaque here */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;     /* opaque here */

/* Layout of CUDA 12/13 `CUlaunchConfig` (56 bytes): hStream at offset 32. */
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
};

#define CTX_BASE 0xc000ULL
#define DEVICE_BASE 0x7d0000000000ULL
#define HOST_BASE 0x7c0000000000ULL
#define VA_BASE 0x7b0000000000ULL
#define ALLOC_STRIDE 0x100000ULL
#define MEMHANDLE_BASE 0xa000ULL
#define MODULE_BASE 0x3000ULL
#define LIBRARY_BASE 0x4000ULL
#define FUNCTION_BASE 0x10000ULL
#define KERNEL_BASE 0x20000ULL
#define NAMED_STRIDE 0x10ULL
#define MAX_ALLOC (1ULL << 40)
#define DEVICE_COUNT 2
#define MAX_SMEM 0xc000u
#define MAX_NAMED 256
#define NAME_MAX_LEN 8192

static int initialized;
static unsigned long long contexts, device_allocs, host_allocs, reservations, memhandles,
    modules, libraries, nfunctions, nkernels;
static char function_names[MAX_NAMED][NAME_MAX_LEN];
static char kernel_names[MAX_NAMED][NAME_MAX_LEN];

static unsigned long long next_index(unsigned long long *counter) {
    return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

static void *next_handle(unsigned long long *counter, unsigned long long base,
                         unsigned long long stride) {
    return (void *)(uintptr_t)(base + next_index(counter) * stride);
}

HELPER CUresult ready(int variant) {
    (void)variant;   /* keeps the per-function callers apart */
    return __atomic_load_n(&initialized, __ATOMIC_RELAXED) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_NOT_INITIALIZED;
}

/* A remembered name's slot from its handle, or -1. */
static long named_slot(const void *handle, unsigned long long base, unsigned long long count) {
    uintptr_t h = (uintptr_t)handle;
    if (h < base || (h - base) % NAMED_STRIDE)
        return -1;
    h = (h - base) / NAMED_STRIDE;
    return h < count && h < MAX_NAMED ? (long)h : -1;
}

HELPER void *remember_name(char names[][NAME_MAX_LEN], unsigned long long *counter,
                           unsigned long long base, const char *name) {
    unsigned long long k = next_index(counter);
    if (k < MAX_NAMED) {
        strncpy(names[k], name, NAME_MAX_LEN - 1);
        names[k][NAME_MAX_LEN - 1] = '\0';
    }
    return (void *)(uintptr_t)(base + k * NAMED_STRIDE);
}

/* ---- initialization and contexts ---- */

/* A helper, so that cuInit is not a leaf (gcc drops a leaf's frame setup). */
HELPER CUresult initialize(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned int flags) { return initialize(flags); }

HELPER CUresult new_context(CUcontext *pctx, CUdevice dev, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= DEVICE_COUNT)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = next_handle(&contexts, CTX_BASE, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return new_context(pctx, dev, 1);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev) {
    (void)params; (void)flags;
    return new_context(pctx, dev, 2);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    return new_context(pctx, dev, 3);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult r = ready(4);
    if (r)
        return r;
    return ctx == NULL ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    CUresult r = ready(5);
    if (r)
        return r;
    return __atomic_load_n(&contexts, __ATOMIC_RELAXED) ? CUDA_SUCCESS
                                                        : CUDA_ERROR_INVALID_CONTEXT;
}

/* The thread's context stack: cuCtxSetCurrent replaces its top, push and pop move it. */
static __thread CUcontext context_stack[16];
static __thread int context_depth;

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUresult r = ready(6);
    if (r)
        return r;
    if (context_depth == 0)
        context_depth = 1;
    context_stack[context_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CUresult r = ready(7);
    if (r)
        return r;
    if (ctx == NULL || context_depth == 16)
        return CUDA_ERROR_INVALID_CONTEXT;
    context_stack[context_depth++] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CUresult r = ready(8);
    if (r)
        return r;
    if (context_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = context_stack[--context_depth];
    if (pctx != NULL)
        *pctx = top;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

HELPER CUresult alloc(void *out, size_t size, unsigned long long *counter,
                      unsigned long long base, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (out == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > MAX_ALLOC)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(void **)out = next_handle(counter, base, ALLOC_STRIDE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    return alloc(dptr, bytesize, &device_allocs, DEVICE_BASE, 10);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream;
    return alloc(dptr, bytesize, &device_allocs, DEVICE_BASE, 11);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream;
    return alloc(dptr, bytesize, &device_allocs, DEVICE_BASE, 12);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (ready(13) == CUDA_SUCCESS && flags != 1 && flags != 2)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc(dptr, bytesize, &device_allocs, DEVICE_BASE, 13);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    if (ready(14) == CUDA_SUCCESS && flags > 15)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc(pp, bytesize, &host_allocs, HOST_BASE, 14);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { (void)dptr; return ready(15); }

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    return alloc(pp, bytesize, &host_allocs, HOST_BASE, 90);
}

EXPORT CUresult cuMemFreeHost(void *p) { (void)p; return ready(91); }

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags) {
    (void)flags;
    if (ready(93) == CUDA_SUCCESS && (p == NULL || bytesize == 0))
        return CUDA_ERROR_INVALID_VALUE;
    return ready(93);
}

EXPORT CUresult cuMemHostUnregister(void *p) {
    if (ready(94) == CUDA_SUCCESS && p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return ready(94);
}

/* pitch = width rounded up to 512 bytes; the allocation is pitch * height bytes. */
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width,
                                   size_t height, unsigned int elementSize) {
    if (ready(92) == CUDA_SUCCESS && (pPitch == NULL || (elementSize != 4 && elementSize != 8
                                                          && elementSize != 16)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (width + 511) & ~(size_t)511;
    CUresult r = alloc(dptr, pitch * height, &device_allocs, DEVICE_BASE, 92);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    (void)dptr; (void)hStream;
    return ready(16);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    (void)dptr; (void)hStream;
    return ready(17);
}

/* ---- copies and sets ---- */

HELPER CUresult copy(uintptr_t dst, uintptr_t src, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    return dst == 0 || src == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

#define COPY(name, dst_t, src_t, variant) \
    EXPORT CUresult name(dst_t dst, src_t src, size_t n) { \
        (void)n; \
        return copy((uintptr_t)dst, (uintptr_t)src, variant); \
    }
#define COPY_ASYNC(name, dst_t, src_t, variant) \
    EXPORT CUresult name(dst_t dst, src_t src, size_t n, CUstream hStream) { \
        (void)n; (void)hStream; \
        return copy((uintptr_t)dst, (uintptr_t)src, variant); \
    }

COPY(cuMemcpy, CUdeviceptr, CUdeviceptr, 20)
COPY(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr, 21)
COPY(cuMemcpyHtoD_v2, CUdeviceptr, const void *, 22)
COPY(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void *, 23)
COPY(cuMemcpyDtoH_v2, void *, CUdeviceptr, 24)
COPY(cuMemcpyDtoH_v2_ptds, void *, CUdeviceptr, 25)
COPY(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, 26)
COPY(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr, 27)
COPY_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, 28)
COPY_ASYNC(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, 29)
COPY_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, 30)
COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *, 31)
COPY_ASYNC(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, 32)
COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr, 33)
COPY_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, 34)
COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr, 35)

HELPER CUresult set(CUdeviceptr ptr, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    return ptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
    (void)v; (void)n;
    return set(p, 40);
}

EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr p, unsigned char v, size_t n) {
    (void)v; (void)n;
    return set(p, 41);
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned int v, size_t n) {
    (void)v; (void)n;
    return set(p, 42);
}

EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr p, unsigned int v, size_t n) {
    (void)v; (void)n;
    return set(p, 43);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)v; (void)n; (void)s;
    return set(p, 44);
}

EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)v; (void)n; (void)s;
    return set(p, 45);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream s) {
    (void)v; (void)n; (void)s;
    return set(p, 46);
}

EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr p, unsigned int v, size_t n, CUstream s) {
    (void)v; (void)n; (void)s;
    return set(p, 47);
}

/* ---- virtual memory management ---- */

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult r = ready(50);
    if (r)
        return r;
    if (handle == NULL || prop == NULL || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = MEMHANDLE_BASE + next_index(&memhandles);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
    CUresult r = ready(51);
    (void)alignment; (void)flags;
    if (r)
        return r;
    if (ptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *ptr = addr ? addr : VA_BASE + next_index(&reservations) * ALLOC_STRIDE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CUresult r = ready(52);
    (void)offset; (void)flags;
    if (r)
        return r;
    return ptr == 0 || size == 0 || handle == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult r = ready(53);
    if (r)
        return r;
    return ptr == 0 || size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult r = ready(54);
    if (r)
        return r;
    return handle == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- launches ---- */

HELPER CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, int variant) {
    unsigned long long threads = (unsigned long long)bx * by * bz;
    CUresult r = ready(variant);
    if (r)
        return r;
    if (f == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return smem > MAX_SMEM ? CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES : CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream,
                               void **kernelParams, void **extra) {
    (void)hStream; (void)kernelParams; (void)extra;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, 60);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    (void)hStream; (void)kernelParams; (void)extra;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, 61);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                          unsigned int gridDimY, unsigned int gridDimZ,
                                          unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes,
                                          CUstream hStream, void **kernelParams) {
    (void)hStream; (void)kernelParams;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, 62);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                               unsigned int gridDimY, unsigned int gridDimZ,
                                               unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ,
                                               unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    (void)hStream; (void)kernelParams;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, 67);
}

HELPER CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (c == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, variant);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                 void **kernelParams, void **extra) {
    (void)kernelParams; (void)extra;
    return launch_ex(config, f, 63);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra) {
    (void)kernelParams; (void)extra;
    return launch_ex(config, f, 64);
}

HELPER CUresult need_handle(const void *handle, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    return handle == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hStream;
    return need_handle(hGraphExec, 65);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hStream;
    return need_handle(hGraphExec, 66);
}

/* ---- graphs ---- */

typedef void *CUgraph;
typedef void *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;                   /* opaque here */
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS; /* opaque */
typedef struct CUgraphExecUpdateResultInfo_st CUgraphExecUpdateResultInfo;    /* opaque */
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;                       /* not read here */
typedef struct CUDA_MEMSET_NODE_PARAMS_st CUDA_MEMSET_NODE_PARAMS;   /* not read here */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

#define GRAPH_BASE 0x60000ULL
#define EXEC_BASE 0x70000ULL
#define NODE_BASE 0x80000ULL

static unsigned long long ngraphs, nexecs, nnodes;
static __thread int capture_mode;

HELPER CUresult begin_capture(CUgraph graph, int need_graph, int mode, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (mode < 0 || mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    return need_graph && graph == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode) {
    (void)hStream;
    return begin_capture(NULL, 0, mode, 200);
}

EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode) {
    (void)hStream;
    return begin_capture(NULL, 0, mode, 201);
}

EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                            const CUgraphNode *dependencies,
                                            const CUgraphEdgeData *dependencyData,
                                            size_t numDependencies, int mode) {
    (void)hStream; (void)dependencies; (void)dependencyData; (void)numDependencies;
    return begin_capture(hGraph, 1, mode, 202);
}

EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                 const CUgraphNode *dependencies,
                                                 const CUgraphEdgeData *dependencyData,
                                                 size_t numDependencies, int mode) {
    (void)hStream; (void)dependencies; (void)dependencyData; (void)numDependencies;
    return begin_capture(hGraph, 1, mode, 203);
}

HELPER CUresult new_graph_handle(void *out, unsigned long long *counter,
                                 unsigned long long base, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *(void **)out = next_handle(counter, base, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    (void)hStream;
    return new_graph_handle(phGraph, &ngraphs, GRAPH_BASE, 204);
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    (void)hStream;
    return new_graph_handle(phGraph, &ngraphs, GRAPH_BASE, 205);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    int previous;
    CUresult r = ready(206);
    if (r)
        return r;
    if (mode == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    if (ready(207) == CUDA_SUCCESS && flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_graph_handle(phGraph, &ngraphs, GRAPH_BASE, 207);
}

/* The checks of every cuGraphAdd*Node, then `code`; a new node on success. */
HELPER CUresult add_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                         CUresult code, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (node == NULL || (deps == NULL && n > 0))
        return CUDA_ERROR_INVALID_VALUE;
    if (graph == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (code != CUDA_SUCCESS)
        return code;
    *node = next_handle(&nnodes, NODE_BASE, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                        const CUgraphNode *dependencies, size_t numDependencies,
                                        const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
    CUresult code = nodeParams == NULL ? CUDA_ERROR_INVALID_VALUE
                    : nodeParams->func == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 210);
}

EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                     const CUgraphNode *dependencies, size_t numDependencies,
                                     const CUDA_MEMCPY3D *copyParams, CUcontext ctx) {
    (void)ctx;
    CUresult code = copyParams == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 211);
}

EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                     const CUgraphNode *dependencies, size_t numDependencies,
                                     const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx) {
    (void)ctx;
    CUresult code = memsetParams == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 212);
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         CUgraph childGraph) {
    CUresult code = childGraph == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 213);
}

EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                    const CUgraphNode *dependencies, size_t numDependencies) {
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, CUDA_SUCCESS, 214);
}

EXPORT CUresult cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          size_t numDependencies, CUevent event) {
    CUresult code = event == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 215);
}

EXPORT CUresult cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                        const CUgraphNode *dependencies, size_t numDependencies,
                                        CUevent event) {
    CUresult code = event == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, code, 216);
}

HELPER CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (hGraph == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    *phGraphExec = next_handle(&nexecs, EXEC_BASE, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                            unsigned long long flags) {
    (void)flags;
    return instantiate(phGraphExec, hGraph, 220);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUgraphNode *phErrorNode, char *logBuffer,
                                      size_t bufferSize) {
    (void)phErrorNode; (void)logBuffer; (void)bufferSize;
    return instantiate(phGraphExec, hGraph, 221);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    (void)instantiateParams;
    return instantiate(phGraphExec, hGraph, 222);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    (void)params;
    return instantiate(phGraphExec, hGraph, 223);
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                  const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
    CUresult r = ready(224);
    if (r)
        return r;
    if (hGraphExec == NULL || hNode == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return nodeParams == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                     CUgraphExecUpdateResultInfo *resultInfo) {
    (void)resultInfo;
    if (ready(225) == CUDA_SUCCESS && hGraphExec == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return need_handle(hGraph, 225);
}

EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { return need_handle(hGraph, 226); }
EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    return need_handle(hGraphExec, 227);
}

/* ---- synchronization ---- */

EXPORT CUresult cuStreamSynchronize(CUstream hStream) { (void)hStream; return ready(70); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { (void)hStream; return ready(71); }
EXPORT CUresult cuEventSynchronize(CUevent hEvent) { return need_handle(hEvent, 72); }

/* ---- modules, libraries, functions, kernels ---- */

HELPER CUresult load_image(void **out, const void *image, unsigned long long *counter,
                           unsigned long long base, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (out == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (*(const char *)image == '\0')
        return CUDA_ERROR_INVALID_IMAGE;
    *out = next_handle(counter, base, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return load_image(module, image, &modules, MODULE_BASE, 80);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                   CUjit_option *options, void **optionValues) {
    (void)numOptions; (void)options; (void)optionValues;
    return load_image(module, image, &modules, MODULE_BASE, 81);
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    return load_image(library, code, &libraries, LIBRARY_BASE, 82);
}

HELPER CUresult lookup(void **out, const void *container, const char *name, int variant) {
    CUresult r = ready(variant);
    if (r)
        return r;
    if (out == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (container == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (name[0] == '\0' || strncmp(name, "missing", 7) == 0)
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUresult r = lookup(hfunc, hmod, name, 83);
    if (r == CUDA_SUCCESS)
        *hfunc = remember_name(function_names, &nfunctions, FUNCTION_BASE, name);
    return r;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    CUresult r = lookup(pKernel, library, name, 84);
    if (r == CUDA_SUCCESS)
        *pKernel = remember_name(kernel_names, &nkernels, KERNEL_BASE, name);
    return r;
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    long slot;
    CUresult r = ready(85);
    if (r)
        return r;
    if (pFunc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    slot = named_slot(kernel, KERNEL_BASE, __atomic_load_n(&nkernels, __ATOMIC_RELAXED));
    if (slot < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    *pFunc = remember_name(function_names, &nfunctions, FUNCTION_BASE, kernel_names[slot]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    long slot;
    CUresult r = ready(86);
    if (r)
        return r;
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    slot = named_slot(hfunc, FUNCTION_BASE, __atomic_load_n(&nfunctions, __ATOMIC_RELAXED));
    if (slot < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = function_names[slot];
    return CUDA_SUCCESS;
}
