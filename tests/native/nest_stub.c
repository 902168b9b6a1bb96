/*
 * nest_stub.c: a libcudart.so.12 stand-in whose cudaMemcpy calls itself: cudaMemcpy(dst, src,
 * depth, kind) makes depth nested calls on one thread (the outermost counts as one), the way
 * layered libraries nest their calls. With kind 99 the innermost call runs cuda_nest_jump, a
 * hook the program sets: it leaves the call with longjmp (as an error handler or a language
 * runtime's exception can), so those calls never return. Built with fakecuda.LIB_FLAGS.
 */
#include <stddef.h>

#pragma GCC optimize("no-optimize-sibling-calls", "no-shrink-wrap", "no-ipa-icf")

__attribute__((visibility("default"))) void (*cuda_nest_jump)(void) = NULL;

__attribute__((visibility("default"), noinline)) int cudaMemcpy(void *dst, const void *src,
                                                                 size_t count, int kind) {
    volatile int ret = 0;
    if (count > 1)
        ret = cudaMemcpy(dst, src, count - 1, kind);
    else if (kind == 99 && cuda_nest_jump)
        cuda_nest_jump();
    return ret;
}
