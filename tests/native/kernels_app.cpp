/* kernels_app.cpp: a CUDA-like program for the analysis tests (kernel names, leaks, summary).
 * Built with g++ against the stand-in libcudart.so.12 and libkernels.so (kernels_lib.cpp),
 * as a PIE and as a non-PIE executable. Usage: kernels_app [SLEEP_MS=300]
 * It sleeps SLEEP_MS at the end so the tracer can read its /proc/PID/maps while it lives.
 *
 * Calls, in order (the stand-in's device pointers are 0x7f0000000000 + k * 0x100000):
 *   cudaMalloc 4096 → A (k=0), cudaMalloc 8192 → B (k=1),
 *   make_scratch(): cudaMalloc 1048576 → C (k=2), never freed (the leak),
 *   cudaMalloc 1<<41 → fails with 2 (cudaErrorMemoryAllocation), nothing live,
 *   cudaMemcpy H2D 4096 ×2, D2H 1000, D2D 512,
 *   cudaStreamCreate → 0x5000,
 *   launch _Z6vecAddPKfS0_Pfi          grid (4,1,1)  block (256,1,1) smem 0    stream 0
 *   launch _ZN2nn5scaleIfEEvPT_S1_i    grid (8,2,1)  block (32,8,1)  smem 1024 stream 0x5000 ×2
 *   launch saxpy (library)             grid (2,1,1)  block (128,1,1) smem 0    stream 0 ×3
 *   launch hidden_kernel (library, local symbol) grid (1,1,1) block (64,1,1)
 *   launch relu_kernel (library, C name)          grid (1,1,1) block (32,1,1)
 *   launch vecAdd with block (2048,1,1) → fails with 9 (cudaErrorInvalidConfiguration)
 *   cudaFree A, cudaFree B, cudaFree B again (double free), cudaFree 0xdead0000 (unknown)
 * One line per call on stdout: "<function> ret=<n> [ptr=0x...]".
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels_cuda.h"

cudaError_t launch_saxpy(dim3 grid, dim3 block, cudaStream_t stream);
cudaError_t launch_hidden(dim3 grid, dim3 block);
cudaError_t launch_relu(dim3 grid, dim3 block);

__attribute__((noinline, used)) void vecAdd(const float *a, const float *b, float *c, int n) {
    for (int i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

namespace nn {
template <typename T> __attribute__((noinline, used)) void scale(T *x, T factor, int n) {
    for (int i = 0; i < n; i++)
        x[i] *= factor;
}
template void scale<float>(float *, float, int);
}  // namespace nn

/* Always inlined, so the leak's stack is make_scratch then main whatever the optimizer does. */
static inline __attribute__((always_inline)) void *allocate(size_t size) {
    void *ptr = 0;
    cudaError_t ret = cudaMalloc(&ptr, size);
    printf("cudaMalloc ret=%d ptr=%p size=%zu\n", ret, ptr, size);
    return ptr;
}

/* The leaked allocation comes from here: the leak report's stack names this function. */
__attribute__((noinline)) void *make_scratch(size_t size) {
    void *ptr = allocate(size);
    __asm__ volatile("" : : "r"(ptr) : "memory");  /* keeps the call from being a tail call */
    return ptr;
}

static void report(const char *what, cudaError_t ret) { printf("%s ret=%d\n", what, ret); }

int main(int argc, char **argv) {
    int sleep_ms = argc > 1 ? atoi(argv[1]) : 300;
    static char host[8192];
    void *a = allocate(4096), *b = allocate(8192);
    make_scratch(1 << 20);
    allocate((size_t)1 << 41);
    report("cudaMemcpy", cudaMemcpy(a, host, 4096, cudaMemcpyHostToDevice));
    report("cudaMemcpy", cudaMemcpy(a, host, 4096, cudaMemcpyHostToDevice));
    report("cudaMemcpy", cudaMemcpy(host, b, 1000, cudaMemcpyDeviceToHost));
    report("cudaMemcpy", cudaMemcpy(b, a, 512, cudaMemcpyDeviceToDevice));
    cudaStream_t stream = 0;
    report("cudaStreamCreate", cudaStreamCreate(&stream));
    report("cudaLaunchKernel", launch((const void *)vecAdd, {4, 1, 1}, {256, 1, 1}, 0, 0));
    for (int i = 0; i < 2; i++)
        report("cudaLaunchKernel", launch((const void *)nn::scale<float>, {8, 2, 1}, {32, 8, 1},
                                          1024, stream));
    for (int i = 0; i < 3; i++)
        report("cudaLaunchKernel", launch_saxpy({2, 1, 1}, {128, 1, 1}, 0));
    report("cudaLaunchKernel", launch_hidden({1, 1, 1}, {64, 1, 1}));
    report("cudaLaunchKernel", launch_relu({1, 1, 1}, {32, 1, 1}));
    report("cudaLaunchKernel", launch((const void *)vecAdd, {1, 1, 1}, {2048, 1, 1}, 0, 0));
    report("cudaFree", cudaFree(a));
    report("cudaFree", cudaFree(b));
    report("cudaFree", cudaFree(b));
    report("cudaFree", cudaFree((void *)0xdead0000));
    fflush(stdout);
    usleep(sleep_ms * 1000);
    return 0;
}
