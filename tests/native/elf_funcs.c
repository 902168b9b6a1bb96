/* Functions for symbol tests: a C++-mangled kernel-like name, a local (static) function, a
 * versioned-looking alias, and a big function to symbolize addresses inside it. */
#include <stdio.h>

__attribute__((noinline)) void vec_add(const float *a, const float *b, float *c, int n)
    __asm__("_Z6vecAddPKfS0_Pfi");
__attribute__((noinline)) void vec_add(const float *a, const float *b, float *c, int n) {
    for (int i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

__attribute__((noinline)) static int local_helper(int x) { return x * 7 + 3; }

__attribute__((noinline)) int elf_exported(int x) { return local_helper(x) + 1; }

int main(int argc, char **argv) {
    float a[4] = {1, 2, 3, 4}, c[4];
    (void)argv;
    vec_add(a, a, c, 4);
    printf("%f %d\n", c[argc % 4], elf_exported(argc));
    return 0;
}
