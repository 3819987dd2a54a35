// comm.c — the front end of the collectives, the same in every build: the world, group
// validation, argument checks, groups of one process (copies, never a backend call) and
// the deterministic sums. The backend (comm_mpi.c or comm_local.c) moves the data.
//
// Sums. A sum over a group is a reduce-scatter followed, for an all-reduce, by an
// all-gather: the buffer is cut into `size` blocks, an all-to-all sends block q of every
// rank to rank q, rank q adds the `size` copies of its block in rank order
// (comm_sum_in_order), and an all-gather returns the sums to every rank. Each rank sends
// and receives (P-1)/P of the buffer in each of the two exchanges, 2(P-1)/P in all: the
// volume of a ring all-reduce, in O(P) messages per exchange instead of O(log P) rounds
// of a tree, plus (P-1)/P of the buffer in additions on each rank. All-reduces run in
// chunks of ALLREDUCE_CHUNK elements so the receive scratch stays bounded.
#include <limits.h>
#include <string.h>

#include "parallel/comm_impl.h"
#include "core/device.h"

// Every data movement and ordered sum below runs with tensor memory open (strict mode,
// src/core/strict_memory.h), as an op does: the collectives are the host code allowed to
// read and write it. MPI may move the data of a non-blocking collective inside any MPI
// call, so each backend call that can progress one (test, wait, progress, barrier) is
// bracketed too.
#define WITH_TENSORS(stmt)     \
    do {                       \
        device_access_begin(); \
        stmt;                  \
        device_access_end();   \
    } while (0)

#define ALLREDUCE_CHUNK ((size_t)1 << 22)

static struct {
    int ready, rank, size;
    CommImpl *impl;
} world = {0, 0, 1, NULL};

static void *scratch;  // receive buffer of the blocking reduce-scatter, grown on demand
static size_t scratch_bytes;

size_t comm_type_size(CommType t) { return t == CT_FLOAT || t == CT_INT32 ? 4 : 8; }

// Tiles of the output are summed in a local buffer, so out may alias any part.
#define SUM_IN_ORDER(type)                                                                     \
    do {                                                                                       \
        type tile[1024];                                                                       \
        for (size_t at = 0; at < count; at += 1024) {                                          \
            size_t m = MT_MIN((size_t)1024, count - at);                                       \
            memcpy(tile, (const type *)parts[0] + at, m * sizeof(type));                       \
            for (int q = 1; q < nparts; q++) {                                                 \
                const type *p = (const type *)parts[q] + at;                                   \
                for (size_t i = 0; i < m; i++) tile[i] += p[i];                                \
            }                                                                                  \
            memcpy((type *)out + at, tile, m * sizeof(type));                                  \
        }                                                                                      \
    } while (0)

void comm_sum_in_order(CommType t, void *out, const void *const *parts, int nparts, size_t count) {
    if (t == CT_FLOAT) SUM_IN_ORDER(float);
    else if (t == CT_DOUBLE) SUM_IN_ORDER(double);
    else MT_ASSERT(!"ordered sums are of float or double");
}

// ---- the world ---------------------------------------------------------------------------

// How many processes a launcher started, from its environment: 0 when none did.
static int launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return getenv("PMIX_RANK") ? 1 : 0;
}

int comm_launched(void) {
    const char *force = getenv("MOETRON_MPI");
    if (force && *force) return strcmp(force, "0") != 0;
    return launcher_size() > 0;
}

void comm_world_init(int *argc, char ***argv) {
    if (world.ready) return;
    world.size = backend_world_init(argc, argv, &world.rank, &world.impl);
    world.ready = 1;
    const char *force = getenv("MOETRON_MPI");
    int expected = launcher_size();
    if (world.size > 1 || expected <= 1 || (force && !strcmp(force, "0"))) return;
    if (!strcmp(backend_name(), "none"))
        mt_die("the launcher started %d processes, but this moetron was built without MPI; rebuild it where "
               "mpicc is found (docs/parallelism.md)", expected);
    mt_die("the launcher started %d processes, but MPI sees only this one; build moetron with the launcher's MPI "
           "(its mpicc), and with srun pass --mpi=pmix or --mpi=pmi2", expected);
}

void comm_world_finalize(void) {
    if (!world.ready) return;
    free(scratch);
    scratch = NULL;
    scratch_bytes = 0;
    backend_free(world.impl);
    world.impl = NULL;
    backend_world_finalize();
    world.ready = world.rank = 0;
    world.size = 1;
}

int comm_world_rank(void) { return world.rank; }
int comm_world_size(void) { return world.size; }
Comm comm_world(void) { return (Comm){.name = "world", .rank = world.rank, .size = world.size, .impl = world.impl}; }
const char *comm_backend_name(void) { return backend_name(); }

// ---- groups --------------------------------------------------------------------------------

Comm comm_self(const char *name) { return (Comm){.name = name, .rank = 0, .size = 1}; }

Comm comm_group(const char *name, const int *ranks, int n) {
    if (n < 1) mt_die("process group %s: no ranks given", name);
    unsigned char *seen = mt_calloc((size_t)world.size, 1);
    int member = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= world.size)
            mt_die("process group %s: rank %d is outside the world of %d processes", name, ranks[i], world.size);
        if (seen[ranks[i]]++) mt_die("process group %s: rank %d is listed twice", name, ranks[i]);
        if (ranks[i] == world.rank) member = i;
    }
    free(seen);
    Comm g = {.name = name, .rank = member, .size = member >= 0 ? n : 0};
    if (world.size > 1) g.impl = backend_group(name, ranks, n, member);
    return g;
}

void comm_free(Comm *g) {
    if (g->impl && g->impl != world.impl) backend_free(g->impl);
    g->impl = NULL;
}

// ---- argument helpers ------------------------------------------------------------------------

static void require_member(const Comm *g, const char *op) {
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size)
        mt_die("internal error: %s on process group %s, which this process is not in (please report)", op,
               g->name);
}

static size_t *equal_counts(const Comm *g, size_t block) {
    size_t *counts = mt_malloc((size_t)g->size * sizeof(size_t));
    for (int q = 0; q < g->size; q++) counts[q] = block;
    return counts;
}

// Blocks back to back: displs[q] = counts[0] + ... + counts[q-1].
static size_t *prefix_displs(const Comm *g, const size_t *counts) {
    size_t *displs = mt_malloc((size_t)g->size * sizeof(size_t)), at = 0;
    for (int q = 0; q < g->size; q++) displs[q] = at, at += counts[q];
    return displs;
}

static void *grow_scratch(size_t bytes) {
    if (bytes > scratch_bytes) {
        free(scratch);
        scratch = mt_malloc(bytes);
        scratch_bytes = bytes;
    }
    return scratch;
}

// ---- bytes sent (comm.h, "Bytes sent") ------------------------------------------------------

#define MAX_COUNTED_GROUPS 32  // distinct group names; groups.c makes a dozen

static struct {
    const char *name;
    uint64_t bytes;
} sent[MAX_COUNTED_GROUPS];
static int n_sent;

static uint64_t *sent_counter(const char *name) {
    for (int i = 0; i < n_sent; i++)
        if (!strcmp(sent[i].name, name)) return &sent[i].bytes;
    MT_ASSERT(n_sent < MAX_COUNTED_GROUPS);
    sent[n_sent].name = name;
    sent[n_sent].bytes = 0;
    return &sent[n_sent++].bytes;
}

uint64_t comm_bytes_take(const char *name) {
    uint64_t *counter = sent_counter(name), bytes = *counter;
    *counter = 0;
    return bytes;
}

void comm_bytes_reset(void) {
    for (int i = 0; i < n_sent; i++) sent[i].bytes = 0;
}

static void count_sent(const Comm *g, uint64_t bytes) { *sent_counter(g->name) += bytes; }

// Elements of the blocks that go to the other members (counts per group rank).
static size_t to_others(const Comm *g, const size_t *counts) {
    size_t total = 0;
    for (int q = 0; q < g->size; q++)
        if (q != g->rank) total += counts[q];
    return total;
}

// Elements this rank sends in `op` over blocks of counts[q] elements: a reduce-scatter sends
// every other member its block, an all-gather this rank's block to each of them, an
// all-reduce both.
static size_t op_elements_sent(const Comm *g, CommOp op, const size_t *counts) {
    size_t scatter = to_others(g, counts), gather = (size_t)(g->size - 1) * counts[g->rank];
    if (op == OP_SENDRECV) return counts[g->rank];  // to the next rank only
    return op == OP_REDUCE_SCATTER ? scatter : op == OP_ALLGATHER ? gather : scatter + gather;
}

// The backend's data movements, counted.
static void move_alltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                           const size_t *send_displs, void *recv, const size_t *recv_counts,
                           const size_t *recv_displs) {
    count_sent(g, (uint64_t)to_others(g, send_counts) * comm_type_size(t));
    WITH_TENSORS(backend_alltoallv(g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs));
}

static void move_allgatherv(const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                            const size_t *displs) {
    count_sent(g, (uint64_t)op_elements_sent(g, OP_ALLGATHER, counts) * comm_type_size(t));
    WITH_TENSORS(backend_allgatherv(g, t, send, recv, counts, displs));
}

static CommPending *start_counted(const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                                  const size_t *counts) {
    count_sent(g, (uint64_t)op_elements_sent(g, op, counts) * comm_type_size(t));
    CommPending *p;
    WITH_TENSORS(p = backend_istart(g, op, t, send, recv, counts));
    return p;
}

// ---- sums ------------------------------------------------------------------------------------

// Rank g->rank receives in recv the ordered sum of block g->rank (counts[q] elements at
// send + displs[q]); recv may be that block of send.
static void reduce_scatter_blocks(const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                                  const size_t *displs) {
    if (backend_sums_on_device(g)) {  // the blocks are back to back (displs their prefix sums)
        CommRequest req = {.pending = start_counted(g, OP_REDUCE_SCATTER, t, send, recv, counts)};
        comm_wait(&req);
        return;
    }
    int P = g->size;
    size_t es = comm_type_size(t), mine = counts[g->rank];
    char *in = grow_scratch((size_t)P * mine * es);
    size_t *recv_counts = equal_counts(g, mine), *recv_displs = prefix_displs(g, recv_counts);
    move_alltoallv(g, t, send, counts, displs, in, recv_counts, recv_displs);
    const void **parts = mt_malloc((size_t)P * sizeof(void *));
    for (int q = 0; q < P; q++) parts[q] = in + (size_t)q * mine * es;
    WITH_TENSORS(comm_sum_in_order(t, recv, parts, P, mine));
    free(parts);
    free(recv_counts);
    free(recv_displs);
}

// The blocks of an even split of n elements into P: the first n % P have one more.
static void split_even(size_t n, int P, size_t *counts, size_t *displs) {
    size_t at = 0;
    for (int q = 0; q < P; q++) {
        counts[q] = n / P + ((size_t)q < n % P);
        displs[q] = at;
        at += counts[q];
    }
}

size_t comm_allreduce_elements_sent(const Comm *g, size_t n) {
    if (g->size <= 1) return 0;
    size_t elements = 0, *counts = equal_counts(g, 0), *displs = equal_counts(g, 0);
    for (size_t start = 0; start < n; start += ALLREDUCE_CHUNK) {
        split_even(MT_MIN(ALLREDUCE_CHUNK, n - start), g->size, counts, displs);
        elements += op_elements_sent(g, OP_ALLREDUCE, counts);
    }
    free(counts);
    free(displs);
    return elements;
}

static void allreduce_in_order(const Comm *g, CommType t, void *x, size_t n) {
    require_member(g, "all-reduce");
    if (g->size == 1) return;
    size_t es = comm_type_size(t), *counts = equal_counts(g, 0), *displs = equal_counts(g, 0);
    for (size_t start = 0; start < n; start += ALLREDUCE_CHUNK) {
        char *chunk = (char *)x + start * es;
        split_even(MT_MIN(ALLREDUCE_CHUNK, n - start), g->size, counts, displs);
        char *mine = chunk + displs[g->rank] * es;
        reduce_scatter_blocks(g, t, chunk, mine, counts, displs);
        move_allgatherv(g, t, mine, chunk, counts, displs);
    }
    free(counts);
    free(displs);
}

void comm_allreduce_sum(const Comm *g, real *x, size_t n) { allreduce_in_order(g, CT_REAL, x, n); }
void comm_allreduce_sum_double(const Comm *g, double *x, size_t n) { allreduce_in_order(g, CT_DOUBLE, x, n); }

// An all-reduce exact in any order (the backend's own), counted as the sums of real numbers move.
static void allreduce_exact(const Comm *g, CommType t, CommReduceOp op, void *x, size_t n) {
    require_member(g, "all-reduce");
    if (g->size == 1) return;
    size_t *counts = equal_counts(g, 0), *displs = equal_counts(g, 0);
    split_even(n, g->size, counts, displs);
    count_sent(g, (uint64_t)op_elements_sent(g, OP_ALLREDUCE, counts) * comm_type_size(t));
    free(counts);
    free(displs);
    WITH_TENSORS(backend_allreduce_exact(g, t, op, x, n));
}

void comm_allreduce_sum_int64(const Comm *g, int64_t *x, size_t n) { allreduce_exact(g, CT_INT64, REDUCE_SUM, x, n); }
void comm_allreduce_max(const Comm *g, real *x, size_t n) { allreduce_exact(g, CT_REAL, REDUCE_MAX, x, n); }

// ---- data movement --------------------------------------------------------------------------

static void alltoallv_typed(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs) {
    require_member(g, "all-to-all");
    if (g->size > 1) {
        move_alltoallv(g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return;
    }
    if (send_counts[0] != recv_counts[0])
        mt_die("internal error: all-to-all on process group %s sends %zu elements to itself but receives %zu "
               "(please report)", g->name, send_counts[0], recv_counts[0]);
    size_t es = comm_type_size(t);
    device_copy((char *)recv + recv_displs[0] * es, (const char *)send + send_displs[0] * es, send_counts[0] * es);
}

void comm_alltoall_v(const Comm *g, const real *send, const size_t *send_counts, const size_t *send_displs,
                     real *recv, const size_t *recv_counts, const size_t *recv_displs) {
    alltoallv_typed(g, CT_REAL, send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

void comm_alltoall_v_int32(const Comm *g, const int32_t *send, const size_t *send_counts,
                           const size_t *send_displs, int32_t *recv, const size_t *recv_counts,
                           const size_t *recv_displs) {
    alltoallv_typed(g, CT_INT32, send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

static void alltoall_equal(const Comm *g, CommType t, const void *send, void *recv, size_t block) {
    require_member(g, "all-to-all");
    size_t *counts = equal_counts(g, block), *displs = prefix_displs(g, counts);
    alltoallv_typed(g, t, send, counts, displs, recv, counts, displs);
    free(counts);
    free(displs);
}

void comm_alltoall(const Comm *g, const real *send, real *recv, size_t block) {
    alltoall_equal(g, CT_REAL, send, recv, block);
}

void comm_alltoall_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block) {
    alltoall_equal(g, CT_INT32, send, recv, block);
}

void comm_bcast(const Comm *g, void *buf, size_t bytes, int root) {
    require_member(g, "broadcast");
    if (root < 0 || root >= g->size)
        mt_die("internal error: broadcast from rank %d on process group %s of %d (please report)", root, g->name,
               g->size);
    if (g->size == 1) return;
    if (g->rank == root) count_sent(g, (uint64_t)(g->size - 1) * bytes);
    WITH_TENSORS(backend_bcast(g, buf, bytes, root));
}

void comm_barrier(const Comm *g) {
    require_member(g, "barrier");
    if (g->size > 1) WITH_TENSORS(backend_barrier(g));
}

// ---- reduce-scatter and all-gather, blocking and not -----------------------------------------

// Blocks of counts[q] elements back to back (equal blocks of `block` when counts is NULL);
// blocking when req is NULL.
static void block_collective(const Comm *g, CommOp op, const real *send, real *recv, const size_t *counts,
                             size_t block, CommRequest *req) {
    require_member(g, op == OP_ALLGATHER ? "all-gather" : "reduce-scatter");
    size_t *equal = counts ? NULL : equal_counts(g, block);
    if (equal) counts = equal;
    if (req) *req = (CommRequest){0};
    if (g->size == 1) {
        device_copy(recv, send, counts[0] * sizeof(real));
    } else if (req) {
        req->pending = start_counted(g, op, CT_REAL, send, recv, counts);
    } else {
        size_t *displs = prefix_displs(g, counts);
        if (op == OP_ALLGATHER) move_allgatherv(g, CT_REAL, send, recv, counts, displs);
        else reduce_scatter_blocks(g, CT_REAL, send, recv, counts, displs);
        free(displs);
    }
    free(equal);
}

void comm_reduce_scatter(const Comm *g, const real *send, real *recv, size_t block) {
    block_collective(g, OP_REDUCE_SCATTER, send, recv, NULL, block, NULL);
}
void comm_reduce_scatter_v(const Comm *g, const real *send, real *recv, const size_t *counts) {
    block_collective(g, OP_REDUCE_SCATTER, send, recv, counts, 0, NULL);
}
void comm_allgather(const Comm *g, const real *send, real *recv, size_t block) {
    block_collective(g, OP_ALLGATHER, send, recv, NULL, block, NULL);
}
static void allgather_typed(const Comm *g, CommType t, const void *send, void *recv, size_t block) {
    require_member(g, "all-gather");
    if (g->size == 1) {
        device_copy(recv, send, block * comm_type_size(t));
        return;
    }
    size_t *counts = equal_counts(g, block), *displs = prefix_displs(g, counts);
    move_allgatherv(g, t, send, recv, counts, displs);
    free(counts);
    free(displs);
}
void comm_allgather_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block) {
    allgather_typed(g, CT_INT32, send, recv, block);
}
void comm_allgather_int64(const Comm *g, const int64_t *send, int64_t *recv, size_t block) {
    allgather_typed(g, CT_INT64, send, recv, block);
}
// An all-to-all in which only root receives: every member sends its piece to root alone.
void comm_gather_v(const Comm *g, const real *send, size_t send_count, real *recv, const size_t *counts,
                   const size_t *displs, int root) {
    require_member(g, "gather");
    if (root < 0 || root >= g->size)
        mt_die("internal error: gather to rank %d on process group %s of %d (please report)", root, g->name,
               g->size);
    int is_root = g->rank == root;
    size_t *send_counts = equal_counts(g, 0), *zeros = equal_counts(g, 0);
    send_counts[root] = send_count;
    alltoallv_typed(g, CT_REAL, send, send_counts, zeros, recv, is_root ? counts : zeros, is_root ? displs : zeros);
    free(send_counts);
    free(zeros);
}
void comm_allgather_v(const Comm *g, const real *send, real *recv, const size_t *counts) {
    block_collective(g, OP_ALLGATHER, send, recv, counts, 0, NULL);
}
void comm_ireduce_scatter(const Comm *g, const real *send, real *recv, size_t block, CommRequest *req) {
    block_collective(g, OP_REDUCE_SCATTER, send, recv, NULL, block, req);
}
void comm_ireduce_scatter_v(const Comm *g, const real *send, real *recv, const size_t *counts, CommRequest *req) {
    block_collective(g, OP_REDUCE_SCATTER, send, recv, counts, 0, req);
}
void comm_iallgather(const Comm *g, const real *send, real *recv, size_t block, CommRequest *req) {
    block_collective(g, OP_ALLGATHER, send, recv, NULL, block, req);
}
void comm_iallgather_v(const Comm *g, const real *send, real *recv, const size_t *counts, CommRequest *req) {
    block_collective(g, OP_ALLGATHER, send, recv, counts, 0, req);
}

void comm_iallreduce_sum(const Comm *g, real *x, size_t n, CommRequest *req) {
    require_member(g, "all-reduce");
    *req = (CommRequest){0};
    if (g->size == 1) return;
    size_t *counts = equal_counts(g, 0), *displs = equal_counts(g, 0);
    split_even(n, g->size, counts, displs);
    req->pending = start_counted(g, OP_ALLREDUCE, CT_REAL, NULL, x, counts);
    free(counts);
    free(displs);
}

// ---- point to point and ring shifts ----------------------------------------------------------
// They move with MPI in every build. Where tensor memory is not host memory (a GPU; cpu-strict
// takes the GPU's path) they go through host buffers: a send's bytes are downloaded when it
// starts (after the ops queued before it: the download waits for them), a receive's bytes are
// uploaded when it completes (comm_test / comm_wait), so MPI never reads device memory that a
// kernel is still writing and needs no CUDA support.
static int through_host(void) { return device_active() != DEVICE_CPU; }

// Host copies of a staged transfer (one block): the outgoing bytes, then room for the incoming.
static void stage(CommRequest *req, const void *send, size_t send_bytes, void *recv, size_t recv_bytes) {
    req->staging = mt_malloc(send_bytes + recv_bytes + 1);
    if (send) device_download(req->staging, send, send_bytes);
    req->staged_send_bytes = send_bytes;
    req->staged_recv = recv;
    req->staged_recv_bytes = recv_bytes;
}

static void *staged_incoming(const CommRequest *req, size_t send_bytes) { return (char *)req->staging + send_bytes; }

// A completed transfer's received bytes into tensor memory, its host copies freed.
static void unstage(CommRequest *req) {
    if (!req->staging) return;
    size_t sent_bytes = req->staged_send_bytes;
    if (req->staged_recv) device_upload(req->staged_recv, staged_incoming(req, sent_bytes), req->staged_recv_bytes);
    free(req->staging);
    *req = (CommRequest){0};
}

void comm_isendrecv(const Comm *g, const real *send, real *recv, size_t n, CommRequest *req) {
    require_member(g, "ring shift");
    *req = (CommRequest){0};
    if (g->size == 1) {
        device_copy(recv, send, n * sizeof(real));
        return;
    }
    size_t *counts = equal_counts(g, n), bytes = n * sizeof(real);
    if (through_host()) {
        stage(req, send, bytes, recv, bytes);
        req->pending = start_counted(g, OP_SENDRECV, CT_REAL, req->staging, staged_incoming(req, bytes), counts);
    } else {
        req->pending = start_counted(g, OP_SENDRECV, CT_REAL, send, recv, counts);
    }
    free(counts);
}

static void ialltoallv_typed(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                             const size_t *send_displs, void *recv, const size_t *recv_counts,
                             const size_t *recv_displs, CommRequest *req) {
    *req = (CommRequest){0};
    if (g->size == 1) {
        alltoallv_typed(g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return;
    }
    require_member(g, "all-to-all");
    count_sent(g, (uint64_t)to_others(g, send_counts) * comm_type_size(t));
    WITH_TENSORS(req->pending =
                     backend_ialltoallv(g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs));
}

void comm_ialltoall_v(const Comm *g, const real *send, const size_t *send_counts, const size_t *send_displs,
                      real *recv, const size_t *recv_counts, const size_t *recv_displs, CommRequest *req) {
    ialltoallv_typed(g, CT_REAL, send, send_counts, send_displs, recv, recv_counts, recv_displs, req);
}

void comm_ialltoall_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block, CommRequest *req) {
    require_member(g, "all-to-all");
    size_t *counts = equal_counts(g, block), *displs = prefix_displs(g, counts);
    ialltoallv_typed(g, CT_INT32, send, counts, displs, recv, counts, displs, req);
    free(counts);
    free(displs);
}

static void start_point(const Comm *g, int send, real *buf, size_t n, int peer, int tag, CommRequest *req) {
    require_member(g, send ? "send" : "receive");
    if (peer < 0 || peer >= g->size || peer == g->rank || tag < 0 || tag >= COMM_MAX_TAG)
        mt_die("internal error: process group %s: a %s of rank %d with peer %d, tag %d (please report)", g->name,
               send ? "send" : "receive", g->rank, peer, tag);
    *req = (CommRequest){0};
    size_t bytes = n * sizeof(real);
    if (send) count_sent(g, (uint64_t)bytes);
    void *moved = buf;
    if (through_host()) {
        if (send) stage(req, buf, bytes, NULL, 0);
        else stage(req, NULL, 0, buf, bytes);
        moved = req->staging;
    }
    WITH_TENSORS(req->pending = backend_ipoint(g, send, CT_REAL, moved, n, peer, tag));
}

void comm_isend(const Comm *g, const real *buf, size_t n, int peer, int tag, CommRequest *req) {
    start_point(g, 1, (real *)buf, n, peer, tag, req);
}

void comm_irecv(const Comm *g, real *buf, size_t n, int peer, int tag, CommRequest *req) {
    start_point(g, 0, buf, n, peer, tag, req);
}

void comm_sendrecv(const Comm *g, const real *send, real *recv, size_t n) {
    CommRequest req;
    comm_isendrecv(g, send, recv, n, &req);
    comm_wait(&req);
}

void comm_progress(void) { WITH_TENSORS(backend_progress()); }

int comm_test(CommRequest *req) {
    int done = 0;
    if (req->pending) WITH_TENSORS(done = backend_test(req->pending));
    if (done) req->pending = NULL;
    if (req->pending) return 0;
    unstage(req);
    return 1;
}

void comm_wait(CommRequest *req) {
    if (req->pending) WITH_TENSORS(backend_wait(req->pending));
    req->pending = NULL;
    unstage(req);
}
