/*
 * robust_load.c: CUDA call workloads for the robustness tests, linked against
 * robust_stub.c's libcudart.so.12 (tests/robust_util.py builds both).
 *
 * Every call it makes is cudaMemcpy(dst = (void *)tid, src = (void *)seq, count = seq, kind = 0):
 * tid is the calling thread's id and seq counts that thread's calls from 0, so each traced
 * exit event says which thread made it (dst must equal the event's tid) and which call it was.
 *
 * Usage (stdout is line-buffered):
 *   robust_load threads T N      T threads make N calls each, as fast as they can; prints
 *                                "tid=<tid>" per thread, then "made=<T*N> pid=<pid>"
 *   robust_load bursts           prints "ready pid=<pid>"; for each line K read from stdin
 *                                makes K calls and prints "done <K> total=<calls so far>";
 *                                exits 0 at EOF
 *   robust_load signal N M CODE  makes N calls, prints "done <N> pid=<pid>", waits for SIGINT
 *                                or SIGTERM, makes M more calls, prints "after <M> sig=<sig>",
 *                                exits CODE
 *   robust_load rate R S         about R calls a second (1 ms batches) for S seconds; prints
 *                                "made=<n>"
 *   robust_load fork K1 K2       forks; the child makes K1 calls, prints "child pid=<pid>" and
 *                                exits; the parent waits for it, makes K2 calls, prints
 *                                "parent pid=<pid>"
 *   robust_load exec K           prints "exec pid=<pid>" and execs itself as "threads 1 K"
 *   robust_load badptrs          calls cudaGetDevice/cudaMalloc with out-parameters the tracer
 *                                cannot read (see badptrs below); one line per call
 * Exit status: 0 (or CODE), 2 on bad usage, 3 when a call returns non-zero.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int cudaMemcpy(void *dst, const void *src, size_t count, int kind);
int cudaGetDevice(int *device);
int cudaMalloc(void **ptr, size_t size);

static __thread unsigned long seq;

static void calls(unsigned long n) {
    uintptr_t tid = (uintptr_t)syscall(SYS_gettid);
    for (unsigned long i = 0; i < n; i++, seq++) {
        if (cudaMemcpy((void *)tid, (void *)(uintptr_t)seq, seq, 0) != 0) {
            fprintf(stderr, "cudaMemcpy failed\n");
            exit(3);
        }
    }
}

static void *thread_main(void *arg) {
    calls(*(unsigned long *)arg);
    printf("tid=%ld\n", (long)syscall(SYS_gettid));
    return NULL;
}

static int run_threads(unsigned long nthreads, unsigned long n) {
    pthread_t *ids = calloc(nthreads, sizeof *ids);
    for (unsigned long t = 0; t < nthreads; t++)
        pthread_create(&ids[t], NULL, thread_main, &n);
    for (unsigned long t = 0; t < nthreads; t++)
        pthread_join(ids[t], NULL);
    printf("made=%lu pid=%d\n", nthreads * n, getpid());
    return 0;
}

static int run_bursts(void) {
    char line[64];
    unsigned long total = 0;
    printf("ready pid=%d\n", getpid());
    while (fgets(line, sizeof line, stdin)) {
        unsigned long k = strtoul(line, NULL, 10);
        calls(k);
        total += k;
        printf("done %lu total=%lu\n", k, total);
    }
    return 0;
}

static int run_signal(unsigned long n, unsigned long m, int code) {
    sigset_t set;
    int sig = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    calls(n);
    printf("done %lu pid=%d\n", n, getpid());
    sigwait(&set, &sig);
    calls(m);
    printf("after %lu sig=%d\n", m, sig);
    return code;
}

static int run_rate(unsigned long rate, unsigned long seconds) {
    struct timespec next;
    unsigned long per_ms = rate / 1000 ? rate / 1000 : 1, made = 0;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (unsigned long ms = 0; ms < seconds * 1000; ms++) {
        calls(per_ms);
        made += per_ms;
        next.tv_nsec += 1000000;
        if (next.tv_nsec >= 1000000000) {
            next.tv_nsec -= 1000000000;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    printf("made=%lu\n", made);
    return 0;
}

static int run_fork(unsigned long k1, unsigned long k2) {
    pid_t child = fork();
    if (child == 0) {
        calls(k1);
        printf("child pid=%d\n", getpid());
        fflush(stdout);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    calls(k2);
    printf("parent pid=%d\n", getpid());
    return 0;
}

static int run_exec(const char *self, const char *k) {
    printf("exec pid=%d\n", getpid());
    fflush(stdout);
    execl(self, self, "threads", "1", k, (char *)NULL);
    perror("execl");
    return 2;
}

/* Out-parameters a tracer cannot read; the stub never writes them, so every call succeeds. */
static int run_badptrs(void) {
    long page = sysconf(_SC_PAGESIZE);
    char *gone = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *noaccess = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int device = 7;
    void *ptr = (void *)0x1234;
    munmap(gone, page);
    printf("getdevice_null ret=%d\n", cudaGetDevice(NULL));
    printf("getdevice_unmapped ret=%d\n", cudaGetDevice((int *)gone));
    printf("getdevice_noaccess ret=%d\n", cudaGetDevice((int *)noaccess));
    printf("getdevice_kernel ret=%d\n", cudaGetDevice((int *)0xffffffff81000000UL));
    printf("getdevice_noncanonical ret=%d\n", cudaGetDevice((int *)0x8000000000000000UL));
    printf("getdevice_straddle ret=%d\n", cudaGetDevice((int *)(noaccess - 2)));
    printf("getdevice_valid ret=%d device=%d\n", cudaGetDevice(&device), device);
    printf("malloc_null_huge ret=%d\n", cudaMalloc(NULL, ~(size_t)0));
    printf("malloc_valid_huge ret=%d ptr=%p\n", cudaMalloc(&ptr, (size_t)1 << 62), ptr);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && strcmp(argv[1], "threads") == 0)
        return run_threads(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
    if (argc >= 2 && strcmp(argv[1], "bursts") == 0)
        return run_bursts();
    if (argc >= 5 && strcmp(argv[1], "signal") == 0)
        return run_signal(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), atoi(argv[4]));
    if (argc >= 4 && strcmp(argv[1], "rate") == 0)
        return run_rate(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
    if (argc >= 4 && strcmp(argv[1], "fork") == 0)
        return run_fork(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
    if (argc >= 3 && strcmp(argv[1], "exec") == 0)
        return run_exec("/proc/self/exe", argv[2]);
    if (argc >= 2 && strcmp(argv[1], "badptrs") == 0)
        return run_badptrs();
    fprintf(stderr, "usage: robust_load threads T N | bursts | signal N M CODE | rate R S | "
                    "fork K1 K2 | exec K | badptrs\n");
    return 2;
}
