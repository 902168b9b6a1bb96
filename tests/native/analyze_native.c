/* Loops with one known problem each, called from named C functions, for `ebpf-cuda
 * analyze --stacks` (tests/test_analyze_native.py): with no Python stack, each finding's
 * `where.native` names the C function that made the call (its native caller).
 *
 *     analyze_native SCENARIO
 *
 * Linked against the stand-in libcudart (tests/native/fakecudart.c); its simulated device
 * (FAKECUDA_DEVICE_US) makes the synchronising calls wait for the launches' device time.
 * The functions the test names are noinline: each call site stays in its own function.
 * Each loop ends with a synchronisation (the simulated device's time: tens of ms), so the
 * process lives until the tracer has read its maps (a stack's addresses are named through
 * them; a process gone before its first record is read has none to name them by). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef struct { unsigned x, y, z; } dim3;

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t smem, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t size, int kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t size, cudaStream_t stream);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);

#define STEPS 6
#define MB (1 << 20)
#define H2D 1
#define NOINLINE __attribute__((noinline))

static void launch(unsigned long kernel, cudaStream_t s) {
    dim3 one = {1, 1, 1}, block = {128, 1, 1};
    if (cudaLaunchKernel((const void *)kernel, one, block, NULL, 0, s) != 0)
        exit(2);
}

static cudaStream_t new_stream(void) {
    cudaStream_t s;
    if (cudaStreamCreate(&s) != 0)
        exit(2);
    return s;
}

/* sync: the host waits for the GPU in every step, from wait_for_gpu. */
NOINLINE void wait_for_gpu(cudaStream_t s) {
    cudaStreamSynchronize(s);
    __asm__ volatile("" ::: "memory");  /* (the call is not a tail call) */
}

static void sync_loop(void) {
    cudaStream_t s = new_stream();
    for (int i = 0; i < STEPS; i++) {
        launch(0x1000, s);
        launch(0x2000, s);
        wait_for_gpu(s);
    }
}

/* pageable: an async copy from malloc'd memory in every step, from stage_batch. */
NOINLINE void stage_batch(void *device, const void *host, cudaStream_t s) {
    cudaMemcpyAsync(device, host, MB, H2D, s);
    __asm__ volatile("" ::: "memory");
}

static void pageable_loop(void) {
    cudaStream_t s = new_stream();
    void *device, *host = malloc(MB);
    memset(host, 1, MB);
    cudaMalloc(&device, MB);
    for (int i = 0; i < STEPS; i++) {
        stage_batch(device, host, s);
        launch(0x1000, s);
    }
    cudaStreamSynchronize(s);
}

/* graphs: captured in capture_forward, replayed from replay_forward. */
NOINLINE cudaGraphExec_t capture_forward(cudaStream_t s) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(s, 0);
    for (unsigned long kernel = 0; kernel < 30; kernel++)
        launch(0x1000 + kernel, s);
    cudaStreamEndCapture(s, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    return exec;
}

NOINLINE void replay_forward(cudaGraphExec_t exec, cudaStream_t s) {
    cudaGraphLaunch(exec, s);
    __asm__ volatile("" ::: "memory");
}

static void graphs_loop(void) {
    cudaStream_t s = new_stream();
    void *device, *batch;
    cudaMalloc(&device, MB);
    cudaHostAlloc(&batch, MB, 0);
    cudaGraphExec_t exec = capture_forward(s);
    for (int i = 0; i < STEPS; i++) {
        cudaMemcpyAsync(device, batch, MB, H2D, s);
        replay_forward(exec, s);
    }
    cudaStreamSynchronize(s);
}

/* churn: a scratch buffer allocated and freed in every step, by scratch_alloc and
 * scratch_free. */
NOINLINE void *scratch_alloc(void) {
    void *p = NULL;
    cudaMalloc(&p, 4 * MB);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE void scratch_free(void *p) {
    cudaFree(p);
    __asm__ volatile("" ::: "memory");
}

static void churn_loop(void) {
    cudaStream_t s = new_stream();
    for (int i = 0; i < STEPS; i++) {
        void *p = scratch_alloc();
        launch(0x1000, s);
        launch(0x2000, s);
        scratch_free(p);
    }
    cudaStreamSynchronize(s);
}

/* default: a memset on the legacy default stream in every step, from clear_on_default,
 * while the process queues work on a stream created blocking. */
NOINLINE void clear_on_default(void *device) {
    cudaMemsetAsync(device, 0, MB, NULL);
    __asm__ volatile("" ::: "memory");
}

static void default_loop(void) {
    cudaStream_t s = new_stream();
    void *device;
    cudaMalloc(&device, MB);
    for (int i = 0; i < STEPS; i++) {
        launch(0x1000, s);
        clear_on_default(device);
    }
    cudaStreamSynchronize(s);
}

/* error: a copy of a bad kind (7) fails in every step, from copy_result, and work goes on. */
NOINLINE void copy_result(void *device, void *host, cudaStream_t s) {
    cudaMemcpyAsync(device, host, 16, 7, s);
    __asm__ volatile("" ::: "memory");
}

static void error_loop(void) {
    cudaStream_t s = new_stream();
    void *device;
    char host[16];
    cudaMalloc(&device, MB);
    for (int i = 0; i < STEPS; i++) {
        copy_result(device, host, s);
        launch(0x1000, s);
    }
    cudaStreamSynchronize(s);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: analyze_native sync|pageable|graphs|churn|default|error\n");
        return 2;
    }
    if (!strcmp(argv[1], "sync"))
        sync_loop();
    else if (!strcmp(argv[1], "pageable"))
        pageable_loop();
    else if (!strcmp(argv[1], "graphs"))
        graphs_loop();
    else if (!strcmp(argv[1], "churn"))
        churn_loop();
    else if (!strcmp(argv[1], "default"))
        default_loop();
    else if (!strcmp(argv[1], "error"))
        error_loop();
    else
        return 2;
    return 0;
}
