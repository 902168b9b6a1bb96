/*
 * registered_app.c: a program laid out as nvcc lays one out, for the tests of
 * ebpf_cuda/registrations.py: at start it registers two kernels (their host functions and
 * device names, the calls nvcc's start-up code makes); then, every 10 ms until it has made
 * ROUNDS rounds, it launches them as nvcc 13's <<<...>>> does — the launch site fetches the
 * kernel's handle once with __cudaGetKernel into a static variable, then launches with it —
 * and one the CUDA 12 way (cudaLaunchKernel of the host function itself).
 *
 * Build: gcc -O2 registered_app.c -L DIR -l:libcudart.so.12 -Wl,-rpath,DIR (then strip it:
 * the names must come from the registration code, not from symbols)
 * Usage: registered_app ROUNDS     prints "ready" once registered, then "done"
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int cudaError_t;
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, void *tid, void *bid,
                            void *bDim, void *gDim, int *wSize);
cudaError_t __cudaGetKernel(void **kernel, const void *entry);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t smem, void *stream);

/* The host functions whose addresses are registered (nvcc's: the kernel's name on the
 * host side); never called here. */
__attribute__((noinline)) void saxpy_host(float *x) { __asm__ volatile("" :: "r"(x)); }
__attribute__((noinline)) void scale_host(double *x) { __asm__ volatile("" :: "r"(x)); }
__attribute__((noinline)) void legacy_host(int *x) { __asm__ volatile("" :: "r"(x)); }

static void *fat_binary[2];  /* (the stand-in runtime has no __cudaRegisterFatBinary) */

__attribute__((noinline)) static void register_all(void) {
    void **handle = fat_binary;
    __cudaRegisterFunction(handle, (const char *)saxpy_host, "_Z5saxpyPf", "_Z5saxpyPf", -1,
                           NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(handle, (const char *)scale_host, "_Z5scalePd", "_Z5scalePd", -1,
                           NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(handle, (const char *)legacy_host, "_Z6legacyPi", "_Z6legacyPi", -1,
                           NULL, NULL, NULL, NULL, NULL);
}

static void *saxpy_kernel, *scale_kernel;

__attribute__((noinline)) static int launch_saxpy(float *x) {
    void *args[] = {&x};
    dim3 grid = {2, 1, 1}, block = {64, 1, 1};
    if (saxpy_kernel == NULL && __cudaGetKernel(&saxpy_kernel, (const void *)saxpy_host))
        return 1;
    return cudaLaunchKernel(saxpy_kernel, grid, block, args, 0, NULL);
}

__attribute__((noinline)) static int launch_scale(double *x) {
    void *args[] = {&x};
    dim3 grid = {4, 1, 1}, block = {128, 1, 1};
    if (scale_kernel == NULL && __cudaGetKernel(&scale_kernel, (const void *)scale_host))
        return 1;
    return cudaLaunchKernel(scale_kernel, grid, block, args, 0, NULL);
}

__attribute__((noinline)) static int launch_legacy(int *x) {
    void *args[] = {&x};
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    return cudaLaunchKernel((const void *)legacy_host, grid, block, args, 0, NULL);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1, failed = 0;
    float f = 1;
    double d = 2;
    int i = 3;
    struct timespec pause = {0, 10 * 1000 * 1000};
    register_all();
    printf("ready\n");
    fflush(stdout);
    for (int k = 0; k < rounds; k++) {
        failed |= launch_saxpy(&f) | launch_scale(&d) | launch_legacy(&i);
        nanosleep(&pause, NULL);
    }
    printf("done %d\n", failed);
    return failed;
}
