/* A stand-in for libcudart.so.12: a few functions with the runtime's names, for discovery
 * tests (no CUDA needed). */
#include <stdlib.h>

int cudaMalloc(void **ptr, size_t size) { *ptr = malloc(size); return *ptr ? 0 : 2; }
int cudaFree(void *ptr) { free(ptr); return 0; }
int cudaLaunchKernel(const void *func, unsigned gx, unsigned gy, void **args, size_t shm,
                     void *stream) { (void)func; (void)gx; (void)gy; (void)args; (void)shm;
                                     (void)stream; return 0; }
int cudaGetDevice(int *device) { *device = 0; return 0; }
