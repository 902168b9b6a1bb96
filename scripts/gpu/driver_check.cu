// driver_check.cu: the runtime and driver API calls of issue 5 on a real GPU, printing what
// it did (sizes, handles, results) so that a trace of it can be compared line by line.
//
//   /usr/local/cuda/bin/nvcc -O2 -o driver_check driver_check.cu -lcuda
//   python3 -m ebpf_cuda --json -o driver_check.jsonl -- ./driver_check
//
// It does: cudaMalloc x2, cudaMallocHost, cudaMallocAsync/cudaFreeAsync, a stream and two
// events, async copies, cudaMemsetAsync, 3 <<<>>> launches (cudaLaunchKernel), a CUDA graph
// (capture of 2 launches, instantiate, 3 graph launches), then through the driver API a
// module loaded from PTX text (cuModuleLoadData + cuModuleGetFunction of a long name),
// 2 cuLaunchKernel and 1 cuLaunchKernelEx launches of it, and checks the results.
// Output lines: `<what> key=value ...`; the last line is `ok` or `FAILED <why>`.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define RT(call) check_rt((call), #call, __LINE__)
#define DRV(call) check_drv((call), #call, __LINE__)

static void check_rt(cudaError_t e, const char *what, int line) {
    if (e != cudaSuccess) {
        printf("FAILED %s line %d: %s\n", what, line, cudaGetErrorName(e));
        exit(1);
    }
}

static void check_drv(CUresult e, const char *what, int line) {
    if (e != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(e, &name);
        printf("FAILED %s line %d: %s\n", what, line, name);
        exit(1);
    }
}

__global__ void add_one(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1.0f;
}

// The PTX kernel: x[i] *= a for i < n. Its name is longer than 100 characters on purpose.
#define PTX_NAME "_ZN9ebpf_cuda6issue512driver_check46scale_kernel_with_a_rather_long_name_for_testingIfLi256EEEvPT_S2_j"
static const char PTX[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry " PTX_NAME "(\n"
    "    .param .u64 p_x,\n"
    "    .param .f32 p_a,\n"
    "    .param .u32 p_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .f32 %f<4>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [p_x];\n"
    "    ld.param.f32 %f1, [p_a];\n"
    "    ld.param.u32 %r1, [p_n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra DONE;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r5, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    ld.global.f32 %f2, [%rd4];\n"
    "    mul.f32 %f3, %f2, %f1;\n"
    "    st.global.f32 [%rd4], %f3;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    float *d_x = nullptr, *d_y = nullptr, *h = nullptr, *d_tmp = nullptr;
    cudaStream_t stream;
    cudaEvent_t start, stop;

    RT(cudaSetDevice(0));
    RT(cudaMalloc(&d_x, bytes));
    RT(cudaMalloc(&d_y, bytes));
    RT(cudaMallocHost(&h, bytes));
    printf("malloc d_x=%p d_y=%p host=%p bytes=%zu\n", (void *)d_x, (void *)d_y, (void *)h, bytes);
    RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    RT(cudaEventCreate(&start));
    RT(cudaEventCreate(&stop));
    printf("stream=%p start_event=%p stop_event=%p\n", (void *)stream, (void *)start,
           (void *)stop);
    for (int i = 0; i < n; i++)
        h[i] = 1.0f;

    RT(cudaEventRecord(start, stream));
    RT(cudaMemcpyAsync(d_x, h, bytes, cudaMemcpyHostToDevice, stream));
    RT(cudaMemsetAsync(d_y, 0, bytes, stream));
    RT(cudaMallocAsync(&d_tmp, 4096, stream));
    printf("mallocasync ptr=%p size=4096 stream=%p\n", (void *)d_tmp, (void *)stream);
    RT(cudaFreeAsync(d_tmp, stream));
    for (int i = 0; i < 3; i++)
        add_one<<<n / 256, 256, 0, stream>>>(d_x, n);          // x = 4
    RT(cudaGetLastError());
    printf("launch kernel=add_one grid=%d block=256 smem=0 stream=%p count=3\n", n / 256,
           (void *)stream);

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    add_one<<<n / 256, 256, 0, stream>>>(d_x, n);
    add_one<<<n / 256, 256, 0, stream>>>(d_x, n);
    RT(cudaStreamEndCapture(stream, &graph));
    RT(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; i++)
        RT(cudaGraphLaunch(exec, stream));                      // x = 10
    printf("graph graph=%p exec=%p kernels_per_launch=2 launches=3\n", (void *)graph,
           (void *)exec);
    RT(cudaEventRecord(stop, stream));
    RT(cudaEventSynchronize(stop));
    float ms = 0;
    RT(cudaEventElapsedTime(&ms, start, stop));
    printf("elapsed ms=%.3f\n", ms);

    // The driver API on the runtime's primary context.
    CUmodule module;
    CUfunction scale;
    DRV(cuModuleLoadData(&module, PTX));
    DRV(cuModuleGetFunction(&scale, module, PTX_NAME));
    printf("module module=%p function=%p name_len=%zu name=%s\n", (void *)module, (void *)scale,
           strlen(PTX_NAME), PTX_NAME);
    CUdeviceptr px = (CUdeviceptr)d_x;
    float a = 2.0f;
    unsigned int un = n;
    void *params[] = {&px, &a, &un};
    for (int i = 0; i < 2; i++)                                 // x = 40
        DRV(cuLaunchKernel(scale, n / 128, 1, 1, 128, 1, 1, 0, (CUstream)stream, params, nullptr));
    printf("culaunch function=%p grid=%d,1,1 block=128,1,1 smem=0 stream=%p count=2\n",
           (void *)scale, n / 128, (void *)stream);
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    config.gridDimX = n / 512;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 512;
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = 64;
    config.hStream = (CUstream)stream;
    DRV(cuLaunchKernelEx(&config, scale, params, nullptr));    // x = 80
    printf("culaunchex function=%p grid=%d,1,1 block=512,1,1 smem=64 stream=%p count=1\n",
           (void *)scale, n / 512, (void *)stream);
    DRV(cuStreamSynchronize((CUstream)stream));

    RT(cudaMemcpy(h, d_x, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        if (h[i] != 80.0f) {
            printf("FAILED x[%d] = %g, expected 80\n", i, h[i]);
            return 1;
        }
    }
    DRV(cuModuleUnload(module));
    RT(cudaGraphExecDestroy(exec));
    RT(cudaGraphDestroy(graph));
    RT(cudaEventDestroy(start));
    RT(cudaEventDestroy(stop));
    RT(cudaStreamDestroy(stream));
    RT(cudaFreeHost(h));
    RT(cudaFree(d_y));
    RT(cudaFree(d_x));
    RT(cudaDeviceSynchronize());
    // What run.sh's `driver-api` check (gpucheck.py driver-api) reads, with the lines above:
    // launches outside graphs (3 add_one through the runtime, 2 cuLaunchKernel, 1
    // cuLaunchKernelEx); the graphs' 6 kernels come as 3 graph launches of 2 nodes.
    printf("launches=6\n");
    printf("graph_launches=3\n");
    printf("kernel=%s\n", PTX_NAME);
    printf("ok\n");
    return 0;
}
