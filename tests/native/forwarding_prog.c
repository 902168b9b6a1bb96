/* forwarding_prog N: N launches through each entry point of forwarding_driver.c (the plain
 * ones and the `_ptsz` ones that reach them), each with its own function handle. */
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

int cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
int cuLaunchKernelEx_ptsz(const CUlaunchConfig *, void *, void **, void **);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   void *, void **, void **);
int cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1;
    CUlaunchConfig config = {2, 1, 1, 64, 1, 1, 0, NULL, NULL, 0};
    int failed = 0;
    for (long i = 0; i < n; i++) {
        failed |= cuLaunchKernelEx(&config, (void *)0x1000, NULL, NULL);
        failed |= cuLaunchKernelEx_ptsz(&config, (void *)0x2000, NULL, NULL);
        failed |= cuLaunchKernel((void *)0x3000, 3, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        failed |= cuLaunchKernel_ptsz((void *)0x4000, 4, 1, 1, 16, 1, 1, 0, NULL, NULL, NULL);
    }
    printf("launched=%ld failed=%d\n", 4 * n, failed);
    return failed;
}
