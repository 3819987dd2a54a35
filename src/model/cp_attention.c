// cp_attention.c — ring attention over a context-parallel group (cp_attention.h).
//
// The K/V block a rank holds at ring step `step` is that of rank (r − step) mod P: k then v
// of all its 2·C tokens, packed in one buffer so one shift moves both. A key chunk of the
// block is attended in place (kv_row_stride 2·C); the query-side tensors of each local
// chunk are copied into contiguous (B, C, …) buffers, as AttentionShape has no row stride
// for q, out and lse.
#include <math.h>
#include <string.h>

#include "model/cp_attention.h"
#include "core/device.h"
#include "ops/ops_parallel.h"
#include "core/timer.h"
#include "model/cp_batch.h"  // cp_chunk

enum { CHUNKS_PER_RANK = 2 };

static int v_dim(const RingAttentionShape *s) { return s->v_head_dim ? s->v_head_dim : s->head_dim; }
static size_t k_elems(const RingAttentionShape *s) {  // one block's k: (B, 2C, kv_heads, d)
    return (size_t)s->B * CHUNKS_PER_RANK * s->C * s->kv_heads * s->head_dim;
}
static size_t v_elems(const RingAttentionShape *s) {
    return (size_t)s->B * CHUNKS_PER_RANK * s->C * s->kv_heads * v_dim(s);
}

// The sequence chunks group rank r holds (Megatron-Core's load-balanced causal split).
static void rank_chunks(int r, int P, int chunk[CHUNKS_PER_RANK]) {
    for (int half = 0; half < CHUNKS_PER_RANK; half++) chunk[half] = cp_chunk(P, r, half);
}

// ---- local chunk <-> contiguous buffer ----------------------------------------------------

// `outer` runs of 2·C rows of row_bytes each; local chunk c of run o starts at this row.
static size_t local_chunk_row(int o, int C, int c) { return (size_t)o * CHUNKS_PER_RANK * C + (size_t)c * C; }

// Local chunk c of every run into chunk (outer, C rows), and back.
static void take_chunk(void *chunk, const void *local, int outer, int C, size_t row_bytes, int c) {
    size_t run = (size_t)C * row_bytes;
    rows_copy_strided(chunk, run, (const char *)local + local_chunk_row(0, C, c) * row_bytes, CHUNKS_PER_RANK * run,
                      run, outer);
}

static void put_chunk(void *local, const void *chunk, int outer, int C, size_t row_bytes, int c) {
    size_t run = (size_t)C * row_bytes;
    rows_copy_strided((char *)local + local_chunk_row(0, C, c) * row_bytes, CHUNKS_PER_RANK * run, chunk, run, run,
                      outer);
}

static real *gather_tokens(const real *x, const RingAttentionShape *s, int width, int c) {  // (B, C, width)
    real *chunk = device_calloc((size_t)s->B * s->C * width, sizeof(real));
    take_chunk(chunk, x, s->B, s->C, (size_t)width * sizeof(real), c);
    return chunk;
}

static void scatter_tokens(real *x, const real *chunk, const RingAttentionShape *s, int width, int c) {
    put_chunk(x, chunk, s->B, s->C, (size_t)width * sizeof(real), c);
}

static real *gather_lse(const real *lse, const RingAttentionShape *s, int c) {  // (B, heads, C)
    real *chunk = device_calloc((size_t)s->B * s->heads * s->C, sizeof(real));
    take_chunk(chunk, lse, s->B * s->heads, s->C, sizeof(real), c);
    return chunk;
}

// ---- one local query chunk ---------------------------------------------------------------

typedef struct {
    int chunk;           // its chunk index in the whole sequence
    int32_t *key_start;  // (B·C) or NULL
    real *q, *out, *lse, *dout, *dq;
} QueryChunk;

static void load_queries(QueryChunk qc[CHUNKS_PER_RANK], const Comm *cp, const real *q, const RingAttentionShape *s) {
    int mine[CHUNKS_PER_RANK];
    rank_chunks(cp->rank, cp->size, mine);
    for (int i = 0; i < CHUNKS_PER_RANK; i++) {
        memset(&qc[i], 0, sizeof(qc[i]));
        qc[i].chunk = mine[i];
        qc[i].q = gather_tokens(q, s, s->heads * s->head_dim, i);
        if (s->key_start) {
            qc[i].key_start = device_calloc((size_t)s->B * s->C, sizeof(int32_t));
            take_chunk(qc[i].key_start, s->key_start, s->B, s->C, sizeof(int32_t), i);
        }
    }
}

static void free_queries(QueryChunk qc[CHUNKS_PER_RANK]) {
    for (int i = 0; i < CHUNKS_PER_RANK; i++)
        device_free(qc[i].key_start), device_free(qc[i].q), device_free(qc[i].out), device_free(qc[i].lse),
            device_free(qc[i].dout), device_free(qc[i].dq);
}

// Query chunk qc against sequence chunk `key_chunk` of the block held (kv_row_stride 2·C).
static AttentionShape block_shape(const RingAttentionShape *s, const QueryChunk *qc, int key_chunk) {
    AttentionShape a = {.B = s->B, .Tq = s->C, .Tk = s->C, .q_pos0 = qc->chunk * s->C, .k_pos0 = key_chunk * s->C,
                        .heads = s->heads, .kv_heads = s->kv_heads, .head_dim = s->head_dim,
                        .v_head_dim = v_dim(s), .kv_row_stride = CHUNKS_PER_RANK * s->C, .scale = s->scale,
                        .key_start = qc->key_start, .dropout = s->dropout, .head_first = s->head_first};
    return a;
}

// The key chunk of local index ki in a block of k (or v, dk, dv) rows `width` wide.
static size_t block_chunk_offset(const RingAttentionShape *s, int ki, int width) {
    return (size_t)ki * s->C * width;
}

// ---- the ring ------------------------------------------------------------------------------

typedef void (*BlockVisit)(QueryChunk *qc, const AttentionShape *a, real *kv, real *dkdv, size_t ko, size_t vo,
                           void *scratch);

// Every block of the step at which this rank holds the K/V of rank `owner`.
// `progress` (or NULL): the transfer in flight, given a chance to move between blocks (MPI
// progresses a transfer only inside its calls).
static void visit_step(QueryChunk qc[CHUNKS_PER_RANK], const Comm *cp, int owner, real *kv, real *dkdv,
                       const RingAttentionShape *s, BlockVisit visit, void *scratch, CommRequest *progress) {
    int theirs[CHUNKS_PER_RANK];
    rank_chunks(owner, cp->size, theirs);
    int kw = s->kv_heads * s->head_dim, vw = s->kv_heads * v_dim(s);
    for (int qi = 0; qi < CHUNKS_PER_RANK; qi++)
        for (int ki = 0; ki < CHUNKS_PER_RANK; ki++) {
            if (theirs[ki] > qc[qi].chunk) continue;  // entirely in the future
            AttentionShape a = block_shape(s, &qc[qi], theirs[ki]);
            visit(&qc[qi], &a, kv, dkdv, block_chunk_offset(s, ki, kw), k_elems(s) + block_chunk_offset(s, ki, vw),
                  scratch);
            if (progress) comm_test(progress);
        }
}

static CpRingTimes ring_times;  // since the last cp_ring_take_times

CpRingTimes cp_ring_take_times(void) {
    CpRingTimes t = ring_times;
    memset(&ring_times, 0, sizeof(ring_times));
    return t;
}

typedef struct {
    real *out, *lse;  // one block's partial result (B, C, heads, dv), (B, heads, C)
} BlockResult;

static void forward_block(QueryChunk *qc, const AttentionShape *a, real *kv, real *dkdv, size_t ko, size_t vo,
                          void *scratch) {
    BlockResult *b = scratch;
    attention_forward(b->out, b->lse, qc->q, kv + ko, kv + vo, a);
    attention_merge(qc->out, qc->lse, b->out, b->lse, a);
}

static void backward_block(QueryChunk *qc, const AttentionShape *a, real *kv, real *dkdv, size_t ko, size_t vo,
                           void *scratch) {
    attention_backward(qc->dq, dkdv + ko, dkdv + vo, qc->dout, qc->out, qc->lse, qc->q, kv + ko, kv + vo, a);
}

// k then v of this rank's block, packed.
static real *pack_kv(const real *k, const real *v, const RingAttentionShape *s) {
    real *kv = device_calloc(k_elems(s) + v_elems(s), sizeof(real));
    vec_copy(kv, k, k_elems(s));
    vec_copy(kv + k_elems(s), v, v_elems(s));
    return kv;
}

// Whether the K/V blocks travel packed as bf16 (RingAttentionShape.bf16_kv: two per real).
static int kv_travels_bf16(const RingAttentionShape *s) { return s->bf16_kv && (k_elems(s) + v_elems(s)) % 2 == 0; }

// Reals of one K/V block as it travels.
static size_t kv_travel_elems(const RingAttentionShape *s) {
    size_t n = k_elems(s) + v_elems(s);
    return kv_travels_bf16(s) ? n / 2 : n;
}

// Visits every step's blocks as the K/V blocks come round; the transfer of the next block
// runs during the compute (packed as bf16 when kv_travels_bf16, widened into kv on arrival).
// With dkdv (this rank's block's dk then dv, packed as the K/V, fp32: sums), the gradients
// travel with their block: after each step's compute they go to the next rank, so after P
// steps dkdv holds this rank's block's sums again.
static void run_ring(QueryChunk qc[CHUNKS_PER_RANK], const Comm *cp, const real *k, const real *v, real *dkdv,
                     const RingAttentionShape *s, BlockVisit visit, void *scratch) {
    size_t n = k_elems(s) + v_elems(s), sent = kv_travel_elems(s);
    int packed = kv_travels_bf16(s);
    real *kv = pack_kv(k, v, s), *travel = kv, *travel_next = device_calloc(sent, sizeof(real));
    if (packed) {
        travel = device_calloc(sent, sizeof(real));
        bf16_pack(travel, kv, n);
    }
    real *dkdv_next = dkdv ? device_calloc(n, sizeof(real)) : NULL;
    for (int step = 0; step < cp->size; step++) {
        CommRequest shift = {NULL};
        if (step + 1 < cp->size) comm_isendrecv(cp, travel, travel_next, sent, &shift);
        double t0 = now_seconds();
        visit_step(qc, cp, (cp->rank - step + cp->size) % cp->size, kv, dkdv, s, visit, scratch, &shift);
        double t1 = now_seconds();
        if (dkdv) {
            comm_sendrecv(cp, dkdv, dkdv_next, n);
            vec_copy(dkdv, dkdv_next, n);
        }
        double t2 = now_seconds();
        comm_wait(&shift);
        ring_times.compute_s += t1 - t0;
        ring_times.dkdv_s += t2 - t1;
        ring_times.kv_wait_s += now_seconds() - t2;
        ring_times.kv_shifts += step + 1 < cp->size;
        real *held = travel;
        travel = travel_next, travel_next = held;
        if (!packed) kv = travel;
        else if (step + 1 < cp->size) bf16_unpack(kv, travel, n);
    }
    if (packed) device_free(kv);
    device_free(travel), device_free(travel_next), device_free(dkdv_next);
}

// The K/V of every rank gathered at once (--cp-comm-type allgather), visited in the ring's
// order (so the merges, and the results, are the ring's). With dkdv each block's dk/dv
// are summed here and reduce-scattered back to their owners, onto dkdv.
static void run_allgather(QueryChunk qc[CHUNKS_PER_RANK], const Comm *cp, const real *k, const real *v, real *dkdv,
                          const RingAttentionShape *s, BlockVisit visit, void *scratch) {
    size_t n = k_elems(s) + v_elems(s), sent = kv_travel_elems(s);
    real *mine = pack_kv(k, v, s), *all = device_calloc((size_t)cp->size * n, sizeof(real));
    if (kv_travels_bf16(s)) {  // gathered packed, then widened
        real *packed = device_calloc((size_t)(cp->size + 1) * sent, sizeof(real)), *my_packed = packed + (size_t)cp->size * sent;
        bf16_pack(my_packed, mine, n);
        comm_allgather(cp, my_packed, packed, sent);
        bf16_unpack(all, packed, (size_t)cp->size * n);
        device_free(packed);
    } else {
        comm_allgather(cp, mine, all, n);
    }
    real *d_all = dkdv ? device_calloc((size_t)cp->size * n, sizeof(real)) : NULL;
    for (int step = 0; step < cp->size; step++) {
        int owner = (cp->rank - step + cp->size) % cp->size;
        visit_step(qc, cp, owner, all + owner * n, d_all ? d_all + owner * n : NULL, s, visit, scratch, NULL);
    }
    if (dkdv) {  // mine: this rank's block's sums over every rank
        comm_reduce_scatter(cp, d_all, mine, n);
        vec_add(dkdv, mine, n);
    }
    device_free(mine), device_free(all), device_free(d_all);
}

// How the K/V blocks reach every rank: the ring, or one all-gather.
typedef void (*KvExchange)(QueryChunk qc[CHUNKS_PER_RANK], const Comm *cp, const real *k, const real *v, real *dkdv,
                           const RingAttentionShape *s, BlockVisit visit, void *scratch);

static void group_attention_forward(KvExchange exchange, const Comm *cp, real *out, real *lse, const real *q,
                                    const real *k, const real *v, const RingAttentionShape *s) {
    size_t out_elems = (size_t)s->B * s->C * s->heads * v_dim(s), lse_elems = (size_t)s->B * s->heads * s->C;
    QueryChunk qc[CHUNKS_PER_RANK];
    load_queries(qc, cp, q, s);
    for (int i = 0; i < CHUNKS_PER_RANK; i++) {
        qc[i].out = device_calloc(out_elems, sizeof(real));
        qc[i].lse = device_calloc(lse_elems, sizeof(real));
        lse_reset(qc[i].lse, lse_elems);  // nothing merged yet
    }
    BlockResult b = {device_calloc(out_elems, sizeof(real)), device_calloc(lse_elems, sizeof(real))};
    exchange(qc, cp, k, v, NULL, s, forward_block, &b);
    for (int i = 0; i < CHUNKS_PER_RANK; i++) {
        scatter_tokens(out, qc[i].out, s, s->heads * v_dim(s), i);
        put_chunk(lse, qc[i].lse, s->B * s->heads, s->C, sizeof(real), i);
    }
    device_free(b.out), device_free(b.lse);
    free_queries(qc);
}

static void group_attention_backward(KvExchange exchange, const Comm *cp, real *dq, real *dk, real *dv,
                                     const real *dout, const real *out, const real *lse, const real *q,
                                     const real *k, const real *v, const RingAttentionShape *s) {
    int qw = s->heads * s->head_dim, ow = s->heads * v_dim(s);
    QueryChunk qc[CHUNKS_PER_RANK];
    load_queries(qc, cp, q, s);
    for (int i = 0; i < CHUNKS_PER_RANK; i++) {
        qc[i].out = gather_tokens(out, s, ow, i), qc[i].dout = gather_tokens(dout, s, ow, i);
        qc[i].lse = gather_lse(lse, s, i), qc[i].dq = gather_tokens(dq, s, qw, i);
    }
    real *dkdv = pack_kv(dk, dv, s);  // accumulates onto the caller's dk, dv
    exchange(qc, cp, k, v, dkdv, s, backward_block, NULL);
    vec_copy(dk, dkdv, k_elems(s));
    vec_copy(dv, dkdv + k_elems(s), v_elems(s));
    for (int i = 0; i < CHUNKS_PER_RANK; i++) scatter_tokens(dq, qc[i].dq, s, qw, i);
    device_free(dkdv);
    free_queries(qc);
}

void ring_attention_forward(const Comm *cp, real *out, real *lse, const real *q, const real *k, const real *v,
                            const RingAttentionShape *s) {
    group_attention_forward(run_ring, cp, out, lse, q, k, v, s);
}

void ring_attention_backward(const Comm *cp, real *dq, real *dk, real *dv, const real *dout, const real *out,
                             const real *lse, const real *q, const real *k, const real *v,
                             const RingAttentionShape *s) {
    group_attention_backward(run_ring, cp, dq, dk, dv, dout, out, lse, q, k, v, s);
}

// ---- the comm types ------------------------------------------------------------------------

static int is_all_to_all(const CpAttention *g) { return g->type == CP_COMM_A2A || g->type == CP_COMM_A2A_P2P; }

// The all-to-all and ring groups of a2a (the whole CP group, then a ring of one) and a2a+p2p.
static void all_to_all_groups(const CpAttention *g, const Comm **inner, const Comm **outer) {
    static Comm self;
    self = comm_self("cp_self");
    *inner = g->type == CP_COMM_A2A ? g->cp : g->inner;
    *outer = g->type == CP_COMM_A2A ? &self : g->outer;
}

void cp_attention_forward(const CpAttention *g, real *out, real *lse, const real *q, const real *k, const real *v,
                          const RingAttentionShape *s) {
    if (is_all_to_all(g)) {
        const Comm *inner, *outer;
        all_to_all_groups(g, &inner, &outer);
        a2a_attention_forward(inner, outer, out, lse, q, k, v, s);
        return;
    }
    group_attention_forward(g->type == CP_COMM_ALLGATHER ? run_allgather : run_ring, g->cp, out, lse, q, k, v, s);
}

void cp_attention_backward(const CpAttention *g, real *dq, real *dk, real *dv, const real *dout, const real *out,
                           const real *lse, const real *q, const real *k, const real *v,
                           const RingAttentionShape *s) {
    if (is_all_to_all(g)) {
        const Comm *inner, *outer;
        all_to_all_groups(g, &inner, &outer);
        a2a_attention_backward(inner, outer, dq, dk, dv, dout, out, lse, q, k, v, s);
        return;
    }
    group_attention_backward(g->type == CP_COMM_ALLGATHER ? run_allgather : run_ring, g->cp, dq, dk, dv, dout, out,
                             lse, q, k, v, s);
}
