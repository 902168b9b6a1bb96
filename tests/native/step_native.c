/* A C training loop for `--step-at` on a native function (tests/test_analyze_step_at.py):
 * main sets up (an allocation, an upload of the batch's size from setup_weights, a launch,
 * a synchronisation: none of them in train_step), then calls train_step STEPS times, then
 * synchronises and frees.
 *
 *     step_native LAUNCHES
 *
 * train_step copies a batch (cudaMemcpy: its stack is recorded), launches LAUNCHES kernels
 * (launches record no stack) and synchronises its stream (recorded). Linked against the
 * stand-in libcudart (tests/native/fakecudart.c) and its simulated device. The functions
 * are noinline and global (named by the symbol table); each CUDA call is followed by an
 * empty asm so that none is a tail call (a tail call's frame would not be on the stack).
 * The process sleeps before it exits so that it lives until the tracer has read its maps. */
#include <stdlib.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned x, y, z; } dim3;

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t smem, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t size, int kind);

#define STEPS 7
#define BATCH 4096 /* (under the pageable-copy rule's 64 KiB: no finding of its own) */
#define H2D 1
#define NOINLINE __attribute__((noinline))

static char host[BATCH];

NOINLINE void launch(unsigned long kernel, cudaStream_t s) {
    dim3 one = {1, 1, 1}, block = {128, 1, 1};
    if (cudaLaunchKernel((const void *)kernel, one, block, NULL, 0, s) != 0)
        exit(2);
    __asm__ volatile("" ::: "memory");
}

NOINLINE void setup_weights(void *device, cudaStream_t s) {
    cudaMemcpy(device, host, BATCH, H2D);
    launch(0x1000, s);
    cudaStreamSynchronize(s);
    __asm__ volatile("" ::: "memory");
}

NOINLINE void train_step(void *device, cudaStream_t s, int launches) {
    cudaMemcpy(device, host, BATCH, H2D);
    for (int kernel = 0; kernel < launches; kernel++)
        launch(0x1000 + kernel, s);
    cudaStreamSynchronize(s);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int launches = atoi(argv[1]);
    cudaStream_t s;
    void *device;
    if (cudaStreamCreate(&s) != 0 || cudaMalloc(&device, BATCH) != 0)
        return 2;
    setup_weights(device, s);
    for (int i = 0; i < STEPS; i++)
        train_step(device, s, launches);
    cudaStreamSynchronize(s);
    cudaFree(device);
    usleep(500000);
    return 0;
}
