// comm_mpi.c — the MPI backend (built with mpicc and -DMT_HAVE_MPI). comm.c calls the
// collectives here only for groups of two or more processes, and does the ordered sums.
//
// A group holds two communicators: `comm` for the blocking collectives (MPI_Alltoallv,
// MPI_Allgatherv, MPI_Bcast, ...), and `p2p`, a duplicate on which the non-blocking
// collectives run as point-to-point messages tagged by their sequence number. Tags keep
// several requests in flight apart whatever order their phases advance in on each rank
// (an all-reduce starts its second exchange only after its first has arrived, which
// differs between ranks), so comm_test may be called at any time.
//
// With CUDA (MT_COMM_NCCL) and after comm_use_nccl, the calls that move data go to the
// NCCL data path of the cuda plugin instead (comm_nccl.c registers it as the plugin
// loads), on an NCCL communicator each group makes on first use; groups, barriers and
// errors stay here.
#ifdef MT_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <string.h>

#include "parallel/comm_impl.h"
#include "parallel/watchdog.h"
#ifdef MT_COMM_NCCL
#include "core/device.h"
#endif

struct CommImpl {
    MPI_Comm comm, p2p;
    unsigned sequence;  // non-blocking collectives started on this group
#ifdef MT_COMM_NCCL
    NcclComm *nccl;     // made on the group's first collective on the NCCL path
#endif
};

static int mpi_started;
static int tag_limit = 32767;  // MPI_TAG_UB, at least 32767 by the standard
static char die_prefix[32];

static void abort_all(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

#ifdef MT_COMM_NCCL
// ---- the NCCL data path -------------------------------------------------------------------

static const CommNcclPath *nccl_ops;  // registered by the cuda plugin, when it has NCCL
static int nccl_on;                   // comm_use_nccl turned it on

void comm_register_nccl(const CommNcclPath *path) { nccl_ops = path; }

// Whether every process passes the same flag (0 or 1): max(flag) == min(flag).
static int world_agrees(int flag) {
    int mine[2] = {flag, -flag}, most[2];
    watchdog_enter("the choice of the NCCL path", "world");
    MPI_Allreduce(mine, most, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    watchdog_leave();
    return most[0] == -most[1];
}

int comm_use_nccl(int local_rank) {
    int size = 1;
    if (nccl_on) return 1;
    if (mpi_started) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) return 0;  // groups of one never reach a backend
    const char *env = getenv("MOETRON_NCCL");
    int want = nccl_ops && !(env && !strcmp(env, "0"));
    if (!world_agrees(want))
        mt_die("NCCL is on for some processes only: set MOETRON_NCCL for all or none, and give every process the "
               "same cuda plugin (libmoetron_cuda.so built with NCCL)");
    if (!want) return 0;
    nccl_ops->start(local_rank);
    nccl_on = 1;
    return 1;
}

// MOETRON_NCCL=1: this process's GPU (device_select loads the plugin, which registers the
// NCCL path) and NCCL from the start.
static void nccl_from_start(void) {
    const char *env = getenv("MOETRON_NCCL");
    int want = env && !strcmp(env, "1");
    if (!world_agrees(want)) mt_die("MOETRON_NCCL=1 is set for some processes only; set it for all or none");
    if (!want) return;
    device_select(device_parse("cuda"), 0);
    if (!comm_use_nccl(0))  // 0: the GPU is chosen already
        mt_die("MOETRON_NCCL=1, but the cuda plugin has no NCCL: rebuild with nccl.h in CUDA_HOME/include");
}

// The group's NCCL communicator when NCCL moves the data, else NULL.
static NcclComm *nccl_path(const Comm *g) {
    if (!nccl_on) return NULL;
    if (!g->impl->nccl) g->impl->nccl = nccl_ops->comm_create(g, g->impl->comm);
    return g->impl->nccl;
}
#endif

static MPI_Datatype mpi_type(CommType t) {
    switch (t) {
    case CT_FLOAT: return MPI_FLOAT;
    case CT_DOUBLE: return MPI_DOUBLE;
    case CT_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
    }
}

static int mpi_count(const Comm *g, size_t count) {
    if (count > INT_MAX)
        mt_die("process group %s: a transfer of %zu elements exceeds MPI's limit of %d", g->name, count, INT_MAX);
    return (int)count;
}

static CommImpl *wrap(MPI_Comm comm) {
    CommImpl *impl = mt_calloc(1, sizeof(*impl));
    impl->comm = comm;
    MPI_Comm_dup(comm, &impl->p2p);
    return impl;
}

int backend_world_init(int *argc, char ***argv, int *rank, CommImpl **world) {
    *rank = 0;
    *world = NULL;
    if (!comm_launched()) return 1;
    int provided, size, flag, *tag_ub;
    // MPI is called from the main thread only (MPI_Abort from mt_die aside).
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    mpi_started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    if (flag && *tag_ub > tag_limit) tag_limit = *tag_ub;
    if (size > 1) {
        snprintf(die_prefix, sizeof(die_prefix), "[rank %d] ", *rank);
        mt_set_die_handler(die_prefix, abort_all);
        MPI_Comm comm;
        MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        *world = wrap(comm);
#ifdef MT_COMM_NCCL
        nccl_from_start();
#endif
    }
    return size;
}

void backend_world_finalize(void) {
    if (!mpi_started) return;
#ifdef MT_COMM_NCCL
    if (nccl_on) nccl_ops->end();
    nccl_on = 0;
#endif
    mt_set_die_handler(NULL, NULL);
    MPI_Finalize();
    mpi_started = 0;
}

const char *backend_name(void) {
    static char name[96];
    if (!name[0]) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(version, &len);  // callable before MPI_Init
        version[MT_MIN(strcspn(version, ",\n"), sizeof(name) - 1)] = 0;
        memcpy(name, version, strlen(version) + 1);
    }
    return name;
}

// "0 2 4 6" (the first 16 ranks, then "...").
static void format_ranks(char *out, size_t cap, const int *ranks, int n) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at + 16 < cap; i++) {
        if (i == 16) {
            snprintf(out + at, cap - at, " ...");
            break;
        }
        at += snprintf(out + at, cap - at, "%s%d", i ? " " : "", ranks[i]);
    }
}

CommImpl *backend_group(const char *name, const int *ranks, int n, int member) {
    int lowest = ranks[0], size, me;
    for (int i = 1; i < n; i++) lowest = MT_MIN(lowest, ranks[i]);
    MPI_Comm comm;
    // Members of one group share its lowest rank as colour and order by their index.
    MPI_Comm_split(MPI_COMM_WORLD, member >= 0 ? lowest : MPI_UNDEFINED, member, &comm);
    if (member < 0) return NULL;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int *formed = mt_malloc((size_t)size * sizeof(int));
    MPI_Allgather(&me, 1, MPI_INT, formed, 1, MPI_INT, comm);
    if (size != n || memcmp(formed, ranks, (size_t)n * sizeof(int))) {
        char given[160], got[160];
        format_ranks(given, sizeof(given), ranks, n);
        format_ranks(got, sizeof(got), formed, size);
        mt_die("process group %s: the members disagree on its ranks (this process passed %s; the processes "
               "that named rank %d first formed %s)", name, given, lowest, got);
    }
    free(formed);
    return wrap(comm);
}

void backend_free(CommImpl *impl) {
    if (!impl) return;
#ifdef MT_COMM_NCCL
    if (impl->nccl) nccl_ops->comm_free(impl->nccl);
#endif
    MPI_Comm_free(&impl->comm);
    MPI_Comm_free(&impl->p2p);
    free(impl);
}

// ---- blocking -----------------------------------------------------------------------------

// counts (and displacements) as MPI's ints, in one array of 2 * size.
static int *mpi_counts(const Comm *g, const size_t *counts, const size_t *displs) {
    int *out = mt_malloc(2 * (size_t)g->size * sizeof(int));
    for (int q = 0; q < g->size; q++) {
        out[q] = mpi_count(g, counts[q]);
        out[g->size + q] = mpi_count(g, displs[q]);
    }
    return out;
}

void backend_alltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs) {
#ifdef MT_COMM_NCCL
    NcclComm *nc = nccl_path(g);
    if (nc) {
        nccl_ops->alltoallv(nc, g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return;
    }
#endif
    int *s = mpi_counts(g, send_counts, send_displs), *r = mpi_counts(g, recv_counts, recv_displs);
    watchdog_enter("an all-to-all", g->name);
    MPI_Alltoallv(send, s, s + g->size, mpi_type(t), recv, r, r + g->size, mpi_type(t), g->impl->comm);
    watchdog_leave();
    free(s);
    free(r);
}

void backend_allgatherv(const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                        const size_t *displs) {
#ifdef MT_COMM_NCCL
    NcclComm *nc = nccl_path(g);
    if (nc) {
        nccl_ops->allgatherv(nc, g, t, send, recv, counts, displs);
        return;
    }
#endif
    int *c = mpi_counts(g, counts, displs);
    const void *from = send == (char *)recv + displs[g->rank] * comm_type_size(t) ? MPI_IN_PLACE : send;
    watchdog_enter("an all-gather", g->name);
    MPI_Allgatherv(from, c[g->rank], mpi_type(t), recv, c, c + g->size, mpi_type(t), g->impl->comm);
    watchdog_leave();
    free(c);
}

int backend_sums_on_device(const Comm *g) {
#ifdef MT_COMM_NCCL
    return nccl_path(g) != NULL;
#else
    return 0;
#endif
}

void backend_allreduce_exact(const Comm *g, CommType t, CommReduceOp op, void *x, size_t n) {
#ifdef MT_COMM_NCCL
    NcclComm *nc = nccl_path(g);
    if (nc) {
        nccl_ops->allreduce_exact(nc, g, t, op, x, n);
        return;
    }
#endif
    size_t es = comm_type_size(t);
    watchdog_enter("an all-reduce", g->name);
    for (size_t at = 0; at < n; at += INT_MAX)
        MPI_Allreduce(MPI_IN_PLACE, (char *)x + at * es, (int)MT_MIN((size_t)INT_MAX, n - at), mpi_type(t),
                      op == REDUCE_MAX ? MPI_MAX : MPI_SUM, g->impl->comm);
    watchdog_leave();
}

void backend_bcast(const Comm *g, void *buf, size_t bytes, int root) {
#ifdef MT_COMM_NCCL
    NcclComm *nc = nccl_path(g);
    if (nc) {
        nccl_ops->bcast(nc, g, buf, bytes, root);
        return;
    }
#endif
    watchdog_enter("a broadcast", g->name);
    for (size_t at = 0; at < bytes; at += INT_MAX)
        MPI_Bcast((char *)buf + at, (int)MT_MIN((size_t)INT_MAX, bytes - at), MPI_BYTE, root, g->impl->comm);
    watchdog_leave();
}

void backend_barrier(const Comm *g) {
    watchdog_enter("a barrier", g->name);
    MPI_Barrier(g->impl->comm);
    watchdog_leave();
}

// ---- non-blocking --------------------------------------------------------------------------

// The tag of the next non-blocking collective of g, the same on every member (two per
// collective: an all-reduce's two exchanges); the tags from COMM_MAX_TAG up are the
// collectives', those below the point-to-point ones' (backend_ipoint).
static int next_collective_tag(const Comm *g) {
    return COMM_MAX_TAG + (int)(2 * (g->impl->sequence++ % (unsigned)((tag_limit - COMM_MAX_TAG) / 2)));
}


struct CommPending {
    CommOp op;
    CommType type;
    MPI_Comm comm;
    const char *group;        // the group's name, for messages
    int size, rank, tag, phase;
    const char *send;
    char *recv;
    size_t *counts, *displs;  // per rank, in elements
    char *in;                 // reduce-scatter: the blocks of this rank from every other rank
    MPI_Request *requests;
    int nrequests;
#ifdef MT_COMM_NCCL
    NcclPending *nccl;        // the collective queued on NCCL instead (nothing else is set)
#endif
};

// What every non-blocking transfer of g records: it runs on g's duplicate communicator.
static void describe_pending(CommPending *p, const Comm *g, CommOp op, CommType t, int tag) {
    p->op = op;
    p->type = t;
    p->comm = g->impl->p2p;
    p->group = g->name;
    p->size = g->size;
    p->rank = g->rank;
    p->tag = tag;
}

// The transfers in flight on MPI (comm_progress tests them), in no order.
static CommPending **live;
static int n_live, live_capacity;

static CommPending *track(CommPending *p) {
    if (n_live == live_capacity) {
        live_capacity = live_capacity ? 2 * live_capacity : 16;
        live = mt_realloc(live, (size_t)live_capacity * sizeof(*live));
    }
    live[n_live++] = p;
    return p;
}

static void untrack(CommPending *p) {
    for (int i = 0; i < n_live; i++)
        if (live[i] == p) {
            live[i] = live[--n_live];
            return;
        }
}

static void post(CommPending *p, int recv_from_all, int tag) {
    size_t es = comm_type_size(p->type), mine = p->counts[p->rank];
    MPI_Datatype dt = mpi_type(p->type);
    p->nrequests = 0;
    for (int q = 0; q < p->size; q++) {
        if (q == p->rank) continue;
        MPI_Request *r = p->requests + p->nrequests;
        if (recv_from_all) {  // gather: my block out to everyone, everyone's block in
            MPI_Irecv(p->recv + p->displs[q] * es, (int)p->counts[q], dt, q, tag, p->comm, r);
            MPI_Isend(p->recv + p->displs[p->rank] * es, (int)mine, dt, q, tag, p->comm, r + 1);
        } else {  // scatter: block q of send to rank q, my block from everyone
            MPI_Irecv(p->in + (size_t)q * mine * es, (int)mine, dt, q, tag, p->comm, r);
            MPI_Isend(p->send + p->displs[q] * es, (int)p->counts[q], dt, q, tag, p->comm, r + 1);
        }
        p->nrequests += 2;
    }
}

// The ring shift: this rank's block to the next rank, the previous rank's into recv.
static void post_shift(CommPending *p) {
    int n = (int)p->counts[p->rank], next = (p->rank + 1) % p->size, prev = (p->rank - 1 + p->size) % p->size;
    MPI_Irecv(p->recv, n, mpi_type(p->type), prev, p->tag, p->comm, p->requests);
    MPI_Isend(p->send, n, mpi_type(p->type), next, p->tag, p->comm, p->requests + 1);
    p->nrequests = 2;
}

static void sum_my_block(CommPending *p) {
    size_t es = comm_type_size(p->type), mine = p->counts[p->rank];
    const void **parts = mt_malloc((size_t)p->size * sizeof(void *));
    for (int q = 0; q < p->size; q++)
        parts[q] = q == p->rank ? p->send + p->displs[q] * es : p->in + (size_t)q * mine * es;
    char *out = p->op == OP_ALLREDUCE ? p->recv + p->displs[p->rank] * es : p->recv;
    comm_sum_in_order(p->type, out, parts, p->size, mine);
    free(parts);
}

CommPending *backend_istart(const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                            const size_t *counts) {
    CommPending *p = mt_calloc(1, sizeof(*p));
#ifdef MT_COMM_NCCL
    NcclComm *nc = op == OP_SENDRECV ? NULL : nccl_path(g);  // ring shifts stay on MPI
    if (nc) {
        p->nccl = nccl_ops->istart(nc, g, op, t, send, recv, counts);
        return p;
    }
#endif
    size_t es = comm_type_size(t);
    describe_pending(p, g, op, t, next_collective_tag(g));
    p->send = op == OP_ALLREDUCE ? recv : send;
    p->recv = recv;
    p->counts = mt_malloc(2 * (size_t)g->size * sizeof(size_t));
    p->displs = p->counts + g->size;
    size_t at = 0;
    for (int q = 0; q < g->size; q++) {
        p->counts[q] = counts[q];
        p->displs[q] = at;
        at += (size_t)mpi_count(g, counts[q]);
    }
    p->requests = mt_malloc(2 * (size_t)g->size * sizeof(MPI_Request));
    if (op == OP_SENDRECV) {
        post_shift(p);
    } else if (op == OP_ALLGATHER) {
        char *own = p->recv + p->displs[p->rank] * es;
        if (own != p->send) memmove(own, p->send, p->counts[p->rank] * es);
        post(p, 1, p->tag);
    } else {
        p->in = mt_malloc((size_t)g->size * p->counts[g->rank] * es + 1);
        post(p, 0, p->tag);
    }
    return track(p);
}

CommPending *backend_ialltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs) {
#ifdef MT_COMM_NCCL
    if (nccl_path(g)) {
        backend_alltoallv(g, t, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return NULL;
    }
#endif
    size_t es = comm_type_size(t);
    CommPending *p = mt_calloc(1, sizeof(*p));
    describe_pending(p, g, OP_ALLTOALLV, t, next_collective_tag(g));
    p->requests = mt_malloc(2 * (size_t)g->size * sizeof(MPI_Request));
    memcpy((char *)recv + recv_displs[g->rank] * es, (const char *)send + send_displs[g->rank] * es,
           recv_counts[g->rank] * es);
    for (int q = 0; q < g->size; q++) {
        if (q == g->rank) continue;
        MPI_Irecv((char *)recv + recv_displs[q] * es, mpi_count(g, recv_counts[q]), mpi_type(t), q, p->tag, p->comm,
                  p->requests + p->nrequests++);
        MPI_Isend((const char *)send + send_displs[q] * es, mpi_count(g, send_counts[q]), mpi_type(t), q, p->tag,
                  p->comm, p->requests + p->nrequests++);
    }
    return track(p);
}

CommPending *backend_ipoint(const Comm *g, int send, CommType t, void *buf, size_t n, int peer, int tag) {
    MT_ASSERT(tag >= 0 && tag < COMM_MAX_TAG && peer >= 0 && peer < g->size && peer != g->rank);
    CommPending *p = mt_calloc(1, sizeof(*p));
    describe_pending(p, g, send ? OP_SEND : OP_RECV, t, tag);
    p->requests = mt_malloc(sizeof(MPI_Request));
    p->nrequests = 1;
    int count = mpi_count(g, n);
    if (send) MPI_Isend(buf, count, mpi_type(t), peer, tag, p->comm, p->requests);
    else MPI_Irecv(buf, count, mpi_type(t), peer, tag, p->comm, p->requests);
    return track(p);
}

// Testing a request lets MPI move every transfer on; completed requests become null and a
// later test or wait finishes the collective (advance).
void backend_progress(void) {
    for (int i = 0; i < n_live; i++) {
        int done;
        MPI_Testall(live[i]->nrequests, live[i]->requests, &done, MPI_STATUSES_IGNORE);
    }
}

// The current exchange has completed: sum, start the all-reduce's second exchange, or
// finish. Returns 1 when the collective is done (and frees it).
static int advance(CommPending *p) {
    if ((p->op == OP_REDUCE_SCATTER || p->op == OP_ALLREDUCE) && p->phase == 0) {
        sum_my_block(p);
        if (p->op == OP_ALLREDUCE) {
            p->phase = 1;
            post(p, 1, p->tag + 1);
            return 0;
        }
    }
    untrack(p);
    free(p->in);
    free(p->counts);
    free(p->requests);
    free(p);
    return 1;
}

int backend_test(CommPending *p) {
#ifdef MT_COMM_NCCL
    if (p->nccl) {
        if (!nccl_ops->test(p->nccl)) return 0;
        free(p);
        return 1;
    }
#endif
    for (;;) {
        int done;
        MPI_Testall(p->nrequests, p->requests, &done, MPI_STATUSES_IGNORE);
        if (!done) return 0;
        if (advance(p)) return 1;
    }
}

void backend_wait(CommPending *p) {
#ifdef MT_COMM_NCCL
    if (p->nccl) {
        nccl_ops->wait(p->nccl);
        free(p);
        return;
    }
#endif
    watchdog_enter("a non-blocking collective", p->group);
    do MPI_Waitall(p->nrequests, p->requests, MPI_STATUSES_IGNORE);
    while (!advance(p));
    watchdog_leave();
}
#endif
