/* nest_prog DEPTH TIMES [JUMPS]: first JUMPS calls of the stand-in's cudaMemcpy (DEPTH deep)
 * left by longjmp from the innermost, then TIMES calls, each DEPTH deep, that return. */
#include <setjmp.h>
#include <stddef.h>
#include <stdlib.h>

int cudaMemcpy(void *dst, const void *src, size_t count, int kind);
extern void (*cuda_nest_jump)(void);

static jmp_buf back;

static void jump(void) { longjmp(back, 1); }

int main(int argc, char **argv) {
    size_t depth = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
    long times = argc > 2 ? strtol(argv[2], NULL, 10) : 1;
    long jumps = argc > 3 ? strtol(argv[3], NULL, 10) : 0;
    cuda_nest_jump = jump;
    for (volatile long i = 0; i < jumps; i++)
        if (!setjmp(back))
            cudaMemcpy(NULL, NULL, depth, 99);
    for (long i = 0; i < times; i++)
        cudaMemcpy(NULL, NULL, depth, 0);
    return 0;
}
