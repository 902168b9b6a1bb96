/* kernels_cuda.h: the few CUDA runtime declarations the kernels_* test programs use (they link
 * against the stand-in libcudart.so.12, tests/native/fakecudart.c). */
#ifndef KERNELS_CUDA_H
#define KERNELS_CUDA_H
#include <stddef.h>

extern "C" {
typedef int cudaError_t;
typedef void *cudaStream_t;
struct dim3 { unsigned int x, y, z; };
enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
       cudaMemcpyDeviceToDevice };
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem,
                             cudaStream_t stream);
}

/* What nvcc's host stubs do: launch with the stub's own address as `func`. */
static inline cudaError_t launch(const void *func, dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream) {
    static int n = 1000;
    void *args[1] = {&n};
    return cudaLaunchKernel(func, grid, block, args, smem, stream);
}
#endif
