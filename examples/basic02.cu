// basic02.cu: the seed's small CUDA program, a target for ebpf-cuda on a GPU host.
//
//   nvcc -o basic02 examples/basic02.cu                    # cudart linked statically (default)
//   nvcc -cudart shared -o basic02 examples/basic02.cu     # calls go through libcudart.so
//
// Adds two vectors of 1000 floats on the device: 3 cudaMalloc (4000 bytes each), 2 cudaMemcpy
// host-to-device, one vecAdd<<<4, 256>>> launch, 1 cudaMemcpy device-to-host, 3 cudaFree.
// Prints "PASSED" and exits 0 when every element is right, else prints why and exits 1.
// `basic02 MS` first prints its pid and sleeps MS milliseconds (time to attach with -d PID).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <unistd.h>

static const int N = 1000;
static const int THREADS = 256;
static const int BLOCKS = (N + THREADS - 1) / THREADS;   // 4

__global__ void vecAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

static bool ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return true;
    std::fprintf(stderr, "%s failed: %d %s\n", what, (int)err, cudaGetErrorString(err));
    return false;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        std::printf("pid %d\n", (int)getpid());
        std::fflush(stdout);
        usleep(1000 * atoi(argv[1]));
    }
    const size_t bytes = N * sizeof(float);   // 4000
    float a[N], b[N], c[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * i;
        c[i] = -1.0f;
    }

    float *da = nullptr, *db = nullptr, *dc = nullptr;
    if (!ok(cudaMalloc((void **)&da, bytes), "cudaMalloc(a)") ||
        !ok(cudaMalloc((void **)&db, bytes), "cudaMalloc(b)") ||
        !ok(cudaMalloc((void **)&dc, bytes), "cudaMalloc(c)"))
        return 1;
    if (!ok(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(a)") ||
        !ok(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(b)"))
        return 1;

    vecAdd<<<BLOCKS, THREADS>>>(da, db, dc, N);
    if (!ok(cudaGetLastError(), "vecAdd launch"))
        return 1;
    if (!ok(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(c)"))
        return 1;

    int wrong = 0;
    for (int i = 0; i < N; i++)
        if (c[i] != a[i] + b[i])
            wrong++;

    bool freed = ok(cudaFree(da), "cudaFree(a)") & ok(cudaFree(db), "cudaFree(b)") &
                 ok(cudaFree(dc), "cudaFree(c)");
    if (wrong != 0) {
        std::printf("FAILED: %d of %d elements wrong\n", wrong, N);
        return 1;
    }
    if (!freed)
        return 1;
    std::printf("PASSED\n");
    return 0;
}
