/*
 * fakenccl.c: a stand-in for NVIDIA's libnccl.so.2, for end-to-end tests without a GPU.
 *
 * Built by tests (tests/fakenccl.py) as `libnccl.so.2` (soname libnccl.so.2) with
 *   gcc -O2 -g -shared -fPIC -fno-omit-frame-pointer -fcf-protection=none -fno-shrink-wrap
 *       -fno-ipa-icf -fno-optimize-sibling-calls -Wl,-soname,libnccl.so.2
 * so every exported function begins with `push %rbp` and no two share an address.
 *
 * Every function has NCCL 2.32's signature (nccl.h) and succeeds unless noted; nothing
 * touches the buffers (they need not be memory). Results (ncclResult_t):
 *   ncclGetUniqueId(id)            4 (InvalidArgument) if id NULL; byte i = (seed*31 + i) & 0xff
 *                                  with seed = $FAKENCCL_ID_SEED (decimal), else the pid
 *   ncclCommInitRank(c, n, id, r)  4 if c NULL, n < 1 or r not in [0, n); *c = a new
 *   ncclCommInitRankConfig(..., cfg)  communicator of rank r of n (malloc'ed). With
 *   ncclCommInitRankScalable(c, n, r, nId, ids, cfg)   $FAKENCCL_RENDEZVOUS = a folder, each
 *                                  rank waits there for the others (as NCCL's blocking init
 *                                  does): it creates <folder>/<id bytes 0-7 in hex>.<r> and
 *                                  returns once n such files exist, or 2 (SystemError) after
 *                                  30 s. Scalable takes ids[0]; 4 if nId < 1 or ids NULL.
 *   ncclCommInitAll(cs, n, devs)   4 if cs NULL or n < 1; cs[i] = rank i of n
 *   ncclCommSplit(c, color, key, nc, cfg)   4 if c or nc NULL; color -1 (NCCL_SPLIT_NOCOLOR):
 *                                  *nc = NULL; else *nc = rank c.rank / 2 of c.nranks / 2 (the
 *                                  tests split with color = rank % 2, key = rank)
 *   ncclCommFinalize/Destroy/Abort(c)   4 if c NULL (Destroy and Abort free it)
 *   ncclCommCount(c, n), ncclCommUserRank(c, r), ncclCommCuDevice(c, d)
 *                                  4 if c or the out-pointer NULL; nranks, rank, and the
 *                                  device = rank % 2
 *   collectives, ncclSend, ncclRecv    4 if comm NULL, datatype > 11 or op > 4 (built-in
 *                                  ops only); 4 if a root or peer is not in [0, nranks)
 *   ncclBcast(buff, ...)           calls ncclBroadcast(buff, buff, ...), as NCCL does
 *   ncclGroupStart()               0; ncclGroupEnd() 5 (InvalidUsage) without a group open
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#pragma GCC optimize("no-optimize-sibling-calls", "no-shrink-wrap", "no-ipa-icf")

#define EXPORT __attribute__((visibility("default"), noinline))

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
               ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5 }
    ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct fakeComm { int nranks, rank, device; ncclUniqueId id; } *ncclComm_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
typedef struct ncclConfig ncclConfig_t;
typedef struct ncclCollConfig ncclCollConfig_t;

static __thread int group_depth;

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (id == NULL) return ncclInvalidArgument;
    const char *env = getenv("FAKENCCL_ID_SEED");
    long seed = env ? strtol(env, NULL, 10) : (long)getpid();
    for (int i = 0; i < 128; i++) id->internal[i] = (char)((seed * 31 + i) & 0xff);
    return ncclSuccess;
}

/* Wait until every rank of the id has come (see the header), when asked to. */
static ncclResult_t rendezvous(const ncclUniqueId *id, int nranks, int rank) {
    const char *folder = getenv("FAKENCCL_RENDEZVOUS");
    if (folder == NULL) return ncclSuccess;
    char tag[17], path[4096];
    for (int i = 0; i < 8; i++) sprintf(tag + 2 * i, "%02x", (unsigned char)id->internal[i]);
    snprintf(path, sizeof path, "%s/%s.%d", folder, tag, rank);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    if (fd < 0) return ncclSystemError;
    close(fd);
    for (int waited = 0; waited < 30000; waited++) {
        int present = 0;
        for (int r = 0; r < nranks; r++) {
            struct stat st;
            snprintf(path, sizeof path, "%s/%s.%d", folder, tag, r);
            present += stat(path, &st) == 0;
        }
        if (present == nranks) return ncclSuccess;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return ncclSystemError;
}

static ncclComm_t new_comm(int nranks, int rank, const ncclUniqueId *id) {
    ncclComm_t comm = calloc(1, sizeof *comm);
    if (comm == NULL) return NULL;
    comm->nranks = nranks;
    comm->rank = rank;
    comm->device = rank % 2;
    if (id != NULL) comm->id = *id;
    return comm;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank) {
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    ncclResult_t met = rendezvous(id, nranks, rank);
    if (met != ncclSuccess) return met;
    *comm = new_comm(nranks, rank, id);
    return *comm ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                     int rank) {
    return init_rank(comm, nranks, &commId, rank);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                           int rank, ncclConfig_t *config) {
    (void)config;
    return init_rank(comm, nranks, &commId, rank);
}

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config) {
    (void)config;
    if (nId < 1 || commIds == NULL) return ncclInvalidArgument;
    return init_rank(comm, nranks, &commIds[0], rank);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (comms == NULL || ndev < 1) return ncclInvalidArgument;
    for (int i = 0; i < ndev; i++) {
        comms[i] = new_comm(ndev, i, NULL);
        if (comms[i] == NULL) return ncclSystemError;
        comms[i]->device = devlist ? devlist[i] : i;
    }
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config) {
    (void)key; (void)config;
    if (comm == NULL || newcomm == NULL) return ncclInvalidArgument;
    if (color == -1) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    *newcomm = new_comm(comm->nranks / 2, comm->rank / 2, &comm->id);
    return *newcomm ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    return comm == NULL ? ncclInvalidArgument : ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (comm == NULL || count == NULL) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (comm == NULL || rank == NULL) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (comm == NULL || device == NULL) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

static ncclResult_t check(ncclComm_t comm, ncclDataType_t datatype, ncclRedOp_t op, int root) {
    if (comm == NULL || datatype < 0 || datatype > 11 || op < 0 || op > 4)
        return ncclInvalidArgument;
    if (root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, op, 0);
}

EXPORT ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op,
                                        ncclComm_t comm, cudaStream_t stream,
                                        const ncclCollConfig_t *config) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream; (void)config;
    return check(comm, datatype, op, 0);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, root);
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, op, root);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm,
                                  cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)sendcount; (void)stream;
    return check(comm, datatype, 0, 0);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op,
                                      ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)recvcount; (void)stream;
    return check(comm, datatype, op, 0);
}

EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm,
                                 cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, 0);
}

EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, root);
}

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
    (void)sendbuff; (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, root);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                             int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, peer);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
    (void)recvbuff; (void)count; (void)stream;
    return check(comm, datatype, 0, peer);
}

EXPORT ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    group_depth--;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t result) {
    return result == ncclSuccess ? "no error" : "error";
}
