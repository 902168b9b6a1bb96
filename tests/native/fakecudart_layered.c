/*
 * fakecudart_layered.c: a stand-in libcudart.so.12 layered over the stand-in driver
 * (fakecuda_driver.c, libcuda.so.1), as NVIDIA's runtime is layered over libcuda: a runtime
 * call makes driver calls on the same thread, inside its own time span.
 *
 * It is fakecudart.c (included below, so every runtime function exists with the same
 * behaviour) with these functions replaced by calls to the driver (their result is the
 * driver's CUresult, same number; the runtime's own rules of fakecudart.c do not apply):
 *   cudaMalloc        cuMemAlloc_v2            cudaFree          cuMemFree_v2
 *   cudaMallocAsync   cuMemAllocAsync          cudaFreeAsync     cuMemFreeAsync
 *   cudaMallocHost    cuMemHostAlloc(p, n, 0)
 *   cudaMemcpy        kind 1: cuMemcpyHtoD_v2, 2: cuMemcpyDtoH_v2, 3: cuMemcpyDtoD_v2,
 *                     else cuMemcpy
 *   cudaMemcpyAsync   cuMemcpyAsync            cudaMemset        cuMemsetD8_v2
 *   cudaMemsetAsync   cuMemsetD8Async
 *   cudaLaunchKernel  cuLaunchKernel (func as the CUfunction, args as kernelParams)
 *   cudaLaunchKernelExC   cuLaunchKernelEx with the same geometry, smem and stream
 *   cudaStreamSynchronize cuStreamSynchronize  cudaEventSynchronize cuEventSynchronize
 *   cudaDeviceSynchronize cuCtxSynchronize     cudaGraphLaunch   cuGraphLaunch
 * The first of these calls in a process first calls cuInit(0) and
 * cuDevicePrimaryCtxRetain(&ctx, 0) (NVIDIA's runtime initializes lazily too).
 *
 * Build: like fakecudart.c, plus -L <driver folder> -l:libcuda.so.1 -Wl,-rpath,<driver folder>.
 */
#include <pthread.h>

#define cudaMalloc stand_in_cudaMalloc
#define cudaFree stand_in_cudaFree
#define cudaMallocAsync stand_in_cudaMallocAsync
#define cudaFreeAsync stand_in_cudaFreeAsync
#define cudaMallocHost stand_in_cudaMallocHost
#define cudaMemcpy stand_in_cudaMemcpy
#define cudaMemcpyAsync stand_in_cudaMemcpyAsync
#define cudaMemset stand_in_cudaMemset
#define cudaMemsetAsync stand_in_cudaMemsetAsync
#define cudaLaunchKernel stand_in_cudaLaunchKernel
#define cudaLaunchKernelExC stand_in_cudaLaunchKernelExC
#define cudaStreamSynchronize stand_in_cudaStreamSynchronize
#define cudaEventSynchronize stand_in_cudaEventSynchronize
#define cudaDeviceSynchronize stand_in_cudaDeviceSynchronize
#define cudaGraphLaunch stand_in_cudaGraphLaunch
#include "fakecudart.c"
#undef cudaMalloc
#undef cudaFree
#undef cudaMallocAsync
#undef cudaFreeAsync
#undef cudaMallocHost
#undef cudaMemcpy
#undef cudaMemcpyAsync
#undef cudaMemset
#undef cudaMemsetAsync
#undef cudaLaunchKernel
#undef cudaLaunchKernelExC
#undef cudaStreamSynchronize
#undef cudaEventSynchronize
#undef cudaDeviceSynchronize
#undef cudaGraphLaunch

/* ---- the driver API used (real signatures) ---- */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, void *);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, void *);
CUresult cuLaunchKernel(void *, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, void *, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
CUresult cuStreamSynchronize(void *);
CUresult cuEventSynchronize(void *);
CUresult cuGraphLaunch(void *, void *);

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static CUcontext primary_context;

static void init_driver(void) {
    if (cuInit(0) == 0)
        cuDevicePrimaryCtxRetain(&primary_context, 0);
}

HELPER void lazy_init(void) { pthread_once(&driver_once, init_driver); }

#define D(expr) (lazy_init(), (cudaError_t)(expr))

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
    return D(cuMemAlloc_v2((CUdeviceptr *)devPtr, size));
}

EXPORT cudaError_t cudaFree(void *devPtr) { return D(cuMemFree_v2((CUdeviceptr)devPtr)); }

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    return D(cuMemAllocAsync((CUdeviceptr *)devPtr, size, stream));
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    return D(cuMemFreeAsync((CUdeviceptr)devPtr, stream));
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) {
    return D(cuMemHostAlloc(ptr, size, 0));
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    CUdeviceptr d = (CUdeviceptr)dst, s = (CUdeviceptr)src;
    lazy_init();
    switch (kind) {
    case 1: return cuMemcpyHtoD_v2(d, src, count);
    case 2: return cuMemcpyDtoH_v2(dst, s, count);
    case 3: return cuMemcpyDtoD_v2(d, s, count);
    default: return cuMemcpy(d, s, count);
    }
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                                   cudaStream_t stream) {
    (void)kind;
    return D(cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, count, stream));
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    return D(cuMemsetD8_v2((CUdeviceptr)devPtr, (unsigned char)value, count));
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    return D(cuMemsetD8Async((CUdeviceptr)devPtr, (unsigned char)value, count, stream));
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream) {
    return D(cuLaunchKernel((void *)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
                            blockDim.y, blockDim.z, (unsigned int)sharedMem, stream, args, NULL));
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                       void **args) {
    CUlaunchConfig c;
    if (config == NULL)
        return result(cudaErrorInvalidValue);
    c.gridDimX = config->gridDim.x;
    c.gridDimY = config->gridDim.y;
    c.gridDimZ = config->gridDim.z;
    c.blockDimX = config->blockDim.x;
    c.blockDimY = config->blockDim.y;
    c.blockDimZ = config->blockDim.z;
    c.sharedMemBytes = (unsigned int)config->dynamicSmemBytes;
    c.hStream = config->stream;
    c.attrs = NULL;
    c.numAttrs = 0;
    return D(cuLaunchKernelEx(&c, (void *)func, args, NULL));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return D(cuStreamSynchronize(stream));
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return D(cuEventSynchronize(event));
}

EXPORT cudaError_t cudaDeviceSynchronize(void) { return D(cuCtxSynchronize()); }

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    return D(cuGraphLaunch(graphExec, stream));
}
