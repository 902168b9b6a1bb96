/*
 * burst_app.c: loads libregister_burst.so (linked: its constructor's 30,000 registrations run
 * before main, as a framework's import burst does), then launches the kernels whose indexes
 * its arguments give, once each, and prints "launched N".
 *
 * Build: gcc -O2 burst_app.c -L DIR -lregister_burst -Wl,-rpath,DIR
 * Usage: burst_app INDEX...
 */
#include <stdio.h>
#include <stdlib.h>

unsigned burst_kernels(void);
int burst_launch(unsigned i);

int main(int argc, char **argv) {
    int failed = 0;
    for (int k = 1; k < argc; k++)
        failed |= burst_launch((unsigned)strtoul(argv[k], NULL, 10));
    printf("launched %d of %u\n", argc - 1, burst_kernels());
    return failed;
}
