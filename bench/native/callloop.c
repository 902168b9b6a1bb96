/*
 * callloop.c: calls one CUDA runtime function in a tight loop and times it from inside, so
 * the tracer's cost is measured where it is paid (the traced thread), not guessed from outside.
 *
 * Build (bench/common.py does this) against the stand-in libcudart.so.12 or a real one:
 *   gcc -O2 -g -fno-omit-frame-pointer callloop.c -L DIR -l:libcudart.so.12 \
 *       -Wl,-rpath,DIR -lpthread
 *
 * Usage: callloop [--op getdevice|launch|getlasterror|sync] [-n CALLS] [-k REPS] [-s SECONDS]
 *                 [-r RATE] [-t THREADS] [--cpu N] [--warmup CALLS]
 *   -n CALLS     calls per repetition per thread (default 1000000)
 *   -k REPS      repetitions (default 1); one `rep` line each (thread 0's timing)
 *   -s SECONDS   instead of -n/-k: call for SECONDS (clock checked every 256 calls)
 *   -r RATE      total calls per second over all threads (paced in 1 ms slots; 0 = flat out)
 *   -t THREADS   threads calling in parallel (default 1)
 *   --cpu N      pin every calling thread to CPU N (-1: no pinning)
 *
 * Output (one `key=value` line each; bench/common.py parses them):
 *   start realtime=<CLOCK_REALTIME at main, s.ns> monotonic=<CLOCK_MONOTONIC, s.ns> pid=<pid>
 *   rep i=<k> calls=<n> ns_per_call=<f> cpu_ns_per_call=<f>   (per repetition, thread 0;
 *       wall clock, and the thread's CPU time: immune to being preempted on a busy machine)
 *   total calls=<all threads> elapsed_s=<f> rate=<calls/s> threads=<T> errors=<non-zero results>
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef struct dim3 { unsigned int x, y, z; } dim3;
cudaError_t cudaGetDevice(int *);
cudaError_t cudaGetLastError(void);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
cudaError_t cudaStreamSynchronize(void *);

static void kernel_stub(void) {}

struct config {
    const char *op;
    unsigned long calls, reps, threads;
    double seconds, rate;
    int cpu;
};

struct worker {
    const struct config *cfg;
    unsigned long index, made, errors;
    double *rep_ns, *rep_cpu_ns;
};

static double now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int call_once(int op) {
    if (op == 0) {
        int device;
        return cudaGetDevice(&device);
    }
    if (op == 1)
        return cudaGetLastError();
    if (op == 3)
        return cudaStreamSynchronize(0);
    dim3 grid = {64, 1, 1}, block = {256, 1, 1};
    void *args[1] = {0};
    return cudaLaunchKernel((const void *)kernel_stub, grid, block, args, 0, 0);
}

static int op_code(const char *name) {
    if (strcmp(name, "getdevice") == 0)
        return 0;
    if (strcmp(name, "getlasterror") == 0)
        return 1;
    if (strcmp(name, "launch") == 0)
        return 2;
    if (strcmp(name, "sync") == 0)  /* a row that --stacks gives a user stack */
        return 3;
    fprintf(stderr, "callloop: unknown op %s\n", name);
    exit(2);
}

/* n calls as fast as possible; the number of non-zero results. */
static unsigned long burst(int op, unsigned long n) {
    unsigned long errors = 0;
    for (unsigned long i = 0; i < n; i++)
        errors += call_once(op) != 0;
    return errors;
}

static void sleep_until(double t) {
    struct timespec ts = {(time_t)t, (long)((t - (time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Calls for cfg->seconds, flat out or paced to this thread's share of cfg->rate. */
static void timed_run(struct worker *w, int op) {
    const struct config *cfg = w->cfg;
    double start = now(CLOCK_MONOTONIC), end = start + cfg->seconds;
    double per_thread = cfg->rate / cfg->threads;
    double slot = 0.001, t = start;
    while (t < end) {
        unsigned long n = 256;
        if (per_thread > 0) {
            double due = per_thread * (t - start + slot);
            n = due > w->made ? (unsigned long)(due - w->made) : 0;
        }
        w->errors += burst(op, n);
        w->made += n;
        if (per_thread > 0)
            sleep_until(t + slot > end ? end : t + slot);
        t = now(CLOCK_MONOTONIC);
    }
}

static void *work(void *arg) {
    struct worker *w = arg;
    const struct config *cfg = w->cfg;
    int op = op_code(cfg->op);
    if (cfg->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cfg->cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    if (cfg->seconds > 0) {
        timed_run(w, op);
        return NULL;
    }
    for (unsigned long k = 0; k < cfg->reps; k++) {
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
        w->errors += burst(op, cfg->calls);
        w->rep_cpu_ns[k] = (now(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e9 / cfg->calls;
        w->rep_ns[k] = (now(CLOCK_MONOTONIC) - t0) * 1e9 / cfg->calls;
        w->made += cfg->calls;
    }
    return NULL;
}

static void usage(void) {
    fprintf(stderr, "usage: callloop [--op OP] [-n CALLS] [-k REPS] [-s SECONDS] [-r RATE] "
                    "[-t THREADS] [--cpu N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    double real0 = now(CLOCK_REALTIME), mono0 = now(CLOCK_MONOTONIC);
    struct config cfg = {"getdevice", 1000000, 1, 1, 0, 0, -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(a, "--op") == 0) cfg.op = v;
        else if (strcmp(a, "-n") == 0) cfg.calls = strtoul(v, NULL, 0);
        else if (strcmp(a, "-k") == 0) cfg.reps = strtoul(v, NULL, 0);
        else if (strcmp(a, "-s") == 0) cfg.seconds = atof(v);
        else if (strcmp(a, "-r") == 0) cfg.rate = atof(v);
        else if (strcmp(a, "-t") == 0) cfg.threads = strtoul(v, NULL, 0);
        else if (strcmp(a, "--cpu") == 0) cfg.cpu = atoi(v);
        else usage();
        i++;
    }
    if (cfg.threads < 1 || cfg.reps < 1 || cfg.calls < 1)
        usage();
    printf("start realtime=%.9f monotonic=%.9f pid=%d\n", real0, mono0, (int)getpid());
    fflush(stdout);

    struct worker *ws = calloc(cfg.threads, sizeof *ws);
    pthread_t *tids = calloc(cfg.threads, sizeof *tids);
    double t0 = now(CLOCK_MONOTONIC);
    for (unsigned long t = 0; t < cfg.threads; t++) {
        ws[t].cfg = &cfg;
        ws[t].index = t;
        ws[t].rep_ns = calloc(cfg.reps, sizeof(double));
        ws[t].rep_cpu_ns = calloc(cfg.reps, sizeof(double));
        if (pthread_create(&tids[t], NULL, work, &ws[t]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    unsigned long made = 0, errors = 0;
    for (unsigned long t = 0; t < cfg.threads; t++) {
        pthread_join(tids[t], NULL);
        made += ws[t].made;
        errors += ws[t].errors;
    }
    double elapsed = now(CLOCK_MONOTONIC) - t0;
    if (cfg.seconds <= 0)
        for (unsigned long k = 0; k < cfg.reps; k++)
            printf("rep i=%lu calls=%lu ns_per_call=%.2f cpu_ns_per_call=%.2f\n", k, cfg.calls,
                   ws[0].rep_ns[k], ws[0].rep_cpu_ns[k]);
    printf("total calls=%lu elapsed_s=%.6f rate=%.0f threads=%lu errors=%lu\n", made, elapsed,
           made / elapsed, cfg.threads, errors);
    return 0;
}
