// kernels_check.cu: known kernel launches, copies and one leak, for checking ebpf-cuda's kernel
// names, --summary and --leaks on a real GPU (scripts/gpu/run.sh's `summary` check builds it
// with static and shared cudart, traces it and compares with what follows).
//
// What it does (and prints, one "kernels_check:" line each):
//   cudaMalloc 4 MiB x3 (a, b, c) and 1 MiB (never freed: the leak)
//   cudaMemcpy HostToDevice 4 MiB x2, DeviceToHost 4 MiB x1, DeviceToDevice 2 MiB x1
//   vecAdd(float const*, float const*, float*, int)     grid (4096,1,1) block (256,1,1) smem 0
//       on the default stream, once
//   void nn::scale<float>(float*, float, int)          grid (64,4,1) block (32,8,1) smem 1024
//       on a created stream, 3 times
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "kernels_check: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__global__ void vecAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

namespace nn {
template <typename T> __global__ void scale(T *x, T factor, int n) {
    extern __shared__ unsigned char tile[];  // the dynamic shared memory the launch asks for
    int threads = blockDim.x * blockDim.y;
    int block = blockIdx.y * gridDim.x + blockIdx.x;
    int local = threadIdx.y * blockDim.x + threadIdx.x;
    if (local == 0) tile[0] = 1;
    __syncthreads();
    for (int i = block * threads + local; i < n; i += gridDim.x * gridDim.y * threads)
        x[i] *= factor * tile[0];
}
}  // namespace nn

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);  // 4 MiB
    const size_t leaked_bytes = 1 << 20;
    float *host = (float *)malloc(bytes), *out = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) host[i] = 1.0f;

    float *a, *b, *c;
    void *leak;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&c, bytes));
    CHECK(cudaMalloc(&leak, leaked_bytes));
    printf("kernels_check: cudaMalloc %zu bytes x3, %zu bytes leaked at %p\n", bytes, leaked_bytes,
           leak);

    CHECK(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, host, bytes, cudaMemcpyHostToDevice));

    vecAdd<<<n / 256, 256>>>(a, b, c, n);
    CHECK(cudaGetLastError());
    printf("kernels_check: launch vecAdd(float const*, float const*, float*, int) "
           "grid=(%d,1,1) block=(256,1,1) smem=0 stream=0x0 x1\n", n / 256);

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    for (int i = 0; i < 3; i++) {
        nn::scale<float><<<dim3(64, 4, 1), dim3(32, 8, 1), 1024, stream>>>(c, 2.0f, n);
        CHECK(cudaGetLastError());
    }
    printf("kernels_check: launch void nn::scale<float>(float*, float, int) grid=(64,4,1) "
           "block=(32,8,1) smem=1024 stream=%p x3\n", (void *)stream);
    CHECK(cudaStreamSynchronize(stream));

    CHECK(cudaMemcpy(out, c, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b, a, bytes / 2, cudaMemcpyDeviceToDevice));
    printf("kernels_check: memcpy HostToDevice %zu bytes in 2 calls, DeviceToHost %zu bytes in "
           "1 call, DeviceToDevice %zu bytes in 1 call\n", 2 * bytes, bytes, bytes / 2);

    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += out[i] != 16.0f;  // (1 + 1) * 2^3
    printf("kernels_check: result %s\n", wrong ? "WRONG" : "ok");

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    free(host);
    free(out);
    return wrong ? 1 : 0;
}
