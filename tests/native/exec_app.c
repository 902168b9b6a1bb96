/*
 * exec_app.c: a CUDA program that launches its kernel, then execs another program in the same
 * process (tests/test_exec_names.py). Built twice, with -DKERNEL=<name> and -no-pie: the two
 * programs are laid out the same way, so their kernels' host stubs have the same address
 * under different names (and register under different names).
 *
 *   exec_app [--register] [--sleep-ms MS] LAUNCHES [PROGRAM ARGS...]
 *
 * With --register, __cudaRegisterFunction(stub, MANGLED) first, as nvcc's start-up code
 * does; then LAUNCHES cudaLaunchKernel of the stub; prints "KERNEL stub=0x... launches=N";
 * then waits MS milliseconds (default 0) and execs PROGRAM ARGS when given, else exits.
 *
 * Build: gcc -O2 -g -no-pie -DKERNEL=alpha_kernel -DMANGLED=_Z12alpha_kernelPf exec_app.c -L DIR -l:libcudart.so.12
 *        -Wl,-rpath,DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KERNEL
#define KERNEL alpha_kernel
#endif
#ifndef MANGLED /* the name it registers: nvcc's device function name */
#define MANGLED _Z12alpha_kernelPf
#endif
#define STR2(x) #x
#define STR(x) STR2(x)

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct dim3 { unsigned int x, y, z; } dim3;

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t smem, cudaStream_t stream);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, void *tid, void *bid,
                            void *bDim, void *gDim, int *wSize);

/* The kernel's host stub: a function of its own, named after the kernel (C linkage). */
__attribute__((noinline, used)) void KERNEL(float *out) {
    __asm__ volatile("" ::: "memory");
    if (out)
        out[0] = 1.0f;
}

int main(int argc, char **argv) {
    static void *fat_cubin;
    int i = 1, reg = 0;
    long sleep_ms = 0;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--register") == 0)
            reg = 1;
        else if (strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc)
            sleep_ms = atol(argv[++i]);
    }
    if (i >= argc) {
        fprintf(stderr, "usage: exec_app [--register] [--sleep-ms MS] LAUNCHES [PROGRAM...]\n");
        return 2;
    }
    int launches = atoi(argv[i++]);
    if (reg)
        __cudaRegisterFunction(&fat_cubin, (const char *)KERNEL, (char *)STR(MANGLED),
                               STR(MANGLED), -1, NULL, NULL, NULL, NULL, NULL);
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    for (int k = 0; k < launches; k++)
        if (cudaLaunchKernel((const void *)KERNEL, grid, block, NULL, 0, NULL) != 0)
            return 1;
    printf("%s stub=%p launches=%d\n", STR(KERNEL), (void *)KERNEL, launches);
    fflush(stdout);
    struct timespec t = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
    if (i < argc) {
        execv(argv[i], argv + i);
        perror("execv");
        return 3;
    }
    return 0;
}
