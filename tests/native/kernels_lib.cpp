/* kernels_lib.cpp: "kernels" that live in a shared library (libkernels.so), launched from the
 * library as nvcc's stubs do. Names (mangled → demangled):
 *   _Z5saxpyifPKfPf        saxpy(int, float, float const*, float*)   exported
 *   _ZL13hidden_kernelPf   hidden_kernel(float*)                     local: in .symtab only
 *   relu_kernel            relu_kernel                               extern "C"
 */
#include "kernels_cuda.h"

__attribute__((noinline, used)) void saxpy(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

__attribute__((noinline, used)) static void hidden_kernel(float *x) {
    __asm__ volatile("" : : "r"(x) : "memory");
}

extern "C" __attribute__((noinline, used)) void relu_kernel(float *x, int n) {
    for (int i = 0; i < n; i++)
        x[i] = x[i] > 0 ? x[i] : 0;
}

cudaError_t launch_saxpy(dim3 grid, dim3 block, cudaStream_t stream) {
    return launch((const void *)saxpy, grid, block, 0, stream);
}

cudaError_t launch_hidden(dim3 grid, dim3 block) {
    return launch((const void *)hidden_kernel, grid, block, 0, 0);
}

cudaError_t launch_relu(dim3 grid, dim3 block) {
    return launch((const void *)relu_kernel, grid, block, 0, 0);
}
