#include "core/device.h"
#include "train/grad_sync.h"

#include <math.h>
#include <string.h>

#include "core/timer.h"
#include "ops/ops.h"

// This rank's shard of a region's range: its part of the comm's ranks' equal cuts when the
// distributed optimizer shards it, else all of it.
static FlatRange region_shard(const Comm *comm, FlatRange range, int distributed) {
    int64_t total = range.end - range.begin, n = comm->size;
    if (!distributed || n <= 1) return range;
    return (FlatRange){range.begin + total * comm->rank / n, range.begin + total * (comm->rank + 1) / n};
}

// The dense and expert regions of tt.
static FlatRange region_range(const TensorTable *tt, int region) {
    return region == REGION_DENSE ? (FlatRange){0, (int64_t)tt->dense_total}
                                  : (FlatRange){(int64_t)tt->dense_total, (int64_t)tt->total};
}

static void region_init(GradRegion *r, const Comm *comm, FlatRange range, int distributed) {
    r->comm = comm;
    r->range = range;
    r->sharded = distributed && comm->size > 1;
    int64_t total = range.end - range.begin, n = comm->size;
    r->counts = mt_malloc((size_t)n * sizeof(size_t));
    for (int64_t q = 0; q < n; q++) r->counts[q] = (size_t)(total * (q + 1) / n - total * q / n);
    r->shard = region_shard(comm, range, distributed);
    r->buffer = r->sharded ? device_calloc((size_t)MT_MAX(r->shard.end - r->shard.begin, 1), sizeof(real)) : NULL;
}

void grad_sync_init(GradSync *g, const GradGroups *groups, const TensorTable *tt, int distributed, int parts) {
    const Comm *dp = groups->dp, *edp = groups->edp;
    memset(g, 0, sizeof(*g));
    region_init(&g->region[REGION_DENSE], dp, region_range(tt, REGION_DENSE), distributed);
    region_init(&g->region[REGION_EXPERT], edp, region_range(tt, REGION_EXPERT), distributed);
    g->ep = groups->ep;
    g->tp = groups->tp;
    g->etp = groups->etp;
    g->pp = groups->pp;
    for (int i = 0; i < tt->count; i++) g->has_copies |= !!(tt->descs[i].flags & TENSOR_COPY);
    g->distributed = g->region[REGION_DENSE].sharded || g->region[REGION_EXPERT].sharded;
    g->overlap = dp->size > 1 || edp->size > 1;
    g->max_pending = REGIONS * parts;
    g->pending = g->overlap ? mt_calloc((size_t)g->max_pending, sizeof(CommRequest)) : NULL;
}

void grad_sync_free(GradSync *g) {
    for (int r = 0; r < REGIONS; r++) {
        free(g->region[r].counts);
        device_free(g->region[r].buffer);
    }
    free(g->pending);
    memset(g, 0, sizeof(*g));
}

int grad_sync_shards(const GradSync *g, FlatRange *ranges) {
    for (int r = 0; r < REGIONS; r++) ranges[r] = g->region[r].shard;
    return REGIONS;
}

int grad_sync_plan_shards(const GradGroups *groups, const TensorTable *tt, int distributed, FlatRange *ranges,
                          double *buffer_elements) {
    const Comm *comm[REGIONS] = {groups->dp, groups->edp};
    *buffer_elements = 0;
    for (int r = 0; r < REGIONS; r++) {
        ranges[r] = region_shard(comm[r], region_range(tt, r), distributed);
        if (distributed && comm[r]->size > 1) *buffer_elements += (double)MT_MAX(ranges[r].end - ranges[r].begin, 1);
    }
    return REGIONS;
}

void grad_sync_reduce(GradSync *g, TensorTable *tt) {
    for (int i = 0; i < REGIONS; i++) {
        GradRegion *r = &g->region[i];
        real *grads = tt->grads + r->range.begin;
        if (!r->sharded) {
            comm_allreduce_sum(r->comm, grads, (size_t)(r->range.end - r->range.begin));
            continue;
        }
        comm_reduce_scatter_v(r->comm, grads, r->buffer, r->counts);
        vec_copy(tt->grads + r->shard.begin, r->buffer, (size_t)(r->shard.end - r->shard.begin));
    }
}

// Sharded: the part [begin, end) is reduce-scattered along the shards it crosses: rank q
// receives the sum of its intersection with q's shard, at that place of q's buffer.
static void start_part_reduce_scatter(GradRegion *r, TensorTable *tt, int64_t begin, int64_t end, CommRequest *req) {
    int n = r->comm->size;
    size_t *counts = mt_malloc((size_t)n * sizeof(size_t));
    int64_t shard_begin = r->range.begin;
    for (int q = 0; q < n; q++) {
        int64_t shard_end = shard_begin + (int64_t)r->counts[q];
        int64_t from = MT_MAX(begin, shard_begin), to = MT_MIN(end, shard_end);
        counts[q] = to > from ? (size_t)(to - from) : 0;
        shard_begin = shard_end;
    }
    int64_t mine = MT_MIN(MT_MAX(begin, r->shard.begin), r->shard.end);  // where my part lands
    comm_ireduce_scatter_v(r->comm, tt->grads + begin, r->buffer + (mine - r->shard.begin), counts, req);
    free(counts);
}

void grad_sync_part_ready(GradSync *g, TensorTable *tt, int region, int64_t begin, int64_t end) {
    MT_ASSERT(g->overlap && g->n_pending < g->max_pending);
    GradRegion *r = &g->region[region];
    if (g->n_pending == 0) g->first_start = now_seconds();
    if (end > begin && r->comm->size > 1) {
        CommRequest *req = &g->pending[g->n_pending++];
        if (r->sharded) start_part_reduce_scatter(r, tt, begin, end, req);
        else comm_iallreduce_sum(r->comm, tt->grads + begin, (size_t)(end - begin), req);
    }
    for (int i = 0; i < g->n_pending; i++) comm_test(&g->pending[i]);  // let the earlier sums progress
}

void grad_sync_finish(GradSync *g, TensorTable *tt) {
    g->hidden_s = g->n_pending ? now_seconds() - g->first_start : 0;
    for (int i = 0; i < g->n_pending; i++) comm_wait(&g->pending[i]);
    g->n_pending = 0;
    for (int i = 0; i < REGIONS; i++) {
        const GradRegion *r = &g->region[i];
        if (r->sharded)
            vec_copy(tt->grads + r->shard.begin, r->buffer, (size_t)(r->shard.end - r->shard.begin));
    }
}

// Whether this rank counts tensor d's elements in the norm: it holds the first copy of its
// piece (pieces of a group of `size` ranks each sit on size/parts consecutive ranks).
static int counts_piece(const GradSync *g, const TensorDesc *d) {
    const TensorShard *s = &d->shard;
    if (d->flags & TENSOR_COPY) return 0;
    if (s->group == SHARD_NONE) return 1;
    const Comm *group = s->group == SHARD_TP ? g->tp : g->etp;
    return group->rank % (group->size / s->parts) == 0;
}

// A statistic of a piece of values, into one double of tensor memory (vec_sum_squares_to,
// vec_count_zeros_to), and whether it leaves out the tensors the optimizer never steps (the
// expert bias: Megatron keeps it as a buffer, with no gradient to count).
typedef struct {
    void (*of)(double *out, const real *x, size_t n);
    int trained_only;
} PieceStat;

static int has_untrained(const TensorTable *tt) {
    for (int i = 0; i < tt->count; i++)
        if (tt->descs[i].flags & TENSOR_NOT_TRAINED) return 1;
    return 0;
}

// stat summed over [range) of values (tt->grads or tt->params) for the tensors this rank
// counts; the whole range as one piece when no tensor is split or left out (the one-process
// value, bit for bit). Else each counted piece's value into one tensor block, one download of
// them all, added on the host in tensor order.
static double counted_stat(const GradSync *g, const TensorTable *tt, const real *values, FlatRange range,
                           PieceStat stat) {
    int whole = g->tp->size == 1 && g->etp->size == 1 && !g->has_copies && !(stat.trained_only && has_untrained(tt));
    double *piece_stats = device_calloc(whole ? 1 : (size_t)MT_MAX(tt->count, 1), sizeof(double));
    int pieces = 0;
    if (whole) stat.of(piece_stats + pieces++, values + range.begin, (size_t)(range.end - range.begin));
    for (int i = 0; !whole && i < tt->count; i++) {
        const TensorDesc *d = &tt->descs[i];
        int64_t from = MT_MAX((int64_t)d->offset, range.begin), to = MT_MIN((int64_t)(d->offset + d->numel), range.end);
        int left_out = stat.trained_only && (d->flags & TENSOR_NOT_TRAINED);
        if (from < to && counts_piece(g, d) && !left_out) stat.of(piece_stats + pieces++, values + from, (size_t)(to - from));
    }
    double *host = mt_calloc(pieces ? (size_t)pieces : 1, sizeof(double)), sum = 0;
    device_download(host, piece_stats, (size_t)pieces * sizeof(double));  // the range's one wait
    for (int j = 0; j < pieces; j++) sum += host[j];
    free(host);
    device_free(piece_stats);
    return sum;
}

// stat over every counted element of the model: dense tensors are the same on every
// expert-parallel rank and experts differ, so the dense shards add over dp and tp, the
// expert shards over edp, ep and etp, and the stages over pp.
static double counted_total(const GradSync *g, const TensorTable *tt, const real *values, PieceStat stat) {
    double sum[REGIONS];
    for (int i = 0; i < REGIONS; i++) {
        const GradRegion *r = &g->region[i];
        sum[i] = counted_stat(g, tt, values, r->shard, stat);
        if (r->sharded) comm_allreduce_sum_double(r->comm, &sum[i], 1);
    }
    comm_allreduce_sum_double(g->tp, &sum[REGION_DENSE], 1);
    comm_allreduce_sum_double(g->ep, &sum[REGION_EXPERT], 1);
    comm_allreduce_sum_double(g->etp, &sum[REGION_EXPERT], 1);
    if (g->pp) comm_allreduce_sum_double(g->pp, sum, REGIONS);
    return sum[REGION_DENSE] + sum[REGION_EXPERT];
}

// The L2 norm of values over the counted elements (trained_only: as PieceStat's).
static double counted_norm(const GradSync *g, const TensorTable *tt, const real *values, int trained_only) {
    return sqrt(counted_total(g, tt, values, (PieceStat){vec_sum_squares_to, trained_only}));
}

// (The never-trained tensors' gradients are zero: counting them changes no value, and keeps
// one process's norm a single sum.)
double grad_sync_norm(const GradSync *g, const TensorTable *tt) { return counted_norm(g, tt, tt->grads, 0); }

long long grad_sync_count_zeros(const GradSync *g, const TensorTable *tt) {
    return (long long)counted_total(g, tt, tt->grads, (PieceStat){vec_count_zeros_to, 1});
}

// Every rank holds every parameter of its tensors (after grad_sync_gather_params), so each
// counts its shard of a sharded region like the gradients'; the never-trained tensors (the
// expert bias, a buffer in Megatron's params norm) are left out.
double grad_sync_params_norm(const GradSync *g, const TensorTable *tt) { return counted_norm(g, tt, tt->params, 1); }

void grad_sync_gather_params(GradSync *g, TensorTable *tt) {
    for (int i = 0; i < REGIONS; i++) {
        GradRegion *r = &g->region[i];
        if (!r->sharded) continue;
        vec_copy(r->buffer, tt->params + r->shard.begin, (size_t)(r->shard.end - r->shard.begin));
        comm_allgather_v(r->comm, r->buffer, tt->params + r->range.begin, r->counts);
    }
}
