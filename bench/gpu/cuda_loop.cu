// cuda_loop.cu: per-call cost of cudaGetDevice and of launching an empty kernel, timed inside
// the program (clock_gettime around N calls), for bench/gpu/traced.py.
//   nvcc -O2 -o cuda_loop cuda_loop.cu        (dynamic cudart: -cudart shared, so it can be probed)
//   ./cuda_loop [CALLS=200000] [REPS=5]
// Prints `result name=<what> value=<ns per call>` per repetition.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

static double now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    cudaFree(0);  // create the context outside the timed loops
    int device = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (long i = 0; i < calls; i++)
            cudaGetDevice(&device);
        printf("result name=getdevice_ns value=%.1f\n", (now() - t0) / calls);
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (long i = 0; i < calls; i++) {
            empty_kernel<<<1, 1>>>();
            if ((i & 1023) == 1023)  // keep the launch queue from filling (launches would block)
                cudaDeviceSynchronize();
        }
        cudaDeviceSynchronize();
        printf("result name=launch_ns value=%.1f\n", (now() - t0) / calls);
    }
    cudaError_t err = cudaGetLastError();
    printf("status %s\n", cudaGetErrorString(err));
    return err == cudaSuccess ? 0 : 1;
}
