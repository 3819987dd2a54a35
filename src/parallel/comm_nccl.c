// comm_nccl.c — the NCCL data path behind comm_mpi.c, part of the cuda plugin
// (libmoetron_cuda.so) when the build has MPI, CUDA and NCCL. As the plugin loads, it hands
// its table (CommNcclPath, comm_impl.h) to comm_register_nccl in the executable; after
// comm_use_nccl, comm_mpi.c sends every collective that moves data here.
//
//   - Communicators. A group gets its ncclComm_t on its first collective here: group rank
//     0 makes the unique id, MPI_Bcast over the group's MPI communicator hands it to the
//     other members, and ncclCommInitRank joins them (NCCL rank = group rank).
//   - Ordering. Every collective is queued on one communication stream of this process,
//     after an event recorded on the compute stream, so it reads what the compute queued
//     before the call has written. One stream for every group runs the collectives in the
//     order this process calls them, the order the members agree on (comm.h): NCCL's rule
//     (the same order on every member) holds, and the collectives of two groups can never
//     wait on each other in a cycle.
//   - Operations. All-to-all-v and all-gather-v are ncclSend / ncclRecv pairs inside one
//     ncclGroupStart / ncclGroupEnd (the block to oneself is a device copy, empty blocks
//     are skipped on both sides); the int64 sum is ncclAllReduce (exact in any order), the
//     broadcast ncclBroadcast. Sums of floats stay ordered (comm.h): a non-blocking
//     reduce-scatter queues the exchange of the blocks into a device scratch, then the
//     kernel that adds them in rank order (comm_sum.cu, the bits of comm_sum_in_order),
//     and an all-reduce its all-gather after that; everything is queued at the start, so
//     comm_test is one cudaEventQuery. The blocking reduce-scatter and all-reduce are the
//     same start and a wait (comm.c asks backend_sums_on_device): tensor memory is device
//     memory, and no sum of it runs on the host.
//   - Memory. Device buffers (tensor memory) are used in place. Buffers the GPU cannot address
//     (plain host memory, as in tests/mpi/test_comm_mpi.c) go through device copies: the
//     inputs are copied in when the collective is queued, the outputs copied back block by
//     block when it is done. Scratch comes from a memory pool of this process, allocated
//     and freed in the stream's order and kept between calls.
//   - Waiting and failures. Blocking calls wait before returning. Waits poll
//     cudaEventQuery between watchdog_enter and watchdog_leave, so a peer that is gone
//     still ends the job after --distributed-timeout-minutes (the watchdog's MPI_Abort;
//     the driver stops a dead process's kernels), and check ncclCommGetAsyncError of every
//     communicator (a collective also waits for the ones queued before it): an error
//     aborts that communicator (ncclCommAbort) and ends every rank through mt_die. Queuing
//     is bracketed too: NCCL connects two ranks on their first exchange, which waits for
//     the peer.
#include "parallel/comm.h"
#if defined(MT_COMM_NCCL) && defined(MT_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "ops/cuda/cuda_ops.h"
#include "parallel/comm_impl.h"
#include "parallel/watchdog.h"

struct NcclComm {
    ncclComm_t comm;  // NULL once aborted
    char *name;       // the group's, for messages
    NcclComm *next;   // every live communicator, for the error checks
};

static struct {
    int device;
    cudaStream_t stream;        // every collective, in the order of the calls
    cudaEvent_t compute_ready;  // recorded on the compute stream when a collective starts
    cudaMemPool_t pool;         // scratch: received blocks, device copies of host buffers
    NcclComm *live;
} nccl;

// ---- errors ----------------------------------------------------------------------------

static void cuda_ok(cudaError_t e, const char *call, const char *group) {
    if (e != cudaSuccess)
        mt_die("CUDA error in %s (collectives of process group %s): %s", call, group, cudaGetErrorString(e));
}

// A query that answered "not yet" (or did not know a host address) must not leave that
// answer behind as the last error, where the compute's launch checks would find it.
static void forget_error(cudaError_t e) {
    if (cudaPeekAtLastError() == e) cudaGetLastError();
}

// NCCL failed: abort the communicator (its kernels stop, its peers see the error) and
// end every rank with the message.
static void nccl_fail(NcclComm *nc, ncclResult_t r, const char *call, const char *group) {
    char detail[256];
    const char *last = ncclGetLastError(nc ? nc->comm : NULL);
    snprintf(detail, sizeof(detail), "%s", last && *last ? last : "no details");
    if (nc && nc->comm) {
        ncclCommAbort(nc->comm);
        nc->comm = NULL;
    }
    mt_die("NCCL error in %s on process group %s: %s (%s)", call, group, ncclGetErrorString(r), detail);
}

static void nccl_ok(NcclComm *nc, ncclResult_t r, const char *call, const char *group) {
    if (r != ncclSuccess) nccl_fail(nc, r, call, group);
}

// The errors NCCL found while collectives ran (a peer gone, a network failure), on every
// communicator: with one stream, a collective also waits for those queued before it.
static void check_async_errors(void) {
    for (NcclComm *c = nccl.live; c; c = c->next) {
        ncclResult_t async = ncclSuccess;
        if (!c->comm) continue;
        nccl_ok(c, ncclCommGetAsyncError(c->comm, &async), "ncclCommGetAsyncError", c->name);
        if (async != ncclSuccess && async != ncclInProgress) nccl_fail(c, async, "a queued collective", c->name);
    }
}

// ---- start, communicators, end ------------------------------------------------------------

// The GPU (as the cuda backend chose it), the communication stream, its event, the pool.
static void path_start(int local_rank) {
    cuda_init(local_rank);  // nothing when the cuda backend has started already
    cuda_ok(cudaGetDevice(&nccl.device), "cudaGetDevice", "world");
    int least, greatest;
    // communication first when both streams have kernels waiting: the transfers overlap
    cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", "world");
    cuda_ok(cudaStreamCreateWithPriority(&nccl.stream, cudaStreamNonBlocking, greatest),
            "cudaStreamCreateWithPriority", "world");
    cuda_ok(cudaEventCreateWithFlags(&nccl.compute_ready, cudaEventDisableTiming), "cudaEventCreate", "world");
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = nccl.device;
    cuda_ok(cudaMemPoolCreate(&nccl.pool, &props), "cudaMemPoolCreate", "world");
    uint64_t keep = UINT64_MAX;  // freed scratch stays in the pool for the next collective
    cuda_ok(cudaMemPoolSetAttribute(nccl.pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute",
            "world");
}

static NcclComm *path_comm_create(const Comm *g, MPI_Comm comm) {
    NcclComm *nc = mt_calloc(1, sizeof(*nc));
    nc->name = mt_strdup(g->name);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    watchdog_enter("making the NCCL communicator", g->name);
    if (g->rank == 0) nccl_ok(NULL, ncclGetUniqueId(&id), "ncclGetUniqueId", g->name);
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, comm);
    nccl_ok(NULL, ncclCommInitRank(&nc->comm, g->size, id, g->rank), "ncclCommInitRank", g->name);
    watchdog_leave();
    nc->next = nccl.live;
    nccl.live = nc;
    return nc;
}

static void path_comm_free(NcclComm *nc) {
    for (NcclComm **at = &nccl.live; *at; at = &(*at)->next)
        if (*at == nc) {
            *at = nc->next;
            break;
        }
    if (nc->comm) {
        watchdog_enter("releasing the NCCL communicator", nc->name);
        nccl_ok(nc, ncclCommDestroy(nc->comm), "ncclCommDestroy", nc->name);
        watchdog_leave();
    }
    free(nc->name);
    free(nc);
}

static void path_end(void) {
    while (nccl.live) path_comm_free(nccl.live);  // groups the program did not free
    // At the end nothing is left to report: the results are ignored.
    watchdog_enter("the last NCCL transfers", "world");
    (void)cudaStreamSynchronize(nccl.stream);
    watchdog_leave();
    (void)cudaMemPoolDestroy(nccl.pool);
    (void)cudaEventDestroy(nccl.compute_ready);
    (void)cudaStreamDestroy(nccl.stream);
}

// ---- a collective in flight -----------------------------------------------------------------

enum { MAX_SCRATCH = 4 };  // a reduce-scatter: its input, its output, the received blocks

typedef struct {
    void *host;
    const void *dev;
    size_t bytes;
} CopyBack;

struct NcclPending {
    const char *what, *group;  // for the watchdog and the messages
    cudaEvent_t done;          // recorded after the last operation queued
    void *scratch[MAX_SCRATCH];
    int nscratch, nback, back_cap;
    CopyBack *back;            // device → host copies of staged outputs, once done
};

// Starts queuing a collective: after the work queued so far on the compute stream.
static NcclPending *flight_begin(const char *what, const Comm *g) {
    NcclPending *f = mt_calloc(1, sizeof(*f));
    f->what = what;
    f->group = g->name;
    watchdog_enter(what, g->name);  // queuing may wait for a peer (a first connection)
    cuda_ok(cudaEventRecord(nccl.compute_ready, comm_compute_stream()), "cudaEventRecord", g->name);
    cuda_ok(cudaStreamWaitEvent(nccl.stream, nccl.compute_ready, 0), "cudaStreamWaitEvent", g->name);
    return f;
}

static void flight_queued(NcclPending *f) {
    cuda_ok(cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming), "cudaEventCreate", f->group);
    cuda_ok(cudaEventRecord(f->done, nccl.stream), "cudaEventRecord", f->group);
    watchdog_leave();
}

static char *flight_scratch(NcclPending *f, size_t bytes) {
    void *p = NULL;
    MT_ASSERT(f->nscratch < MAX_SCRATCH);
    cuda_ok(cudaMallocFromPoolAsync(&p, bytes, nccl.pool, nccl.stream), "cudaMallocFromPoolAsync", f->group);
    f->scratch[f->nscratch++] = p;
    return p;
}

static void flight_copy_back(NcclPending *f, void *host, const void *dev, size_t bytes) {
    if (f->nback == f->back_cap) {
        f->back_cap = f->back_cap ? 2 * f->back_cap : 8;
        f->back = mt_realloc(f->back, (size_t)f->back_cap * sizeof(CopyBack));
    }
    f->back[f->nback++] = (CopyBack){host, dev, bytes};
}

static int flight_done(NcclPending *f) {
    cudaError_t e = cudaEventQuery(f->done);
    if (e == cudaErrorNotReady) {
        forget_error(e);
        return 0;
    }
    cuda_ok(e, "cudaEventQuery", f->group);
    return 1;
}

// Done: the staged outputs go to the caller's buffers, the scratch back to the pool (in
// the stream's order, after whatever was queued since), and f is freed.
static void flight_finish(NcclPending *f) {
    for (int i = 0; i < f->nback; i++)
        cuda_ok(cudaMemcpy(f->back[i].host, f->back[i].dev, f->back[i].bytes, cudaMemcpyDeviceToHost), "cudaMemcpy",
                f->group);
    for (int i = 0; i < f->nscratch; i++) cuda_ok(cudaFreeAsync(f->scratch[i], nccl.stream), "cudaFreeAsync", f->group);
    cuda_ok(cudaEventDestroy(f->done), "cudaEventDestroy", f->group);
    free(f->back);
    free(f);
}

static int path_test(NcclPending *p) {
    if (!flight_done(p)) {
        check_async_errors();
        return 0;
    }
    flight_finish(p);
    return 1;
}

static void path_wait(NcclPending *p) {
    watchdog_enter(p->what, p->group);
    for (unsigned polls = 1; !flight_done(p); polls++) {
        if (polls % 256 == 0) check_async_errors();
        sched_yield();
    }
    watchdog_leave();
    flight_finish(p);
}

// ---- where the GPU finds a caller's blocks ---------------------------------------------------

// Blocks of a caller's buffer (counts[q] elements at displs[q]) as the GPU addresses them:
// the buffer itself when the GPU can, otherwise a device copy of the elements [lo, hi)
// that the blocks span, filled from the buffer when queued (`in`) and copied back block
// by block when done (`out`: what lies between the blocks is never written).
typedef struct {
    char *dev;  // where element lo is
    size_t lo, es;
} View;

static char *view_at(const View *v, size_t displ) { return v->dev + (displ - v->lo) * v->es; }

static int device_addressable(const void *p) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        forget_error(e);  // an address CUDA does not know: host memory
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static View view(NcclPending *f, const void *buf, size_t es, const size_t *counts, const size_t *displs, int n,
                 int in, int out) {
    View v = {(char *)buf, 0, es};
    size_t lo = SIZE_MAX, hi = 0;
    for (int q = 0; q < n; q++) {
        if (!counts[q]) continue;
        lo = MT_MIN(lo, displs[q]);
        hi = MT_MAX(hi, displs[q] + counts[q]);
    }
    if (hi == 0 || device_addressable(buf)) return v;
    v.dev = flight_scratch(f, (hi - lo) * es);
    v.lo = lo;
    if (in)
        cuda_ok(cudaMemcpyAsync(v.dev, (const char *)buf + lo * es, (hi - lo) * es, cudaMemcpyHostToDevice,
                                nccl.stream), "cudaMemcpyAsync", f->group);
    for (int q = 0; out && q < n; q++)
        if (counts[q]) flight_copy_back(f, (char *)buf + displs[q] * es, view_at(&v, displs[q]), counts[q] * es);
    return v;
}

// ---- queued operations ------------------------------------------------------------------------

static ncclDataType_t nccl_type(CommType t) {
    switch (t) {
    case CT_FLOAT: return ncclFloat32;
    case CT_DOUBLE: return ncclFloat64;
    case CT_INT32: return ncclInt32;
    default: return ncclInt64;
    }
}

// One exchange: send_counts[q] elements at send_at[q] go to member q, recv_counts[q]
// elements from q land at recv_at[q] (device addresses, NULL for empty blocks).
typedef struct {
    char **send_at, **recv_at;
    size_t *send_counts, *recv_counts;
} Exchange;

static Exchange exchange_new(int members) {
    Exchange x;
    x.send_at = mt_calloc(2 * (size_t)members, sizeof(char *));
    x.recv_at = x.send_at + members;
    x.send_counts = mt_calloc(2 * (size_t)members, sizeof(size_t));
    x.recv_counts = x.send_counts + members;
    return x;
}

static void exchange_free(Exchange *x) {
    free(x->send_at);
    free(x->send_counts);
}

// Queues the exchange: the block to oneself is a device copy (none when it is in place);
// the others are ncclSend / ncclRecv in one group. An empty block is skipped on both
// sides: each side knows the other's count (comm.h).
static void queue_exchange(NcclComm *nc, const Comm *g, CommType t, const Exchange *x) {
    int me = g->rank;
    size_t es = comm_type_size(t);
    if (x->send_counts[me] != x->recv_counts[me])
        mt_die("internal error: a collective on process group %s sends %zu elements to this rank but receives %zu "
               "(please report)", g->name, x->send_counts[me], x->recv_counts[me]);
    if (x->send_counts[me] && x->send_at[me] != x->recv_at[me])
        cuda_ok(cudaMemcpyAsync(x->recv_at[me], x->send_at[me], x->send_counts[me] * es, cudaMemcpyDefault,
                                nccl.stream), "cudaMemcpyAsync", g->name);
    nccl_ok(nc, ncclGroupStart(), "ncclGroupStart", g->name);
    for (int q = 0; q < g->size; q++) {
        if (q == me) continue;
        if (x->send_counts[q])
            nccl_ok(nc, ncclSend(x->send_at[q], x->send_counts[q], nccl_type(t), q, nc->comm, nccl.stream),
                    "ncclSend", g->name);
        if (x->recv_counts[q])
            nccl_ok(nc, ncclRecv(x->recv_at[q], x->recv_counts[q], nccl_type(t), q, nc->comm, nccl.stream),
                    "ncclRecv", g->name);
    }
    nccl_ok(nc, ncclGroupEnd(), "ncclGroupEnd", g->name);
}

// Every member's block (counts, displs) into the view `out`; this rank's block is copied
// first from `own` (any memory; NULL or the block itself: already in place).
static void queue_allgather(NcclComm *nc, const Comm *g, CommType t, const void *own, const View *out,
                            const size_t *counts, const size_t *displs) {
    size_t es = comm_type_size(t), mine = counts[g->rank];
    char *at_mine = mine ? view_at(out, displs[g->rank]) : NULL;
    if (mine && own && own != at_mine)
        cuda_ok(cudaMemcpyAsync(at_mine, own, mine * es, cudaMemcpyDefault, nccl.stream), "cudaMemcpyAsync", g->name);
    Exchange x = exchange_new(g->size);
    for (int q = 0; q < g->size; q++) {
        x.send_counts[q] = mine;
        x.send_at[q] = at_mine;
        x.recv_counts[q] = counts[q];
        x.recv_at[q] = counts[q] ? view_at(out, displs[q]) : NULL;
    }
    queue_exchange(nc, g, t, &x);
    exchange_free(&x);
}

// The ordered sum of block g->rank over the members into out (a device address): block q
// of the view `send` goes to member q, this rank's block of every member arrives in a
// scratch in rank order, and one kernel adds them.
static void queue_reduce_scatter(NcclPending *f, NcclComm *nc, const Comm *g, CommType t, const View *send,
                                 const size_t *counts, const size_t *displs, void *out) {
    int members = g->size;
    size_t es = comm_type_size(t), mine = counts[g->rank];
    char *in = mine ? flight_scratch(f, (size_t)members * mine * es) : NULL;
    Exchange x = exchange_new(members);
    for (int q = 0; q < members; q++) {
        x.send_counts[q] = counts[q];
        x.send_at[q] = counts[q] ? view_at(send, displs[q]) : NULL;
        x.recv_counts[q] = mine;
        x.recv_at[q] = mine ? in + (size_t)q * mine * es : NULL;
    }
    queue_exchange(nc, g, t, &x);
    exchange_free(&x);
    comm_sum_blocks_device(t, out, in, members, mine, nccl.stream);
}

// ---- the backend's collectives -------------------------------------------------------------

static void alltoallv(NcclComm *nc, const Comm *g, CommType t, const void *send, const size_t *send_counts,
                      const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs) {
    size_t es = comm_type_size(t);
    NcclPending *f = flight_begin("an all-to-all", g);
    View s = view(f, send, es, send_counts, send_displs, g->size, 1, 0);
    View r = view(f, recv, es, recv_counts, recv_displs, g->size, 0, 1);
    Exchange x = exchange_new(g->size);
    for (int q = 0; q < g->size; q++) {
        x.send_counts[q] = send_counts[q];
        x.send_at[q] = send_counts[q] ? view_at(&s, send_displs[q]) : NULL;
        x.recv_counts[q] = recv_counts[q];
        x.recv_at[q] = recv_counts[q] ? view_at(&r, recv_displs[q]) : NULL;
    }
    queue_exchange(nc, g, t, &x);
    exchange_free(&x);
    flight_queued(f);
    path_wait(f);
}

static void allgatherv(NcclComm *nc, const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                       const size_t *displs) {
    NcclPending *f = flight_begin("an all-gather", g);
    View out = view(f, recv, comm_type_size(t), counts, displs, g->size, 0, 1);
    queue_allgather(nc, g, t, send, &out, counts, displs);
    flight_queued(f);
    path_wait(f);
}

static void allreduce_exact(NcclComm *nc, const Comm *g, CommType t, CommReduceOp op, void *x, size_t n) {
    size_t zero = 0;
    if (n == 0) return;
    NcclPending *f = flight_begin("an all-reduce", g);
    View v = view(f, x, comm_type_size(t), &n, &zero, 1, 1, 1);
    nccl_ok(nc, ncclAllReduce(v.dev, v.dev, n, nccl_type(t), op == REDUCE_MAX ? ncclMax : ncclSum, nc->comm, nccl.stream),
            "ncclAllReduce", g->name);
    flight_queued(f);
    path_wait(f);
}

static void bcast(NcclComm *nc, const Comm *g, void *buf, size_t bytes, int root) {
    size_t zero = 0;
    if (bytes == 0) return;
    NcclPending *f = flight_begin("a broadcast", g);
    int from_here = g->rank == root;
    View v = view(f, buf, 1, &bytes, &zero, 1, from_here, !from_here);
    nccl_ok(nc, ncclBroadcast(v.dev, v.dev, bytes, ncclUint8, root, nc->comm, nccl.stream), "ncclBroadcast",
            g->name);
    flight_queued(f);
    path_wait(f);
}

static NcclPending *istart(NcclComm *nc, const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                           const size_t *counts) {
    static const char *const what[] = {[OP_REDUCE_SCATTER] = "a non-blocking reduce-scatter",
                                       [OP_ALLGATHER] = "a non-blocking all-gather",
                                       [OP_ALLREDUCE] = "a non-blocking all-reduce"};
    int members = g->size;
    size_t es = comm_type_size(t), mine = counts[g->rank], zero = 0;
    size_t *displs = mt_malloc((size_t)members * sizeof(size_t)), at = 0;
    for (int q = 0; q < members; q++) displs[q] = at, at += counts[q];
    NcclPending *f = flight_begin(what[op], g);
    if (op == OP_ALLGATHER) {
        View out = view(f, recv, es, counts, displs, members, 0, 1);
        queue_allgather(nc, g, t, send, &out, counts, displs);
    } else if (op == OP_REDUCE_SCATTER) {
        View in = view(f, send, es, counts, displs, members, 1, 0);
        View out = view(f, recv, es, &mine, &zero, 1, 0, 1);
        queue_reduce_scatter(f, nc, g, t, &in, counts, displs, mine ? view_at(&out, 0) : NULL);
    } else {  // the sum of this rank's block in place, then every block to every member
        View x = view(f, recv, es, counts, displs, members, 1, 1);
        queue_reduce_scatter(f, nc, g, t, &x, counts, displs, mine ? view_at(&x, displs[g->rank]) : NULL);
        queue_allgather(nc, g, t, NULL, &x, counts, displs);
    }
    free(displs);
    flight_queued(f);
    return f;
}

// ---- the table, registered as the plugin loads --------------------------------------------------

static const CommNcclPath path = {
    .start = path_start,
    .end = path_end,
    .comm_create = path_comm_create,
    .comm_free = path_comm_free,
    .alltoallv = alltoallv,
    .allgatherv = allgatherv,
    .allreduce_exact = allreduce_exact,
    .bcast = bcast,
    .istart = istart,
    .test = path_test,
    .wait = path_wait,
};

// Weak: a program without comm_mpi.c's MPI build (no comm_register_nccl) is left alone.
extern void comm_register_nccl(const CommNcclPath *p) __attribute__((weak));

__attribute__((constructor)) static void register_path(void) {
    if (comm_register_nccl) comm_register_nccl(&path);
}
#endif
