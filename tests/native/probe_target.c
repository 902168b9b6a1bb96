/* A tiny library for uprobe tests: functions with known arguments and return values.
 * noinline + a volatile sink keep every function a real, separately callable symbol. */
#include <string.h>

volatile long probe_target_sink;

__attribute__((noinline)) void pt_tick(void) { probe_target_sink++; }

__attribute__((noinline)) int pt_add(int a, int b) {
    probe_target_sink += a;
    return a + b;
}

/* Register arguments of several kinds, including pointers to read with probe_read_user. */
__attribute__((noinline)) long pt_args(int a, long b, const char *text, const int *p,
                                       unsigned long e, long f) {
    probe_target_sink += (long)strlen(text) + *p;
    return a + b + (long)e + f;
}

/* Eight arguments: the 7th and 8th are passed on the stack (x86-64). */
__attribute__((noinline)) long pt_many(long a1, long a2, long a3, long a4, long a5, long a6,
                                       long a7, long a8) {
    probe_target_sink += a1;
    return a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8;
}

__attribute__((noinline)) void pt_one(void) { probe_target_sink += 1; }
__attribute__((noinline)) void pt_two(void) { probe_target_sink += 2; }
__attribute__((noinline)) void pt_three(void) { probe_target_sink += 3; }
