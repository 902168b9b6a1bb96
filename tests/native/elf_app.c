/* Links against a (stand-in) libcudart, prints the run-time addresses of its own function
 * `elf_marker` and of cudaMalloc, then waits until stdin closes. */
#include <stdio.h>
#include <stddef.h>

int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);

__attribute__((noinline)) int elf_marker(int x) { return x * 3 + 1; }

int main(void) {
    void *p = 0;
    int rc = cudaMalloc(&p, 64);
    int (*volatile alloc)(void **, size_t) = cudaMalloc;
    printf("%p %p %d\n", (void *)elf_marker, (void *)alloc, rc + elf_marker(0));
    fflush(stdout);
    while (getchar() != EOF) {
    }
    cudaFree(p);
    return 0;
}
