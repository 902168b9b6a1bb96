/*
 * fakecudart.c: a stand-in for NVIDIA's libcudart, for end-to-end tests without a GPU.
 *
 * Built by tests (tests/fakecuda.py) as `libcudart.so.12` (soname libcudart.so.12) with
 *   gcc -O2 -g -shared -fPIC -fno-omit-frame-pointer -fcf-protection=none -fno-shrink-wrap
 *       -fno-ipa-icf -fno-optimize-sibling-calls -Wl,-soname,libcudart.so.12
 * so every exported function begins with `push %rbp` (a uprobe on it is emulated, not
 * single-stepped) and no two exported functions share an address.
 *
 * Every function has the real CUDA signature and a deterministic result. Nothing touches
 * memory except the documented out-parameters: the returned "pointers" are NOT backed by memory.
 *
 * Counters are process-wide, atomic, and start at 0 ("k" below is the value before the call):
 *   device allocations  cudaMalloc, cudaMallocManaged, cudaMallocAsync, cudaMallocPitch
 *                       *ptr = 0x7f0000000000 + k * 0x100000   (k counts successful calls only)
 *   host allocations    cudaMallocHost, cudaHostAlloc
 *                       *ptr = 0x7e0000000000 + k * 0x100000
 *   streams             cudaStreamCreate, ...WithFlags, ...WithPriority   *stream = 0x5000 + k
 *   events              cudaEventCreate, cudaEventCreateWithFlags          *event  = 0xe000 + k
 *   graphs              cudaStreamEndCapture, cudaGraphCreate              *graph  = 0x6000 + k
 *   graph execs         cudaGraphInstantiate(WithFlags, WithParams)       *exec   = 0x7000 + k
 *   graph nodes         cudaGraphAdd*Node                                  *node   = 0x8000 + k
 * The current device is per thread (as in CUDA) and starts at 0; there are 2 devices.
 * Every non-zero result is also stored as the thread's last error (see cudaGetLastError).
 *
 * Results (first matching rule wins; otherwise 0 = cudaSuccess):
 *   cudaMalloc(p, size)                  1 if p NULL; 2 if size > 1<<40 (*p untouched);
 *                                        size 0: *p = NULL, 0, no counter used
 *   cudaMallocManaged(p, size, flags)    1 if p NULL or flags not 1 (Global) / 2 (Host); then as cudaMalloc
 *   cudaMallocAsync(p, size, stream)     as cudaMalloc
 *   cudaMallocPitch(p, pitch, w, h)      1 if p or pitch NULL; 2 if pitch*h > 1<<40 (nothing
 *                                        written); else *pitch = w rounded up to 512 and *p as
 *                                        cudaMalloc(pitch*h) (NULL when pitch*h is 0)
 *   cudaMallocHost(p, size)              1 if p NULL; 2 if size > 1<<40; else host pointer
 *   cudaHostAlloc(p, size, flags)        1 if flags > 15; then as cudaMallocHost
 *   cudaFree, cudaFreeHost, cudaFreeAsync   0 (freeing NULL is success, as in CUDA)
 *   cudaMemcpy(dst, src, n, kind)        21 (InvalidMemcpyDirection) if kind > 4; copies nothing
 *   cudaMemcpyAsync(..., stream)         as cudaMemcpy; cudaMemcpy_ptds, cudaMemcpyAsync_ptsz too
 *   cudaMemcpy2D(dst, dp, src, sp, w, h, kind)   21 if kind > 4; 12 (InvalidPitchValue) if w > dp
 *                                        or w > sp; cudaMemcpy2DAsync likewise
 *   cudaMemcpyPeer(dst, dd, src, sd, n)  101 (InvalidDevice) if dd or sd not in [0, 2)
 *   cudaMemset, cudaMemsetAsync(_ptsz)   0
 *   cudaDeviceSynchronize, cudaDeviceReset   0
 *   cudaGetDeviceCount(n)                1 if n NULL; *n = 2
 *   cudaGetDevice(d)                     1 if d NULL; *d = current device of the thread
 *   cudaSetDevice(d)                     101 if d < 0 or d >= 2; else sets the current device
 *   cudaMemGetInfo(free, total)          1 if either NULL; *free = 76 GiB (81604378624),
 *                                        *total = 80 GiB (85899345920)
 *   cudaStreamCreate(s)                  1 if s NULL; *s = next stream handle
 *   cudaStreamCreateWithFlags(s, f)      1 if s NULL or f > 1; *s = next stream handle
 *   cudaStreamCreateWithPriority(s,f,p)  1 if s NULL or f > 1 or p not in [-5, 0]; *s = next handle
 *   cudaStreamDestroy(s)                 400 (InvalidResourceHandle) if s NULL
 *   cudaStreamSynchronize(s) (+_ptsz)    0
 *   cudaStreamQuery(s)                   600 (NotReady) if the handle is odd, else 0
 *   cudaStreamWaitEvent(s, e, flags)     400 if e NULL
 *   cudaEventCreate(e)                   1 if e NULL; *e = next event handle
 *   cudaEventCreateWithFlags(e, f)       1 if e NULL or f > 15; *e = next event handle
 *   cudaEventRecord(e, s) (+_ptsz)       400 if e NULL
 *   cudaEventSynchronize(e)              400 if e NULL
 *   cudaEventQuery(e)                    400 if e NULL; 600 if the handle is odd; else 0
 *   cudaEventDestroy(e)                  400 if e NULL
 *   cudaEventElapsedTime(ms, a, b)       1 if ms NULL; 400 if a or b NULL; *ms = 1.5f
 *   cudaLaunchKernel(f, grid, block, args, smem, stream) (+_ptsz), cudaLaunchCooperativeKernel
 *                                        98 (InvalidDeviceFunction) if f NULL; 9 (InvalidConfiguration)
 *                                        if any grid/block dimension is 0 or x*y*z of block > 1024
 *   cudaLaunchKernelExC(config, f, args) 1 if config NULL; then as cudaLaunchKernel with the
 *                                        config's gridDim/blockDim
 *   cudaStreamBeginCapture(s, mode)      1 if mode > 2
 *   cudaStreamEndCapture(s, g)           1 if g NULL; *g = next graph handle
 *   cudaGraphInstantiate(x, g, flags)    1 if x or g NULL; *x = next exec handle
 *   __cudaGetKernel(k, entry), cudaGetKernel(k, entry)
 *                                        1 if k or entry NULL; *k = 0x9000 + k-th kernel handle
 *                                        (CUDA 13's nvcc code launches with such a handle)
 *   __cudaRegisterFunction(h, stub, fun, name, ...)   nothing (void)
 *   cudaGraphLaunch(x, s)                400 if x NULL
 *   cudaStreamBeginCaptureToGraph(s, g, deps, data, n, mode) (+_ptsz)   1 if mode > 2; 400 if g NULL
 *   cudaThreadExchangeStreamCaptureMode(m)   1 if m NULL; swaps *m with the thread's mode (0 at first)
 *   cudaGraphCreate(g, flags)            1 if g NULL or flags != 0; *g = next graph handle
 *   cudaGraphAdd*Node(node, graph, deps, n, ...)   1 if node NULL, or deps NULL with n > 0;
 *                                        400 if graph NULL; then:
 *     KernelNode(..., params)            1 if params NULL; 98 if params->func NULL
 *     MemcpyNode(..., p3d)               1 if p3d NULL; 21 if p3d->kind > 4
 *     MemcpyNode1D(..., dst, src, count, kind), MemcpyNodeToSymbol(..., symbol, src, count,
 *     offset, kind), MemcpyNodeFromSymbol(..., dst, symbol, count, offset, kind)   21 if kind > 4
 *     MemsetNode(..., params)            1 if params NULL or its elementSize is not 1, 2 or 4
 *     ChildGraphNode(..., child), EventRecordNode(..., e), EventWaitNode(..., e)   400 if NULL
 *     EmptyNode                          0
 *                                        each success: *node = next node handle
 *   cudaGraphInstantiateWithFlags(x, g, flags), cudaGraphInstantiateWithParams(x, g, p) (+_ptsz)
 *                                        as cudaGraphInstantiate (p is not read: may be NULL)
 *   cudaGraphExecKernelNodeSetParams(x, node, params)   400 if x or node NULL; 1 if params NULL
 *   cudaGraphExecUpdate(x, g, info)      400 if x or g NULL
 *   cudaGraphDestroy(g), cudaGraphExecDestroy(x)   400 if NULL
 *   cudaGetLastError()                   the thread's last error, then resets it to 0
 *   cudaPeekAtLastError()                the thread's last error, without resetting it
 *   cudaHostRegister(p, size, flags)     1 if p NULL or size 0; cudaHostUnregister(p): 1 if p NULL
 *
 * A simulated device, on when FAKECUDA_DEVICE_US (read at the first call) is a positive
 * number of microseconds: each successful kernel launch queues that much device time on its
 * stream (0 and 1 are the legacy default stream; streams are not otherwise ordered), after
 * what the stream queued before (CLOCK_MONOTONIC). Then the calls that wait, wait:
 * cudaStreamSynchronize(s) sleeps until s's queued work is done; cudaDeviceSynchronize until
 * every stream's is; cudaEventRecord(e, s) marks e done when s's work queued so far is;
 * cudaEventSynchronize(e) sleeps until then; cudaMemcpy/cudaMemset (synchronous) wait for the
 * legacy stream first; cudaStreamQuery(s) and cudaEventQuery(e) answer 600 while the work is
 * not done, else 0; cudaEventElapsedTime gives the simulated interval between its events'
 * completion times, in ms. Off (the default): none of this, the results above.
 * FAKECUDA_LAUNCH_US (read at the first launch): each successful launch also spins that many
 * microseconds on the host before it returns (a launch's host cost), simulated device or not.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* A tail call (`jmp helper`) or shrink-wrapping would skip or delay the exported function's frame
 * setup, and identical-code folding could merge variants: forbid them here,
 * so the file gives `push %rbp` entries even when built without the flags above. */
#pragma GCC optimize("no-optimize-sibling-calls", "no-shrink-wrap", "no-ipa-icf")

#define EXPORT __attribute__((visibility("default")))
#define HELPER static __attribute__((noinline))

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef int cudaMemcpyKind;                 /* enum cudaMemcpyKind: 4 bytes */
typedef int cudaStreamCaptureMode;          /* enum cudaStreamCaptureMode: 4 bytes */

typedef struct dim3 { unsigned int x, y, z; } dim3;

typedef struct cudaLaunchAttribute_st cudaLaunchAttribute;   /* opaque here */

/* Layout of CUDA 12/13 `struct cudaLaunchConfig_st` (56 bytes). */
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;                 /* offset 0 */
    dim3 blockDim;                /* offset 12 */
    size_t dynamicSmemBytes;      /* offset 24 */
    cudaStream_t stream;          /* offset 32 */
    cudaLaunchAttribute *attrs;   /* offset 40 */
    unsigned int numAttrs;        /* offset 48 */
} cudaLaunchConfig_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};

#define DEVICE_BASE 0x7f0000000000ULL
#define HOST_BASE 0x7e0000000000ULL
#define ALLOC_STRIDE 0x100000ULL
#define STREAM_BASE 0x5000ULL
#define EVENT_BASE 0xe000ULL
#define GRAPH_BASE 0x6000ULL
#define KERNEL_BASE 0x9000ULL
#define EXEC_BASE 0x7000ULL
#define NODE_BASE 0x8000ULL
#define MAX_ALLOC (1ULL << 40)
#define DEVICE_COUNT 2
#define PITCH_ALIGN 512

static unsigned long long device_allocs, host_allocs, streams, events, graphs, execs, kernels,
    nodes;
static __thread int current_device;
static __thread cudaError_t last_error;

/* Records a failure as the thread's last error (as CUDA does) and returns it. */
HELPER cudaError_t result(cudaError_t code) {
    if (code != cudaSuccess)
        last_error = code;
    return code;
}

static void *next_handle(unsigned long long *counter, unsigned long long base,
                         unsigned long long stride) {
    return (void *)(uintptr_t)(base + __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED) * stride);
}

HELPER cudaError_t device_alloc(void **ptr, size_t size) {
    if (ptr == NULL)
        return result(cudaErrorInvalidValue);
    if (size > MAX_ALLOC)
        return result(cudaErrorMemoryAllocation);
    *ptr = size == 0 ? NULL : next_handle(&device_allocs, DEVICE_BASE, ALLOC_STRIDE);
    return cudaSuccess;
}

HELPER cudaError_t host_alloc(void **ptr, size_t size) {
    if (ptr == NULL)
        return result(cudaErrorInvalidValue);
    if (size > MAX_ALLOC)
        return result(cudaErrorMemoryAllocation);
    *ptr = next_handle(&host_allocs, HOST_BASE, ALLOC_STRIDE);
    return cudaSuccess;
}

HELPER cudaError_t new_handle(void **out, unsigned long long *counter, unsigned long long base) {
    if (out == NULL)
        return result(cudaErrorInvalidValue);
    *out = next_handle(counter, base, 1);
    return cudaSuccess;
}

HELPER cudaError_t need_handle(const void *handle) {
    return result(handle == NULL ? cudaErrorInvalidResourceHandle : cudaSuccess);
}

HELPER cudaError_t copy(cudaMemcpyKind kind, int variant) {
    (void)variant;   /* keeps the per-variant callers from being merged into one */
    return result(kind < 0 || kind > 4 ? cudaErrorInvalidMemcpyDirection : cudaSuccess);
}

HELPER cudaError_t launch(const void *func, dim3 grid, dim3 block, int variant) {
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    (void)variant;
    if (func == NULL)
        return result(cudaErrorInvalidDeviceFunction);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024)
        return result(cudaErrorInvalidConfiguration);
    return cudaSuccess;
}

HELPER cudaError_t no_op(int variant) {
    (void)variant;
    return cudaSuccess;
}


/* ---- the simulated device (FAKECUDA_DEVICE_US) ---- */

#define SIM_SLOTS 64
static long long sim_device_ns = -1;                 /* -1: not read yet; 0: off */
static long long sim_launch_ns = -1;                 /* FAKECUDA_LAUNCH_US, in ns */
static uintptr_t sim_handles[SIM_SLOTS];             /* stream or event handle of each slot */
static unsigned long long sim_done[SIM_SLOTS];       /* when its work is done (monotonic ns) */
static unsigned long long sim_event_done[SIM_SLOTS];
static uintptr_t sim_events[SIM_SLOTS];
static int sim_lock;

static unsigned long long sim_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static int sim_on(void) {
    if (sim_device_ns < 0) {
        const char *text = getenv("FAKECUDA_DEVICE_US");
        long long us = text ? atoll(text) : 0;
        sim_device_ns = us > 0 ? us * 1000 : 0;
    }
    return sim_device_ns > 0;
}

static void sim_acquire(void) { while (__atomic_exchange_n(&sim_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void sim_release(void) { __atomic_store_n(&sim_lock, 0, __ATOMIC_RELEASE); }

/* The slot of a handle in `table` (a new one when unseen; the last one when full). */
static int sim_slot(uintptr_t *table, uintptr_t handle) {
    int i;
    for (i = 0; i < SIM_SLOTS - 1 && table[i] != 0; i++)
        if (table[i] == handle + 1)
            return i;
    table[i] = handle + 1;
    return i;
}

static uintptr_t sim_stream(cudaStream_t stream) {
    uintptr_t handle = (uintptr_t)stream;
    return handle == 1 ? 0 : handle;
}

/* A launch on `stream`: its host cost spent, the device time queued after what the stream
 * had queued. */
static void sim_launch(cudaStream_t stream) {
    unsigned long long now;
    int slot;
    if (sim_launch_ns < 0) {
        const char *text = getenv("FAKECUDA_LAUNCH_US");
        long long us = text ? atoll(text) : 0;
        sim_launch_ns = us > 0 ? us * 1000 : 0;
    }
    if (sim_launch_ns > 0) {
        unsigned long long until = sim_now() + (unsigned long long)sim_launch_ns;
        while (sim_now() < until) {}
    }
    if (!sim_on())
        return;
    now = sim_now();
    sim_acquire();
    slot = sim_slot(sim_handles, sim_stream(stream));
    sim_done[slot] = (sim_done[slot] > now ? sim_done[slot] : now) + sim_device_ns;
    sim_release();
}

static unsigned long long sim_stream_done(cudaStream_t stream) {
    unsigned long long done;
    sim_acquire();
    done = sim_done[sim_slot(sim_handles, sim_stream(stream))];
    sim_release();
    return done;
}

static unsigned long long sim_all_done(void) {
    unsigned long long done = 0;
    int i;
    sim_acquire();
    for (i = 0; i < SIM_SLOTS; i++)
        done = sim_done[i] > done ? sim_done[i] : done;
    sim_release();
    return done;
}

static void sim_wait_until(unsigned long long when) {
    struct timespec ts;
    if (when <= sim_now())
        return;
    ts.tv_sec = (time_t)(when / 1000000000ULL);
    ts.tv_nsec = (long)(when % 1000000000ULL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

static void sim_record(cudaEvent_t event, cudaStream_t stream) {
    unsigned long long now, done;
    int slot;
    if (!sim_on())
        return;
    now = sim_now();
    done = sim_stream_done(stream);
    sim_acquire();
    slot = sim_slot(sim_events, (uintptr_t)event);
    sim_event_done[slot] = done > now ? done : now;
    sim_release();
}

static unsigned long long sim_event(cudaEvent_t event) {
    unsigned long long done;
    sim_acquire();
    done = sim_event_done[sim_slot(sim_events, (uintptr_t)event)];
    sim_release();
    return done;
}

static int valid_device(int device) { return device >= 0 && device < DEVICE_COUNT; }

/* ---- memory ---- */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) { return device_alloc(devPtr, size); }

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    if (devPtr == NULL || (flags != 1 && flags != 2))
        return result(cudaErrorInvalidValue);
    return device_alloc(devPtr, size);
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    (void)stream;
    return device_alloc(devPtr, size);
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    size_t rounded = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (devPtr == NULL || pitch == NULL)
        return result(cudaErrorInvalidValue);
    if (height != 0 && rounded > MAX_ALLOC / height)
        return result(cudaErrorMemoryAllocation);
    *pitch = rounded;
    return device_alloc(devPtr, rounded * height);
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) { return host_alloc(ptr, size); }

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    if (flags > 15)
        return result(cudaErrorInvalidValue);
    return host_alloc(pHost, size);
}

EXPORT cudaError_t cudaFree(void *devPtr) { (void)devPtr; return no_op(1); }
EXPORT cudaError_t cudaFreeHost(void *ptr) { (void)ptr; return no_op(2); }

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    (void)devPtr; (void)stream;
    return no_op(3);
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    (void)dst; (void)src; (void)count;
    if (sim_on())
        sim_wait_until(sim_stream_done(NULL));
    return copy(kind, 1);
}

EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    (void)dst; (void)src; (void)count;
    return copy(kind, 2);
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                                   cudaStream_t stream) {
    (void)dst; (void)src; (void)count; (void)stream;
    return copy(kind, 3);
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                        cudaMemcpyKind kind, cudaStream_t stream) {
    (void)dst; (void)src; (void)count; (void)stream;
    return copy(kind, 4);
}

HELPER cudaError_t copy_2d(size_t dpitch, size_t spitch, size_t width, cudaMemcpyKind kind) {
    if (kind < 0 || kind > 4)
        return result(cudaErrorInvalidMemcpyDirection);
    if (width > dpitch || width > spitch)
        return result(cudaErrorInvalidPitchValue);
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height, cudaMemcpyKind kind) {
    (void)dst; (void)src; (void)height;
    return copy_2d(dpitch, spitch, width, kind);
}

EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, cudaMemcpyKind kind,
                                     cudaStream_t stream) {
    (void)dst; (void)src; (void)height; (void)stream;
    return copy_2d(dpitch, spitch, width, kind);
}

EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                  size_t count) {
    (void)dst; (void)src; (void)count;
    if (!valid_device(dstDevice) || !valid_device(srcDevice))
        return result(cudaErrorInvalidDevice);
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    (void)devPtr; (void)value; (void)count;
    if (sim_on())
        sim_wait_until(sim_stream_done(NULL));
    return no_op(4);
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    (void)devPtr; (void)value; (void)count; (void)stream;
    return no_op(5);
}

EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                        cudaStream_t stream) {
    (void)devPtr; (void)value; (void)count; (void)stream;
    return no_op(6);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    if (free == NULL || total == NULL)
        return result(cudaErrorInvalidValue);
    *free = 76ULL << 30;
    *total = 80ULL << 30;
    return cudaSuccess;
}

/* ---- devices ---- */

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL)
        return result(cudaErrorInvalidValue);
    *count = DEVICE_COUNT;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device) {
    if (device == NULL)
        return result(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device) {
    if (!valid_device(device))
        return result(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
    if (sim_on())
        sim_wait_until(sim_all_done());
    return no_op(7);
}
EXPORT cudaError_t cudaDeviceReset(void) { return no_op(8); }

/* ---- streams ---- */

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return new_handle(pStream, &streams, STREAM_BASE);
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    if (flags > 1)
        return result(cudaErrorInvalidValue);
    return new_handle(pStream, &streams, STREAM_BASE);
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                int priority) {
    if (flags > 1 || priority < -5 || priority > 0)
        return result(cudaErrorInvalidValue);
    return new_handle(pStream, &streams, STREAM_BASE);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) { return need_handle(stream); }

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (sim_on())
        sim_wait_until(sim_stream_done(stream));
    return no_op(9);
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
    (void)stream;
    return no_op(10);
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
    if (sim_on())
        return result(sim_stream_done(stream) > sim_now() ? cudaErrorNotReady : cudaSuccess);
    return result(((uintptr_t)stream & 1) ? cudaErrorNotReady : cudaSuccess);
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    (void)stream; (void)flags;
    return need_handle(event);
}

/* ---- events ---- */

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return new_handle(event, &events, EVENT_BASE);
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (flags > 15)
        return result(cudaErrorInvalidValue);
    return new_handle(event, &events, EVENT_BASE);
}

HELPER cudaError_t record(cudaEvent_t event, int variant) {
    (void)variant;
    return need_handle(event);
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (event != NULL)
        sim_record(event, stream);
    return record(event, 1);
}

EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
    (void)stream;
    return record(event, 2);
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (event != NULL && sim_on())
        sim_wait_until(sim_event(event));
    return need_handle(event);
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (event == NULL)
        return result(cudaErrorInvalidResourceHandle);
    if (sim_on())
        return result(sim_event(event) > sim_now() ? cudaErrorNotReady : cudaSuccess);
    return result(((uintptr_t)event & 1) ? cudaErrorNotReady : cudaSuccess);
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) { return need_handle(event); }

EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == NULL)
        return result(cudaErrorInvalidValue);
    if (start == NULL || end == NULL)
        return result(cudaErrorInvalidResourceHandle);
    *ms = sim_on() ? (float)((double)((long long)(sim_event(end) - sim_event(start))) / 1e6)
                   : 1.5f;
    return cudaSuccess;
}

/* ---- launches ---- */

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream) {
    cudaError_t code;
    (void)args; (void)sharedMem;
    code = launch(func, gridDim, blockDim, 1);
    if (code == cudaSuccess)
        sim_launch(stream);
    return code;
}

EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream) {
    cudaError_t code;
    (void)args; (void)sharedMem;
    code = launch(func, gridDim, blockDim, 2);
    if (code == cudaSuccess)
        sim_launch(stream);
    return code;
}

EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                               void **args, size_t sharedMem,
                                               cudaStream_t stream) {
    (void)args; (void)sharedMem; (void)stream;
    return launch(func, gridDim, blockDim, 3);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                       void **args) {
    (void)args;
    if (config == NULL)
        return result(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, 4);
}

/* ---- graphs ---- */

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    (void)stream;
    return result(mode < 0 || mode > 2 ? cudaErrorInvalidValue : cudaSuccess);
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    (void)stream;
    return new_handle(pGraph, &graphs, GRAPH_BASE);
}

HELPER cudaError_t get_kernel(void **kernel, const void *entry, int variant) {
    (void)variant;
    if (kernel == NULL || entry == NULL)
        return result(cudaErrorInvalidValue);
    return new_handle(kernel, &kernels, KERNEL_BASE);
}

EXPORT cudaError_t __cudaGetKernel(void **kernel, const void *entry) {
    return get_kernel(kernel, entry, 1);
}

EXPORT cudaError_t cudaGetKernel(void **kernel, const void *entry) {
    return get_kernel(kernel, entry, 2);
}

static int registrations;

/* Returns its argument; not inlined: a call (so the caller is no leaf, and keeps its frame)
 * that leaves a non-zero value in the return register. */
__attribute__((noinline)) static int leave_in_return_register(int value) {
    __asm__ volatile("" ::: "memory");
    return value;
}

/* The registration nvcc's start-up code makes for each kernel of a module: the host stub and
 * the device function's (mangled) name. Returns nothing; leaves a non-zero value in the return
 * register, as a void function may. */
EXPORT void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, void *tid,
                                   void *bid, void *bDim, void *gDim, int *wSize) {
    (void)fatCubinHandle; (void)hostFun; (void)deviceFun; (void)deviceName;
    (void)thread_limit; (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;
    registrations = leave_in_return_register(registrations + 1);
}

EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                        unsigned long long flags) {
    (void)flags;
    if (graph == NULL)
        return result(cudaErrorInvalidValue);
    return new_handle(pGraphExec, &execs, EXEC_BASE);
}

/* Graph construction (CUDA 12/13 signatures and node parameter layouts). */
typedef void *cudaGraphNode_t;
typedef struct cudaGraphEdgeData_st cudaGraphEdgeData;                   /* opaque here */
typedef struct cudaGraphInstantiateParams_st cudaGraphInstantiateParams; /* opaque here */
typedef struct cudaGraphExecUpdateResultInfo_st cudaGraphExecUpdateResultInfo; /* opaque */
struct cudaKernelNodeParams {
    void *func;
    dim3 gridDim;
    dim3 blockDim;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
};
struct cudaPos { size_t x, y, z; };
struct cudaPitchedPtr { void *ptr; size_t pitch, xsize, ysize; };
struct cudaExtent { size_t width, height, depth; };
struct cudaMemcpy3DParms {                         /* 160 bytes: extent at 128, kind at 152 */
    void *srcArray;
    struct cudaPos srcPos;
    struct cudaPitchedPtr srcPtr;
    void *dstArray;
    struct cudaPos dstPos;
    struct cudaPitchedPtr dstPtr;
    struct cudaExtent extent;
    cudaMemcpyKind kind;
};
struct cudaMemsetParams {
    void *dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
};

static __thread cudaStreamCaptureMode capture_mode;

HELPER cudaError_t capture_to_graph(cudaGraph_t graph, cudaStreamCaptureMode mode, int variant) {
    (void)variant;
    if (mode < 0 || mode > 2)
        return result(cudaErrorInvalidValue);
    return need_handle(graph);
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                 const cudaGraphNode_t *dependencies,
                                                 const cudaGraphEdgeData *dependencyData,
                                                 size_t numDependencies,
                                                 cudaStreamCaptureMode mode) {
    (void)stream; (void)dependencies; (void)dependencyData; (void)numDependencies;
    return capture_to_graph(graph, mode, 1);
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                      const cudaGraphNode_t *dependencies,
                                                      const cudaGraphEdgeData *dependencyData,
                                                      size_t numDependencies,
                                                      cudaStreamCaptureMode mode) {
    (void)stream; (void)dependencies; (void)dependencyData; (void)numDependencies;
    return capture_to_graph(graph, mode, 2);
}

EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
    cudaStreamCaptureMode previous;
    if (mode == NULL)
        return result(cudaErrorInvalidValue);
    previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return no_op(11);
}

EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags) {
    if (flags != 0)
        return result(cudaErrorInvalidValue);
    return new_handle(pGraph, &graphs, GRAPH_BASE);
}

/* The checks every cudaGraphAdd*Node makes, then `code`; a new node on success. */
HELPER cudaError_t add_node(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                            const cudaGraphNode_t *deps, size_t n, cudaError_t code) {
    if (pGraphNode == NULL || (deps == NULL && n > 0))
        return result(cudaErrorInvalidValue);
    if (graph == NULL)
        return result(cudaErrorInvalidResourceHandle);
    if (code != cudaSuccess)
        return result(code);
    return new_handle(pGraphNode, &nodes, NODE_BASE);
}

static cudaError_t kind_ok(cudaMemcpyKind kind) {
    return kind < 0 || kind > 4 ? cudaErrorInvalidMemcpyDirection : cudaSuccess;
}

EXPORT cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          size_t numDependencies,
                                          const struct cudaKernelNodeParams *pNodeParams) {
    cudaError_t code = pNodeParams == NULL ? cudaErrorInvalidValue
                       : pNodeParams->func == NULL ? cudaErrorInvalidDeviceFunction
                       : cudaSuccess;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

EXPORT cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          size_t numDependencies,
                                          const struct cudaMemcpy3DParms *pCopyParams) {
    cudaError_t code = pCopyParams == NULL ? cudaErrorInvalidValue : kind_ok(pCopyParams->kind);
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

EXPORT cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                            const cudaGraphNode_t *pDependencies,
                                            size_t numDependencies, void *dst, const void *src,
                                            size_t count, cudaMemcpyKind kind) {
    (void)dst; (void)src; (void)count;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, kind_ok(kind));
}

EXPORT cudaError_t cudaGraphAddMemcpyNodeToSymbol(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                  const cudaGraphNode_t *pDependencies,
                                                  size_t numDependencies, const void *symbol,
                                                  const void *src, size_t count, size_t offset,
                                                  cudaMemcpyKind kind) {
    (void)symbol; (void)src; (void)count; (void)offset;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, kind_ok(kind));
}

EXPORT cudaError_t cudaGraphAddMemcpyNodeFromSymbol(cudaGraphNode_t *pGraphNode,
                                                    cudaGraph_t graph,
                                                    const cudaGraphNode_t *pDependencies,
                                                    size_t numDependencies, void *dst,
                                                    const void *symbol, size_t count,
                                                    size_t offset, cudaMemcpyKind kind) {
    (void)dst; (void)symbol; (void)count; (void)offset;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, kind_ok(kind));
}

EXPORT cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          size_t numDependencies,
                                          const struct cudaMemsetParams *pMemsetParams) {
    unsigned int size = pMemsetParams ? pMemsetParams->elementSize : 0;
    cudaError_t code = size == 1 || size == 2 || size == 4 ? cudaSuccess : cudaErrorInvalidValue;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

EXPORT cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                              const cudaGraphNode_t *pDependencies,
                                              size_t numDependencies, cudaGraph_t childGraph) {
    cudaError_t code = childGraph == NULL ? cudaErrorInvalidResourceHandle : cudaSuccess;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

EXPORT cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                         const cudaGraphNode_t *pDependencies,
                                         size_t numDependencies) {
    return add_node(pGraphNode, graph, pDependencies, numDependencies, no_op(12));
}

EXPORT cudaError_t cudaGraphAddEventRecordNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                               const cudaGraphNode_t *pDependencies,
                                               size_t numDependencies, cudaEvent_t event) {
    cudaError_t code = event == NULL ? cudaErrorInvalidResourceHandle : cudaSuccess;
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

EXPORT cudaError_t cudaGraphAddEventWaitNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                             const cudaGraphNode_t *pDependencies,
                                             size_t numDependencies, cudaEvent_t event) {
    cudaError_t code = event == NULL ? cudaErrorInvalidResourceHandle : no_op(13);
    return add_node(pGraphNode, graph, pDependencies, numDependencies, code);
}

HELPER cudaError_t instantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, int variant) {
    (void)variant;
    if (graph == NULL)
        return result(cudaErrorInvalidValue);
    return new_handle(pGraphExec, &execs, EXEC_BASE);
}

EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                 unsigned long long flags) {
    (void)flags;
    return instantiate(pGraphExec, graph, 1);
}

EXPORT cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                  cudaGraphInstantiateParams *instantiateParams) {
    (void)instantiateParams;
    return instantiate(pGraphExec, graph, 2);
}

EXPORT cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
                                                       cudaGraph_t graph,
                                                       cudaGraphInstantiateParams *params) {
    (void)params;
    return instantiate(pGraphExec, graph, 3);
}

EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t hGraphExec,
                                                    cudaGraphNode_t node,
                                                    const struct cudaKernelNodeParams *pNodeParams) {
    if (hGraphExec == NULL || node == NULL)
        return result(cudaErrorInvalidResourceHandle);
    return result(pNodeParams == NULL ? cudaErrorInvalidValue : cudaSuccess);
}

EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                       cudaGraphExecUpdateResultInfo *resultInfo) {
    (void)resultInfo;
    if (hGraphExec == NULL)
        return result(cudaErrorInvalidResourceHandle);
    return need_handle(hGraph);
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return need_handle(graph); }

EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    if (graphExec == NULL)
        return result(cudaErrorInvalidResourceHandle);
    return no_op(14);
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    (void)stream;
    return need_handle(graphExec);
}

/* ---- errors ---- */

EXPORT cudaError_t cudaGetLastError(void) {
    cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

/* ---- page-locking host memory ---- */

HELPER cudaError_t check_pointer(const void *ptr, size_t size, int variant) {
    (void)variant;
    return result(ptr == NULL || size == 0 ? cudaErrorInvalidValue : cudaSuccess);
}

EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    (void)flags;
    return check_pointer(ptr, size, 1);
}

EXPORT cudaError_t cudaHostUnregister(void *ptr) { return check_pointer(ptr, 1, 2); }
