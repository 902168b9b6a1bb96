/*
 * nccl_rank.c: one "rank" of an NCCL job, calling what its command line says, for the tests
 * (tests/fakenccl.py). Linked against a libnccl.so.2: the stand-in (fakenccl.c) or NVIDIA's.
 *
 *   nccl_rank [--init=rank|config|scalable|all:N|none] [--getid] NRANKS RANK SEED OP...
 *
 * It joins communicator RANK of NRANKS whose unique id has byte i = (SEED*31 + i) & 0xff
 * (--getid: the id ncclGetUniqueId gives, its first 64 bytes printed in hex) with
 * ncclCommInitRank (or the --init variant), then runs the OPs in order on the current
 * communicator:
 *   ar:COUNT:TYPE:OP   arcfg:COUNT:TYPE:OP (ncclAllReduceConfig)   rs:COUNT:TYPE:OP
 *   bc:COUNT:TYPE:ROOT (ncclBroadcast)   bcast:COUNT:TYPE:ROOT (ncclBcast)   rd:COUNT:TYPE:OP:ROOT
 *   ag:COUNT:TYPE   a2a:COUNT:TYPE   ga:COUNT:TYPE:ROOT   sc:COUNT:TYPE:ROOT
 *   send:COUNT:TYPE:PEER   recv:COUNT:TYPE:PEER   gs (ncclGroupStart)   ge (ncclGroupEnd)
 *   split:COLOR:KEY (the new communicator becomes the current one)   userrank   count   cudev
 *   finalize   destroy   abort   nullcomm (the current communicator becomes NULL)   sleep:MS
 *   wait (reads a line from stdin: a tracer attaches meanwhile)
 * Collectives get sendbuff 0xa0000000, recvbuff 0xb0000000 (ncclBcast: buff 0xb0000000) and
 * stream 0x5000; nothing is dereferenced by the stand-in. One line per call on stdout:
 *   OP ret=RESULT out=0xHANDLE|- fn=FUNCTION [name=value...]
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct opaqueComm *ncclComm_t;
typedef void *cudaStream_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    void *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId,
                                      ncclUniqueId *ids, void *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           void *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank);
ncclResult_t ncclCommCuDevice(ncclComm_t comm, int *device);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, ncclComm_t c,
                           cudaStream_t st);
ncclResult_t ncclAllReduceConfig(const void *s, void *r, size_t n, int t, int op, ncclComm_t c,
                                 cudaStream_t st, const void *config);
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, ncclComm_t c,
                           cudaStream_t st);
ncclResult_t ncclBcast(void *b, size_t n, int t, int root, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, ncclComm_t c,
                        cudaStream_t st);
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c,
                           cudaStream_t st);
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, ncclComm_t c,
                               cudaStream_t st);
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, int t, ncclComm_t c,
                          cudaStream_t st);
ncclResult_t ncclGather(const void *s, void *r, size_t n, int t, int root, ncclComm_t c,
                        cudaStream_t st);
ncclResult_t ncclScatter(const void *s, void *r, size_t n, int t, int root, ncclComm_t c,
                         cudaStream_t st);
ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#define SEND ((const void *)0xa0000000UL)
#define RECV ((void *)0xb0000000UL)
#define STREAM ((cudaStream_t)0x5000UL)

static void line(const char *op, int ret, const void *out, int has_out, const char *fn,
                 const char *extra) {
    if (has_out)
        printf("%s ret=%d out=0x%lx fn=%s%s%s\n", op, ret, (unsigned long)(uintptr_t)out, fn,
               extra[0] ? " " : "", extra);
    else
        printf("%s ret=%d out=- fn=%s%s%s\n", op, ret, fn, extra[0] ? " " : "", extra);
    fflush(stdout);
}

/* The numbers after the op's name: "ar:1024:7:0" -> 1024, 7, 0. */
static int fields(const char *spec, long long *v, int most) {
    int n = 0;
    const char *p = strchr(spec, ':');
    while (p != NULL && n < most) {
        v[n++] = strtoll(p + 1, NULL, 0);
        p = strchr(p + 1, ':');
    }
    return n;
}

static int starts(const char *spec, const char *name) {
    size_t len = strlen(name);
    return strncmp(spec, name, len) == 0 && (spec[len] == ':' || spec[len] == '\0');
}

static ncclComm_t comm, parent;

static void run(const char *spec) {
    long long v[4] = {0, 0, 0, 0};
    char extra[256] = "";
    fields(spec, v, 4);
    size_t n = (size_t)v[0];
    int t = (int)v[1], third = (int)v[2], fourth = (int)v[3], r = 0;
    if (starts(spec, "ar")) {
        r = ncclAllReduce(SEND, RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclAllReduce", extra);
    } else if (starts(spec, "arcfg")) {
        r = ncclAllReduceConfig(SEND, RECV, n, t, third, comm, STREAM, NULL);
        line(spec, r, NULL, 0, "ncclAllReduceConfig", extra);
    } else if (starts(spec, "rs")) {
        r = ncclReduceScatter(SEND, RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclReduceScatter", extra);
    } else if (starts(spec, "bc")) {
        r = ncclBroadcast(SEND, RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclBroadcast", extra);
    } else if (starts(spec, "bcast")) {
        r = ncclBcast(RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclBcast", extra);
    } else if (starts(spec, "rd")) {
        r = ncclReduce(SEND, RECV, n, t, third, fourth, comm, STREAM);
        line(spec, r, NULL, 0, "ncclReduce", extra);
    } else if (starts(spec, "ag")) {
        r = ncclAllGather(SEND, RECV, n, t, comm, STREAM);
        line(spec, r, NULL, 0, "ncclAllGather", extra);
    } else if (starts(spec, "a2a")) {
        r = ncclAlltoAll(SEND, RECV, n, t, comm, STREAM);
        line(spec, r, NULL, 0, "ncclAlltoAll", extra);
    } else if (starts(spec, "ga")) {
        r = ncclGather(SEND, RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclGather", extra);
    } else if (starts(spec, "sc")) {
        r = ncclScatter(SEND, RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclScatter", extra);
    } else if (starts(spec, "send")) {
        r = ncclSend(SEND, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclSend", extra);
    } else if (starts(spec, "recv")) {
        r = ncclRecv(RECV, n, t, third, comm, STREAM);
        line(spec, r, NULL, 0, "ncclRecv", extra);
    } else if (starts(spec, "gs")) {
        line(spec, ncclGroupStart(), NULL, 0, "ncclGroupStart", extra);
    } else if (starts(spec, "ge")) {
        line(spec, ncclGroupEnd(), NULL, 0, "ncclGroupEnd", extra);
    } else if (starts(spec, "split")) {
        ncclComm_t made = NULL;
        r = ncclCommSplit(comm, (int)v[0], (int)v[1], &made, NULL);
        line(spec, r, made, 1, "ncclCommSplit", extra);
        if (r == 0 && made != NULL) {
            parent = comm;
            comm = made;
        }
    } else if (starts(spec, "userrank") || starts(spec, "count") || starts(spec, "cudev")) {
        int value = -1;
        const char *fn = spec[0] == 'u' ? "ncclCommUserRank"
                         : spec[0] == 'c' && spec[1] == 'o' ? "ncclCommCount" : "ncclCommCuDevice";
        r = spec[0] == 'u' ? ncclCommUserRank(comm, &value)
            : spec[1] == 'o' ? ncclCommCount(comm, &value) : ncclCommCuDevice(comm, &value);
        snprintf(extra, sizeof extra, "value=%d", value);
        line(spec, r, NULL, 0, fn, extra);
    } else if (starts(spec, "finalize")) {
        line(spec, ncclCommFinalize(comm), NULL, 0, "ncclCommFinalize", extra);
    } else if (starts(spec, "destroy")) {
        line(spec, ncclCommDestroy(comm), NULL, 0, "ncclCommDestroy", extra);
        comm = parent;
        parent = NULL;
    } else if (starts(spec, "abort")) {
        line(spec, ncclCommAbort(comm), NULL, 0, "ncclCommAbort", extra);
        comm = parent;
        parent = NULL;
    } else if (starts(spec, "nullcomm")) {
        comm = NULL;
    } else if (starts(spec, "wait")) {
        char buffer[64];
        if (fgets(buffer, sizeof buffer, stdin) == NULL) exit(3);
    } else if (starts(spec, "sleep")) {
        struct timespec pause = {(time_t)(v[0] / 1000), (long)(v[0] % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    } else {
        fprintf(stderr, "nccl_rank: unknown op %s\n", spec);
        exit(2);
    }
}

int main(int argc, char **argv) {
    const char *init = "rank";
    int getid = 0, i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strncmp(argv[i], "--init=", 7) == 0)
            init = argv[i] + 7;
        else if (strcmp(argv[i], "--getid") == 0)
            getid = 1;
    }
    if (argc - i < 3) {
        fprintf(stderr, "usage: nccl_rank [--init=...] [--getid] NRANKS RANK SEED OP...\n");
        return 2;
    }
    int nranks = atoi(argv[i]), rank = atoi(argv[i + 1]);
    long seed = strtol(argv[i + 2], NULL, 0);
    ncclUniqueId id;
    char extra[256];
    for (int b = 0; b < 128; b++) id.internal[b] = (char)((seed * 31 + b) & 0xff);
    if (getid) {
        int r = ncclGetUniqueId(&id);
        char hex[129];
        for (int b = 0; b < 64; b++) sprintf(hex + 2 * b, "%02x", (unsigned char)id.internal[b]);
        snprintf(extra, sizeof extra, "id=%s", hex);
        line("getid", r, NULL, 0, "ncclGetUniqueId", extra);
    }
    snprintf(extra, sizeof extra, "nranks=%d rank=%d", nranks, rank);
    if (strcmp(init, "rank") == 0) {
        int r = ncclCommInitRank(&comm, nranks, id, rank);
        line("init", r, comm, 1, "ncclCommInitRank", extra);
    } else if (strcmp(init, "config") == 0) {
        int r = ncclCommInitRankConfig(&comm, nranks, id, rank, NULL);
        line("init", r, comm, 1, "ncclCommInitRankConfig", extra);
    } else if (strcmp(init, "scalable") == 0) {
        int r = ncclCommInitRankScalable(&comm, nranks, rank, 1, &id, NULL);
        line("init", r, comm, 1, "ncclCommInitRankScalable", extra);
    } else if (strncmp(init, "all:", 4) == 0) {
        ncclComm_t comms[8] = {0};
        int ndev = atoi(init + 4);
        int r = ncclCommInitAll(comms, ndev, NULL);
        snprintf(extra, sizeof extra, "ndev=%d", ndev);
        line("init", r, comms[0], 1, "ncclCommInitAll", extra);
        comm = comms[0];
    }
    for (i += 3; i < argc; i++) run(argv[i]);
    return 0;
}
