#include "train/ckpt_shards.h"

#include <string.h>

#include "core/device.h"
#include "hf/hf_weights.h"

// What one rank holds of one global tensor, as every rank learns it: the shard (parts 0
// when the rank does not hold the tensor), the world rank that leads its data-parallel
// replica (its region group's rank 0), and per buffer the elements of its piece it sends
// (first, count; count 0: none).
enum { HELD_PARTS, HELD_AXIS, HELD_INDEX, HELD_REPLICA, HELD_RANGES };
enum { RANGE_FIRST, RANGE_COUNT, RANGE_FIELDS };
#define HELD_FIELDS (HELD_RANGES + CKPT_BUFFERS * RANGE_FIELDS)

static int64_t *held_at(const CkptShards *s, int rank, int tensor) {
    return s->held + ((size_t)rank * (size_t)s->global.tt.count + (size_t)tensor) * HELD_FIELDS;
}

static int64_t *range_of(int64_t *held, int buffer) { return held + HELD_RANGES + buffer * RANGE_FIELDS; }

static int region_of(const CkptShards *s, const TensorDesc *d) {
    return d->offset >= s->local->tt.dense_total ? REGION_EXPERT : REGION_DENSE;
}

// The elements of buffer `buffer` of local tensor d that this rank can send (see
// ckpt_shards.h), [*first, *first + *count) of its piece; a count of 0 when none.
static void offered_range(const CkptShards *s, const TensorDesc *d, int buffer, int64_t *first, int64_t *count) {
    int r = region_of(s, d);
    const GradRegion *region = &s->sync->region[r];
    int sharded = buffer != CKPT_PARAMS && region->sharded;  // parameters are whole on every rank
    *first = *count = 0;
    if (!sharded && region->comm->rank != 0) return;
    if (buffer == CKPT_PARAMS) {
        *count = (int64_t)d->numel;
        return;
    }
    const FlatRange *held = &s->opt->ranges[r];  // the region's shard, or the whole region
    int64_t begin = (int64_t)d->offset, end = begin + (int64_t)d->numel;
    int64_t from = MT_MAX(begin, held->begin), to = MT_MIN(end, held->end);
    if (to > from) *first = from - begin, *count = to - from;
}

// The world rank of rank 0 of each region's group: which data-parallel replica this rank is in.
static void replica_leaders(const CkptShards *s, int64_t leader[REGIONS]) {
    int64_t me = s->world.rank;
    for (int r = 0; r < REGIONS; r++) {
        const Comm *c = s->sync->region[r].comm;
        int64_t *ranks = mt_malloc((size_t)c->size * sizeof(int64_t));
        comm_allgather_int64(c, &me, ranks, 1);
        leader[r] = ranks[0];
        free(ranks);
    }
}

// This rank's rows of the table, in the layout of one rank's block.
static int64_t *describe_my_pieces(const CkptShards *s, size_t block) {
    int64_t leader[REGIONS];
    replica_leaders(s, leader);
    int64_t *mine = mt_calloc(block, sizeof(int64_t));
    for (int g = 0; g < s->global.tt.count; g++) {
        if (s->local_of[g] < 0) continue;
        const TensorDesc *d = &s->local->tt.descs[s->local_of[g]];
        int64_t *h = mine + (size_t)g * HELD_FIELDS;
        h[HELD_PARTS] = d->shard.parts, h[HELD_AXIS] = d->shard.axis, h[HELD_INDEX] = d->shard.index;
        h[HELD_REPLICA] = leader[region_of(s, d)];
        for (int b = 0; b < CKPT_BUFFERS; b++) {
            int64_t *range = range_of(h, b);
            offered_range(s, d, b, &range[RANGE_FIRST], &range[RANGE_COUNT]);
        }
    }
    return mine;
}

static void internal_error(const TensorDesc *global, int buffer, const char *what) {
    mt_die("internal error: buffer %d of %s for the checkpoint: %s (please report)", buffer, global->name, what);
}

// One sender per element: of the replicas offering a piece, the one with the lowest leader
// sends it (every rank computes the same choice from the same table), the others' offers
// are dropped. Each piece must then be covered exactly (a bug otherwise). lowest and
// covered are scratch of the world's size (a tensor has at most that many pieces).
static void choose_senders(CkptShards *s, int g, int buffer, int64_t *lowest, int64_t *covered) {
    const TensorDesc *global = &s->global.tt.descs[g];
    int parts = 0;
    for (int q = 0; q < s->world.size; q++) {
        const int64_t *h = held_at(s, q, g);
        if (!h[HELD_PARTS]) continue;
        if (parts && (h[HELD_PARTS] != parts || h[HELD_AXIS] != s->axis_of[g]))
            internal_error(global, buffer, "the ranks cut it differently");
        parts = (int)h[HELD_PARTS], s->parts_of[g] = parts, s->axis_of[g] = (int)h[HELD_AXIS];
    }
    if (!parts || (int64_t)global->numel % parts) internal_error(global, buffer, "no rank holds it");
    for (int p = 0; p < parts; p++) lowest[p] = INT64_MAX, covered[p] = 0;
    for (int q = 0; q < s->world.size; q++) {
        int64_t *h = held_at(s, q, g);
        if (h[HELD_PARTS] && range_of(h, buffer)[RANGE_COUNT])
            lowest[h[HELD_INDEX]] = MT_MIN(lowest[h[HELD_INDEX]], h[HELD_REPLICA]);
    }
    for (int q = 0; q < s->world.size; q++) {
        int64_t *h = held_at(s, q, g), *range = range_of(h, buffer);
        if (!h[HELD_PARTS] || !range[RANGE_COUNT]) continue;
        if (h[HELD_REPLICA] != lowest[h[HELD_INDEX]]) range[RANGE_COUNT] = 0;
        covered[h[HELD_INDEX]] += range[RANGE_COUNT];
    }
    for (int p = 0; p < parts; p++)
        if (covered[p] != (int64_t)global->numel / parts) internal_error(global, buffer, "its pieces do not cover it once");
}

// The largest global tensor whose pieces are not row blocks (they are gathered piece after
// piece, then re-strided); 0 when there is none.
static size_t largest_strided(const CkptShards *s) {
    size_t largest = 0;
    for (int g = 0; g < s->global.tt.count; g++) {
        const TensorDesc *d = &s->global.tt.descs[g];
        TensorPieceRuns pr = tensor_piece_runs(d->ndim, d->shape, s->axis_of[g], s->parts_of[g], 0);
        if (pr.runs > 1) largest = MT_MAX(largest, d->numel);
    }
    return largest;
}

// The global description must be the one-process layout: the files hold whole tensors.
static void check_global_is_whole(const CkptShards *s) {
    for (int g = 0; g < s->global.tt.count; g++)
        if (s->global.tt.descs[g].shard.parts != 1)
            mt_die("internal error: the checkpoint's description of %s is cut into %d pieces; it must be the "
                   "one-process layout (please report)", s->global.tt.descs[g].name, s->global.tt.descs[g].shard.parts);
}

void ckpt_shards_open(CkptShards *s, const Model *local, const Optimizer *opt, const GradSync *sync) {
    memset(s, 0, sizeof(*s));
    s->local = local, s->opt = opt, s->sync = sync;
    s->world = comm_world();
    model_describe(&s->global, &local->cfg, NULL);  // the one-process layout, whatever the run's
    check_global_is_whole(s);
    int n = s->global.tt.count;
    s->local_of = mt_malloc((size_t)n * sizeof(int));
    for (int g = 0; g < n; g++) s->local_of[g] = -1;
    for (int i = 0; i < local->tt.count; i++) s->local_of[local->tt.descs[i].global_index] = i;
    size_t block = (size_t)n * HELD_FIELDS;
    int64_t *mine = describe_my_pieces(s, block);
    s->held = mt_malloc((size_t)s->world.size * block * sizeof(int64_t));
    comm_allgather_int64(&s->world, mine, s->held, block);
    free(mine);
    s->parts_of = mt_calloc((size_t)n, sizeof(int));
    s->axis_of = mt_calloc((size_t)n, sizeof(int));
    int64_t *lowest = mt_malloc((size_t)s->world.size * sizeof(int64_t));
    int64_t *covered = mt_malloc((size_t)s->world.size * sizeof(int64_t));
    for (int g = 0; g < n; g++)
        for (int b = 0; b < CKPT_BUFFERS; b++) choose_senders(s, g, b, lowest, covered);
    free(lowest);
    free(covered);
    s->counts = mt_calloc((size_t)s->world.size, sizeof(size_t));
    s->displs = mt_calloc((size_t)s->world.size, sizeof(size_t));
    s->sent = mt_malloc(hf_largest_tensor(&local->tt) * sizeof(real));
    if (s->world.rank != 0) return;
    size_t strided = largest_strided(s);
    // touched only as far as a gathered tensor fills them
    s->staging = mt_malloc(hf_largest_tensor(&s->global.tt) * sizeof(real));
    if (strided) s->pieces = mt_malloc(strided * sizeof(real));
}

// The pieces of tensor g, one after the other in `pieces`, laid out in the global
// row-major tensor `out` (each piece's runs at their places).
static void restride(const CkptShards *s, int g, const real *pieces, real *out) {
    const TensorDesc *d = &s->global.tt.descs[g];
    for (int p = 0; p < s->parts_of[g]; p++) {
        TensorPieceRuns pr = tensor_piece_runs(d->ndim, d->shape, s->axis_of[g], s->parts_of[g], p);
        for (int64_t r = 0; r < pr.runs; r++)
            memcpy(out + pr.first + r * pr.stride, pieces + (p * pr.runs + r) * pr.chunk, (size_t)pr.chunk * sizeof(real));
    }
}

// Tensor g's buffer on rank 0: in place when rank 0 sends all of it, else gathered from its
// pieces into the staging buffer (row blocks straight to their places, other pieces piece
// after piece and then re-strided).
static const real *gathered_values(void *ctx, int g, int buffer) {
    CkptShards *s = ctx;
    const TensorDesc *global = &s->global.tt.descs[g];
    int me = s->world.rank, li = s->local_of[g];
    const int64_t *range = range_of(held_at(s, me, g), buffer);
    // this rank's part, downloaded from tensor memory: straight into place when rank 0 sends all of it
    int whole_on_0 = range_of(held_at(s, 0, g), buffer)[RANGE_COUNT] == (int64_t)global->numel;
    real *mine = whole_on_0 && me == 0 ? s->staging : s->sent;
    if (range[RANGE_COUNT])
        ckpt_read_piece(&s->local->tt, s->opt, buffer, (int64_t)s->local->tt.descs[li].offset + range[RANGE_FIRST],
                        (size_t)range[RANGE_COUNT], mine);
    if (whole_on_0) return me == 0 ? mine : NULL;
    int64_t piece_numel = (int64_t)global->numel / s->parts_of[g];
    for (int q = 0; q < s->world.size; q++) {
        int64_t *h = held_at(s, q, g), *r = range_of(h, buffer);
        s->counts[q] = (size_t)r[RANGE_COUNT];
        s->displs[q] = r[RANGE_COUNT] ? (size_t)(h[HELD_INDEX] * piece_numel + r[RANGE_FIRST]) : 0;
    }
    TensorPieceRuns pr = tensor_piece_runs(global->ndim, global->shape, s->axis_of[g], s->parts_of[g], 0);
    real *recv = pr.runs > 1 ? s->pieces : s->staging;
    comm_gather_v(&s->world, mine, (size_t)range[RANGE_COUNT], recv, s->counts, s->displs, 0);
    if (me != 0) return NULL;
    if (pr.runs > 1) restride(s, g, s->pieces, s->staging);
    return s->staging;
}

CkptSource ckpt_shards_source(CkptShards *s) {
    return (CkptSource){.values = gathered_values, .ctx = s, .writer = s->world.rank == 0,
                        .optimizer_step = s->opt->step};
}

void ckpt_shards_close(CkptShards *s) {
    model_free(&s->global);
    free(s->local_of);
    free(s->held);
    free(s->parts_of);
    free(s->axis_of);
    free(s->staging);
    free(s->pieces);
    free(s->sent);
    free(s->counts);
    free(s->displs);
    memset(s, 0, sizeof(*s));
}
