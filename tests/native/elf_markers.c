/* Names a scan for a few symbols must get right: cudaMalloc is a data object here (not a
 * function), cudaFree only called (undefined), cudaGetDevice a local function, and
 * my_cudaLaunchKernel a function whose name ends with another marker's (a linker may store
 * "cudaLaunchKernel" as the tail of its string). */
int cudaMalloc = 7;
extern int cudaFree(void *);
__attribute__((noinline, noclone)) static int cudaGetDevice(int *d) { *d = cudaMalloc; return 0; }
__attribute__((noinline, noclone)) int my_cudaLaunchKernel(int x) { return x + 1; }

int main(int argc, char **argv) {
    int d = 0;
    (void)argv;
    cudaGetDevice(&d);
    if (argc > 5)
        return cudaFree(&d);
    return my_cudaLaunchKernel(d) == 8 ? 0 : 1;
}
