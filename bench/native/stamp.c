/* stamp.c: prints CLOCK_REALTIME as its first act, for start-up measurements
 * (bench/startup.py): `stamp realtime=<s.ns>`. */
#include <stdio.h>
#include <time.h>

int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    printf("stamp realtime=%ld.%09ld\n", (long)ts.tv_sec, ts.tv_nsec);
    return 0;
}
