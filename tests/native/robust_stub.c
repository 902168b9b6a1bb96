/*
 * robust_stub.c: a minimal libcudart stand-in for the robustness tests (built as
 * libcudart.so.12 in its own folder by tests/robust_util.py).
 *
 * Unlike fakecudart.c, no function here touches its pointer arguments: out-parameters are
 * never written, so a caller may pass NULL, unmapped or kernel addresses and the call still
 * succeeds (returns 0). That lets a test hand the tracer out-parameters it cannot read.
 *
 * `robust_semaphore` is a 2-byte counter in .data (file-backed), a harmless place for a
 * uprobe's ref_ctr_offset (tests/test_robust_errors.py provokes a conflicting probe with it).
 */
#include <stddef.h>

#pragma GCC optimize("no-optimize-sibling-calls", "no-shrink-wrap", "no-ipa-icf")

__attribute__((used, section(".data"))) unsigned short robust_semaphore = 0;
volatile unsigned long robust_sink;  /* keeps the bodies from being folded together */

int cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    robust_sink = (unsigned long)dst + (unsigned long)src + count + (unsigned long)kind;
    return 0;
}

int cudaGetDevice(int *device) {
    robust_sink = (unsigned long)device;
    return 0;
}

int cudaMalloc(void **ptr, size_t size) {
    robust_sink = (unsigned long)ptr ^ size;
    return 0;
}

int cudaFree(void *ptr) {
    robust_sink = (unsigned long)ptr + 1;
    return 0;
}

int cudaSetDevice(int device) {
    robust_sink = (unsigned long)device + 2;
    return device < 0 || device >= 2 ? 101 : 0;
}
