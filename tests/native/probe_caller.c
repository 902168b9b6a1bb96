/* Calls the probe_target functions a known number of times.
 * usage: probe_caller N [wait]
 *   pt_tick N times, pt_add(40, 2), pt_args(7, -5, "hello uprobe", &1234, 99, -1),
 *   pt_many(1..8), pt_one once, pt_two twice, pt_three three times.
 * With "wait" it prints "ready PID" and waits for a line on stdin before calling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pt_tick(void);
int pt_add(int a, int b);
long pt_args(int a, long b, const char *text, const int *p, unsigned long e, long f);
long pt_many(long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8);
void pt_one(void);
void pt_two(void);
void pt_three(void);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1;
    static const int value = 1234;
    char line[16];
    int i;

    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    for (i = 0; i < n; i++)
        pt_tick();
    printf("add %d\n", pt_add(40, 2));
    printf("args %ld\n", pt_args(7, -5, "hello uprobe", &value, 99, -1));
    printf("many %ld\n", pt_many(1, 2, 3, 4, 5, 6, 7, 8));
    pt_one();
    pt_two();
    pt_two();
    pt_three();
    pt_three();
    pt_three();
    printf("done\n");
    return 0;
}
