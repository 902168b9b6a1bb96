/* Probe targets for the ring buffer tests: each function is a uprobe site whose arguments tell
 * the attached eBPF program what record to produce. The drivers loop in C so that filling a
 * large ring costs no Python call per record. Build as a shared library (loaded with ctypes). */
#include <stdint.h>

#define PROBE_SITE __attribute__((noinline, used, visibility("default")))

static volatile uint64_t sink; /* a side effect so calls are not optimised away */

/* One fixed 64-byte record holding `seq`; discarded when `discard` is non-zero. */
PROBE_SITE void rb_emit(uint64_t seq, uint64_t discard)
{
    sink = seq ^ discard;
    __asm__ volatile("" ::: "memory");
}

/* One record of `size & 255` bytes (ringbuf_output from a stack buffer). */
PROBE_SITE void rb_emit_var(uint64_t seq, uint64_t size)
{
    sink = seq + size;
    __asm__ volatile("" ::: "memory");
}

/* One 5000-byte record (larger than a page) copied from `buf`. */
PROBE_SITE void rb_emit_big(uint64_t seq, const void *buf)
{
    sink = seq + (uint64_t)(uintptr_t)buf;
    __asm__ volatile("" ::: "memory");
}

/* rb_emit(first .. first + count - 1); every `discard_every`-th is discarded (0: none). */
PROBE_SITE void rb_emit_many(uint64_t first, uint64_t count, uint64_t discard_every)
{
    for (uint64_t i = 0; i < count; i++) {
        uint64_t seq = first + i;
        rb_emit(seq, discard_every && seq % discard_every == 0);
    }
}
