/*
 * late_calls.c: a CUDA program started after `ebpf-cuda monitor`, for
 * tests/test_monitor_late.py: it makes CALLS launches and CALLS allocations through a runtime
 * the monitor never saw at its start.
 *
 * Usage: late_calls LIB CALLS [PAUSE_MS [SPACING_US [DELAY_MS]]]  (built plainly: dlopen)
 *        late_calls CALLS [PAUSE_MS [SPACING_US]]                 (built with -DLINKED)
 *   Built plainly, waits DELAY_MS (default 0), then dlopen(LIB, RTLD_NOW) and the
 *   functions by dlsym; with -DLINKED the
 *   cudaLaunchKernel and cudaMalloc the program links (a DT_NEEDED libcudart, or the
 *   stand-in runtime linked into the executable itself, as nvcc links cudart statically).
 *   Prints "start <CLOCK_MONOTONIC ns>" once the functions are at hand, waits PAUSE_MS
 *   (default 0; -1: until a line comes on stdin), prints "first <ns>" and makes CALLS rounds, round k (from 0) at
 *   first + k * SPACING_US microseconds (a busy wait: no system call):
 *   cudaLaunchKernel(late_kernel, grid 1x1x1, block 32x1x1, NULL, 0, NULL), then
 *   cudaMalloc(&p, k + 1); prints "called <CALLS>". Exits 0; 3 when a call fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*malloc_fn)(void **, size_t);

#ifdef LINKED
int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem,
                     void *stream);
int cudaMalloc(void **p, size_t size);
#define ARGS_FROM 1
#else
#define ARGS_FROM 2
#endif

static void late_kernel(void) {}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void pause_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

int main(int argc, char **argv) {
    if (argc < ARGS_FROM + 1) {
        fprintf(stderr, "usage: late_calls %sCALLS [PAUSE_MS [SPACING_US]]\n",
                ARGS_FROM == 2 ? "LIB " : "");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef LINKED
    launch_fn launch = cudaLaunchKernel;
    malloc_fn alloc = cudaMalloc;
#else
    if (argc > ARGS_FROM + 3)
        pause_ms(atol(argv[ARGS_FROM + 3]));
    void *lib = dlopen(argv[1], RTLD_NOW);
    launch_fn launch = lib ? (launch_fn)dlsym(lib, "cudaLaunchKernel") : NULL;
    malloc_fn alloc = lib ? (malloc_fn)dlsym(lib, "cudaMalloc") : NULL;
    if (!launch || !alloc) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
#endif
    long calls = atol(argv[ARGS_FROM]);
    long pause = argc > ARGS_FROM + 1 ? atol(argv[ARGS_FROM + 1]) : 0;
    long long spacing = argc > ARGS_FROM + 2 ? atoll(argv[ARGS_FROM + 2]) * 1000LL : 0;
    printf("start %lld\n", now_ns());
    if (pause < 0) {
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 3;
    } else if (pause) {
        pause_ms(pause);
    }
    long long first = now_ns();
    printf("first %lld\n", first);
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    for (long k = 0; k < calls; k++) {
        void *p = NULL;
        while (spacing && now_ns() < first + k * spacing) {
        }
        if (launch((const void *)late_kernel, grid, block, NULL, 0, NULL) != 0 ||
            alloc(&p, (size_t)k + 1) != 0)
            return 3;
    }
    printf("called %ld\n", calls);
    return 0;
}
