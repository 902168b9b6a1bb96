/*
 * robust_dlopen.c: loads a libcudart stand-in with dlopen only when told to, for the tests of
 * libraries loaded after tracing began and of a library replaced on disk.
 *
 * Usage: robust_dlopen PATH
 *   prints "ready pid=<pid>"; then per stdin line: "open" dlopens PATH (prints "opened");
 *   a number K makes K calls cudaMemcpy(dst = tid, src = seq, count = seq, kind = 0) through
 *   the loaded library and prints "done <K>". Exits 0 at EOF, 3 when dlopen or a call fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*memcpy_fn)(void *, const void *, size_t, int);

int main(int argc, char **argv) {
    char line[64];
    memcpy_fn call = NULL;
    unsigned long seq = 0;
    uintptr_t tid = (uintptr_t)syscall(SYS_gettid);
    if (argc != 2) {
        fprintf(stderr, "usage: robust_dlopen PATH\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready pid=%d\n", getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "open", 4) == 0) {
            void *lib = dlopen(argv[1], RTLD_NOW);
            call = lib ? (memcpy_fn)dlsym(lib, "cudaMemcpy") : NULL;
            if (!call) {
                fprintf(stderr, "dlopen: %s\n", dlerror());
                return 3;
            }
            printf("opened\n");
            continue;
        }
        unsigned long k = strtoul(line, NULL, 10);
        for (unsigned long i = 0; i < k; i++, seq++)
            if (!call || call((void *)tid, (void *)(uintptr_t)seq, seq, 0) != 0)
                return 3;
        printf("done %lu\n", k);
    }
    return 0;
}
