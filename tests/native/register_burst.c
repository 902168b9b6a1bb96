/*
 * register_burst.c: a library that registers kernels as PyTorch's libtorch_cuda.so does at
 * import: its constructor calls __cudaRegisterFunction once per kernel, BURST_KERNELS times
 * in a row (30,000: 10000..39999), each with a device name of ~300 bytes that is a string
 * literal in the file's .rodata — pages nothing has read yet when the call is made (the
 * runtime only keeps the pointer; `unmap_names` makes sure of it). `burst_launch(i)`
 * launches kernel i (0-based) the CUDA 12 way: cudaLaunchKernel of its host function, an
 * address inside `burst_stubs` (no symbol starts there: only the registration names it).
 *
 * Build: gcc -O2 -shared -fPIC register_burst.c -o libregister_burst.so -L DIR
 *        -l:libcudart.so.12 (the stand-in runtime)
 * The name of kernel i: "burst_kernel_" (10000 + i) BURST_PAD.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int cudaError_t;
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, void *tid, void *bid,
                            void *bDim, void *gDim, int *wSize);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             unsigned long smem, void *stream);

#define BURST_PAD "_padded_as_a_template_instance_name_is_in_a_framework_library_so_that_" \
    "every_name_takes_two_of_the_probes_name_chunks_of_255_bytes_" \
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789" \
    "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz_end"
#define K(n) "burst_kernel_" #n BURST_PAD,
#define D1(p) K(p##0) K(p##1) K(p##2) K(p##3) K(p##4) K(p##5) K(p##6) K(p##7) K(p##8) K(p##9)
#define D2(p) D1(p##0) D1(p##1) D1(p##2) D1(p##3) D1(p##4) D1(p##5) D1(p##6) D1(p##7) \
    D1(p##8) D1(p##9)
#define D3(p) D2(p##0) D2(p##1) D2(p##2) D2(p##3) D2(p##4) D2(p##5) D2(p##6) D2(p##7) \
    D2(p##8) D2(p##9)
#define D4(p) D3(p##0) D3(p##1) D3(p##2) D3(p##3) D3(p##4) D3(p##5) D3(p##6) D3(p##7) \
    D3(p##8) D3(p##9)

/* The pointers are relocated at load (.data.rel.ro); the strings themselves are not read. */
static const char *const names[] = {D4(1) D4(2) D4(3)};
#define BURST_KERNELS (sizeof names / sizeof names[0])

/* The host functions: one byte each (a `ret`), in one block of code with no symbol but at
 * its start. */
__asm__(".pushsection .text\n.p2align 6\nburst_stubs:\n.fill 30000, 1, 0xc3\n.popsection");
extern const char burst_stubs[] __attribute__((visibility("hidden")));
_Static_assert(BURST_KERNELS == 30000, "the block of host functions has one per kernel");

static void *fat_binary[2];

/* Whatever the page cache holds, no page of the names is mapped in when the burst begins
 * (as in a large library just loaded, where fault-around mapped few of them): the pointers
 * are read, never the strings. */
static void unmap_names(void) {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (unsigned i = 0; i < BURST_KERNELS; i++) {
        uintptr_t at = (uintptr_t)names[i];
        lo = at < lo ? at : lo;
        hi = at > hi ? at : hi;
    }
    lo &= ~(uintptr_t)4095;
    hi = (hi | 4095) + 1; /* (through the page the last name begins in: not the next segment) */
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* With BURST_READ_NAMES=1 in the environment, every name is read before the burst
 * instead: the probe can read them all (what the names map then holds is the bound). */
static void read_names(void) {
    volatile unsigned sum = 0;
    for (unsigned i = 0; i < BURST_KERNELS; i++)
        for (const char *c = names[i]; *c; c++)
            sum += (unsigned char)*c;
}

__attribute__((constructor)) static void register_all(void) {
    const char *read = getenv("BURST_READ_NAMES");
    if (read != NULL && strcmp(read, "1") == 0)
        read_names();
    else
        unmap_names();
    for (unsigned i = 0; i < BURST_KERNELS; i++)
        __cudaRegisterFunction(fat_binary, burst_stubs + i, (char *)names[i], names[i], -1,
                               (void *)0, (void *)0, (void *)0, (void *)0, (void *)0);
}

unsigned burst_kernels(void) { return BURST_KERNELS; }

int burst_launch(unsigned i) {
    static int n = 1;
    void *args[1] = {&n};
    dim3 grid = {1 + i % 7, 1, 1}, block = {32, 1, 1};
    return cudaLaunchKernel(burst_stubs + i, grid, block, args, 0, (void *)0);
}
