/*
 * forwarding_driver.c: a libcuda.so.1 stand-in whose `_ptsz` launch exports reach the plain
 * ones, the two shapes a launch takes through two probed entry points of one library:
 *   cuLaunchKernelEx_ptsz   calls cuLaunchKernelEx (a call: its own frame, then returns)
 *   cuLaunchKernel_ptsz     jumps to cuLaunchKernel (a tail call: the same stack pointer)
 * Each launch returns 0 (CUDA_SUCCESS), or 1 when its function handle is NULL.
 * Built with fakecuda_driver.LIB_FLAGS (every export starts with `push %rbp`).
 */
#include <stddef.h>

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define EXPORT __attribute__((visibility("default"), noinline))

EXPORT int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra) {
    (void)config; (void)params; (void)extra;
    return f == NULL;
}

EXPORT int cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, void *f, void **params,
                                 void **extra) {
    volatile int result = cuLaunchKernelEx(config, f, params, extra);  /* not a tail call */
    return result;
}

EXPORT int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                          void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)stream;
    (void)params; (void)extra;
    return f == NULL;
}

__attribute__((optimize("optimize-sibling-calls")))
EXPORT int cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, void *stream,
                               void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}
