/* nest_prog DEPTH TIMES: TIMES calls of the stand-in's cudaMemcpy, each DEPTH deep. */
#include <stddef.h>
#include <stdlib.h>

int cudaMemcpy(void *dst, const void *src, size_t count, int kind);

int main(int argc, char **argv) {
    size_t depth = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
    long times = argc > 2 ? strtol(argv[2], NULL, 10) : 1;
    for (long i = 0; i < times; i++)
        cudaMemcpy(NULL, NULL, depth, 0);
    return 0;
}
