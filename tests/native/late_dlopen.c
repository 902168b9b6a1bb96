/*
 * late_dlopen.c: loads a libcudart stand-in with dlopen from a folder named only on its
 * command line, after the trace began, then calls it; for tests/test_late_load.py.
 *
 * Usage: late_dlopen DIR CALLS [ROUNDS [PAUSE_MS [DELAY_MS [SPACING_US]]]]
 *   waits DELAY_MS (default 200) milliseconds, then ROUNDS times (default 1):
 *     dlopen("DIR/libcudart.so.12", RTLD_NOW) (DIR itself when it ends in ".so": a library
 *     of another name that carries the runtime, called through its module_malloc, see
 *     late_module.c), prints "opened <round> <CLOCK_MONOTONIC ns>",
 *     waits PAUSE_MS (default 0), makes CALLS calls
 *     cudaMalloc(&p, size = (round << 20) + seq + 1) (seq from 0 in each round), each
 *     SPACING_US (default 0) microseconds after the one before (a busy wait: no system
 *     call), prints "called <round> <CALLS>", dlclose()s the library (every round but the
 *     last; the last keeps it mapped until exit).
 *   Exits 0; 3 when dlopen, dlsym or a call fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*malloc_fn)(void **, size_t);

static void pause_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    char path[4096];
    if (argc < 3) {
        fprintf(stderr, "usage: late_dlopen DIR CALLS [ROUNDS [PAUSE_MS [DELAY_MS]]]\n");
        return 2;
    }
    long calls = atol(argv[2]);
    long rounds = argc > 3 ? atol(argv[3]) : 1;
    long pause = argc > 4 ? atol(argv[4]) : 0;
    long delay = argc > 5 ? atol(argv[5]) : 200;
    long long spacing = argc > 6 ? atoll(argv[6]) * 1000LL : 0;
    const char *entry = "cudaMalloc";
    size_t length = strlen(argv[1]);
    if (length > 3 && strcmp(argv[1] + length - 3, ".so") == 0) {
        snprintf(path, sizeof path, "%s", argv[1]);
        entry = "module_malloc";
    } else {
        snprintf(path, sizeof path, "%s/libcudart.so.12", argv[1]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    pause_ms(delay);
    for (long round = 0; round < rounds; round++) {
        void *lib = dlopen(path, RTLD_NOW);
        malloc_fn call = lib ? (malloc_fn)dlsym(lib, entry) : NULL;
        if (!call) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 3;
        }
        printf("opened %ld %lld\n", round, now_ns());
        if (pause)
            pause_ms(pause);
        long long next = now_ns();
        for (long seq = 0; seq < calls; seq++) {
            void *p = NULL;
            while (spacing && now_ns() < next) {
            }
            next += spacing;
            if (call(&p, (size_t)((round << 20) + seq + 1)) != 0)
                return 3;
        }
        printf("called %ld %ld\n", round, calls);
        if (round + 1 < rounds)
            dlclose(lib);
    }
    return 0;
}
