#include "train/ckpt_shards.h"

#include <string.h>

enum { PIECE_FIRST, PIECE_COUNT, PIECE_FIELDS };  // a piece: first element of the tensor, element count

static int64_t *piece_at(const CkptShards *s, int rank, int tensor, int buffer) {
    size_t at = ((size_t)rank * (size_t)s->global.tt.count + (size_t)tensor) * CKPT_BUFFERS + (size_t)buffer;
    return s->pieces + at * PIECE_FIELDS;
}

// The part of buffer `buffer` of local tensor d that this rank sends (see ckpt_shards.h):
// elements [*first, *first + *count) of the tensor, at the returned address; NULL and a
// count of 0 when it sends none.
static const real *my_piece(const CkptShards *s, const TensorDesc *d, int buffer, int64_t *first, int64_t *count) {
    int r = d->offset >= s->local->tt.dense_total ? REGION_EXPERT : REGION_DENSE;
    const GradRegion *region = &s->sync->region[r];
    int sharded = buffer != CKPT_PARAMS && region->sharded;  // parameters are whole on every rank
    *first = *count = 0;
    if (!sharded && region->comm->rank != 0) return NULL;
    if (buffer == CKPT_PARAMS) {
        *count = (int64_t)d->numel;
        return s->local->tt.params + d->offset;
    }
    const FlatRange *held = &s->opt->ranges[r];  // the region's shard, or the whole region
    int64_t begin = (int64_t)d->offset, end = begin + (int64_t)d->numel;
    int64_t from = MT_MAX(begin, held->begin), to = MT_MIN(end, held->end);
    if (to <= from) return NULL;
    *first = from - begin, *count = to - from;
    const real *moments = buffer == CKPT_EXP_AVG ? s->opt->exp_avg : s->opt->exp_avg_sq;
    return moments + optimizer_moment_base(s->opt, r) + (from - held->begin);
}

// This rank's pieces of every tensor and buffer, in the layout of one rank's block of pieces.
static int64_t *describe_my_pieces(const CkptShards *s, size_t block) {
    int64_t *mine = mt_calloc(block, sizeof(int64_t));
    for (int g = 0; g < s->global.tt.count; g++) {
        if (s->local_of[g] < 0) continue;
        const TensorDesc *d = &s->local->tt.descs[s->local_of[g]];
        for (int b = 0; b < CKPT_BUFFERS; b++) {
            int64_t *p = mine + ((size_t)g * CKPT_BUFFERS + (size_t)b) * PIECE_FIELDS;
            my_piece(s, d, b, &p[PIECE_FIRST], &p[PIECE_COUNT]);
        }
    }
    return mine;
}

// The pieces of each tensor and buffer must cover it exactly (a bug otherwise): they may
// not overlap, so their counts add up to its elements.
static void check_pieces_cover(const CkptShards *s) {
    for (int g = 0; g < s->global.tt.count; g++)
        for (int b = 0; b < CKPT_BUFFERS; b++) {
            int64_t sum = 0;
            for (int q = 0; q < s->world.size; q++) sum += piece_at(s, q, g, b)[PIECE_COUNT];
            if (sum != (int64_t)s->global.tt.descs[g].numel)
                mt_die("internal error: the ranks hold %lld of the %zu elements of buffer %d of %s for the "
                       "checkpoint (please report)", (long long)sum, s->global.tt.descs[g].numel, b,
                       s->global.tt.descs[g].name);
        }
}

void ckpt_shards_open(CkptShards *s, const Model *local, const Optimizer *opt, const GradSync *sync) {
    memset(s, 0, sizeof(*s));
    s->local = local, s->opt = opt, s->sync = sync;
    s->world = comm_world();
    model_describe(&s->global, &local->cfg, NULL);
    int n = s->global.tt.count;
    s->local_of = mt_malloc((size_t)n * sizeof(int));
    for (int g = 0; g < n; g++) s->local_of[g] = -1;
    for (int i = 0; i < local->tt.count; i++) s->local_of[local->tt.descs[i].global_index] = i;
    size_t block = (size_t)n * CKPT_BUFFERS * PIECE_FIELDS;
    int64_t *mine = describe_my_pieces(s, block);
    s->pieces = mt_malloc((size_t)s->world.size * block * sizeof(int64_t));
    comm_allgather_int64(&s->world, mine, s->pieces, block);
    free(mine);
    s->counts = mt_calloc((size_t)s->world.size, sizeof(size_t));
    s->displs = mt_calloc((size_t)s->world.size, sizeof(size_t));
    if (s->world.rank != 0) return;
    check_pieces_cover(s);
    size_t largest = 1;
    for (int g = 0; g < n; g++) largest = MT_MAX(largest, s->global.tt.descs[g].numel);
    s->staging = mt_malloc(largest * sizeof(real));  // touched only as far as a gathered tensor fills it
}

// Tensor g's buffer on rank 0: in place when rank 0 holds all of it, else gathered from its
// pieces into the staging buffer.
static const real *gathered_values(void *ctx, int g, int buffer) {
    CkptShards *s = ctx;
    int me = s->world.rank, li = s->local_of[g];
    int64_t first = 0, count = 0;
    const real *mine = li >= 0 ? my_piece(s, &s->local->tt.descs[li], buffer, &first, &count) : NULL;
    if (piece_at(s, 0, g, buffer)[PIECE_COUNT] == (int64_t)s->global.tt.descs[g].numel)
        return me == 0 ? mine : NULL;
    for (int q = 0; q < s->world.size; q++) {
        const int64_t *p = piece_at(s, q, g, buffer);
        s->counts[q] = (size_t)p[PIECE_COUNT], s->displs[q] = (size_t)p[PIECE_FIRST];
    }
    comm_gather_v(&s->world, mine, (size_t)count, s->staging, s->counts, s->displs, 0);
    return me == 0 ? s->staging : NULL;
}

CkptSource ckpt_shards_source(CkptShards *s) {
    return (CkptSource){.values = gathered_values, .ctx = s, .writer = s->world.rank == 0,
                        .optimizer_step = s->opt->step};
}

void ckpt_shards_close(CkptShards *s) {
    model_free(&s->global);
    free(s->local_of);
    free(s->pieces);
    free(s->staging);
    free(s->counts);
    free(s->displs);
    memset(s, 0, sizeof(*s));
}
