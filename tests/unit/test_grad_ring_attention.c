// test_grad_ring_attention.c — the attention ops context parallelism is built on, in double:
// attention_forward / attention_backward on a block of keys at position k_pos0, and
// attention_merge, the log-sum-exp merge of the blocks' results.
//
// A ring is simulated on one process as Megatron-Core splits a sequence: each batch row's T
// tokens are cut into 2·CP chunks and rank r holds chunks r and 2·CP − 1 − r. Each rank's
// query chunks attend to the key chunks of every rank in ring order (its own first, then
// those of ranks r − 1, r − 2, …), skipping chunks entirely in the future, and merge the
// results; backward runs per block from the merged out and lse, the dk / dv of each key
// chunk summed over the blocks that read it. Out, lse, dq, dk and dv must equal one
// attention over the whole sequence to 1e-12.
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "ops/ops.h"
#include "testlib.h"

#define RING_TOL 1e-12

typedef struct {
    int B, T, heads, kv_heads, head_dim, v_head_dim;
    const int32_t *key_start;  // (B·T) position of each token's document start, or NULL
} Problem;

// Per-token widths of the tensors.
static int q_width(const Problem *p) { return p->heads * p->head_dim; }
static int k_width(const Problem *p) { return p->kv_heads * p->head_dim; }
static int v_width(const Problem *p) { return p->kv_heads * p->v_head_dim; }
static int o_width(const Problem *p) { return p->heads * p->v_head_dim; }

static real *alloc_normal(Rng *rng, size_t n) {
    real *x = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)rng_normal(rng);
    return x;
}

static real *alloc_zero(size_t n) { return mt_calloc(n, sizeof(real)); }

// The whole problem's tensors, (B·T, width) per token and lse (B, heads, T).
typedef struct {
    real *q, *k, *v, *dout;
    real *out, *lse, *dq, *dk, *dv;
} Tensors;

static Tensors alloc_inputs(const Problem *p, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    size_t tokens = (size_t)p->B * p->T;
    Tensors x = {.q = alloc_normal(&rng, tokens * q_width(p)), .k = alloc_normal(&rng, tokens * k_width(p)),
                 .v = alloc_normal(&rng, tokens * v_width(p)), .dout = alloc_normal(&rng, tokens * o_width(p))};
    return x;
}

static void alloc_outputs(Tensors *x, const Problem *p) {
    size_t tokens = (size_t)p->B * p->T;
    x->out = alloc_zero(tokens * o_width(p)), x->lse = alloc_zero(tokens * p->heads);
    x->dq = alloc_zero(tokens * q_width(p)), x->dk = alloc_zero(tokens * k_width(p));
    x->dv = alloc_zero(tokens * v_width(p));
}

static void free_tensors(Tensors *x) {
    free(x->q), free(x->k), free(x->v), free(x->dout);
    free(x->out), free(x->lse), free(x->dq), free(x->dk), free(x->dv);
}

static AttentionShape problem_shape(const Problem *p, int Tq, int Tk, int q_pos0, int k_pos0,
                                    const int32_t *key_start) {
    AttentionShape s = {.B = p->B, .Tq = Tq, .Tk = Tk, .q_pos0 = q_pos0, .k_pos0 = k_pos0, .heads = p->heads,
                        .kv_heads = p->kv_heads, .head_dim = p->head_dim, .v_head_dim = p->v_head_dim,
                        .kv_row_stride = Tk, .scale = 1 / sqrt((double)p->head_dim), .key_start = key_start};
    return s;
}

// The reference: one attention over the whole sequence, forward and backward.
static Tensors unsplit_attention(const Problem *p, uint64_t seed) {
    Tensors x = alloc_inputs(p, seed);
    alloc_outputs(&x, p);
    AttentionShape s = problem_shape(p, p->T, p->T, 0, 0, p->key_start);
    attention_forward(x.out, x.lse, x.q, x.k, x.v, &s);
    attention_backward(x.dq, x.dk, x.dv, x.dout, x.out, x.lse, x.q, x.k, x.v, &s);
    return x;
}

// ---- chunks ----------------------------------------------------------------------------------

// `outer` runs of T rows of row_bytes each; chunk c of each run is its rows [c·C, c·C + C).
typedef struct {
    int outer, T, C;
    size_t row_bytes;
} ChunkLayout;

static void gather_chunk(void *chunk, const void *whole, const ChunkLayout *l, int c) {
    size_t run = (size_t)l->C * l->row_bytes;
    for (int o = 0; o < l->outer; o++)
        memcpy((char *)chunk + o * run, (const char *)whole + ((size_t)o * l->T + (size_t)c * l->C) * l->row_bytes,
               run);
}

static void scatter_chunk(void *whole, const void *chunk, const ChunkLayout *l, int c) {
    size_t run = (size_t)l->C * l->row_bytes;
    for (int o = 0; o < l->outer; o++)
        memcpy((char *)whole + ((size_t)o * l->T + (size_t)c * l->C) * l->row_bytes, (const char *)chunk + o * run,
               run);
}

static ChunkLayout token_layout(const Problem *p, int C, int width, size_t elem_bytes) {
    ChunkLayout l = {.outer = p->B, .T = p->T, .C = C, .row_bytes = (size_t)width * elem_bytes};
    return l;
}

static ChunkLayout lse_layout(const Problem *p, int C) {  // lse (B, heads, T): B·heads runs
    ChunkLayout l = {.outer = p->B * p->heads, .T = p->T, .C = C, .row_bytes = sizeof(real)};
    return l;
}

// One chunk of a batch's tokens as a rank holds it; out / lse are merged over the ring.
typedef struct {
    int32_t *key_start;  // (B·C) or NULL
    real *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} Chunk;

static real *chunk_of(const real *whole, const Problem *p, int C, int width, int c) {
    ChunkLayout l = token_layout(p, C, width, sizeof(real));
    real *chunk = mt_malloc((size_t)p->B * C * width * sizeof(real));
    gather_chunk(chunk, whole, &l, c);
    return chunk;
}

static Chunk make_chunk(const Tensors *x, const Problem *p, int C, int c) {
    size_t tokens = (size_t)p->B * C;
    Chunk ch = {.q = chunk_of(x->q, p, C, q_width(p), c), .k = chunk_of(x->k, p, C, k_width(p), c),
                .v = chunk_of(x->v, p, C, v_width(p), c), .dout = chunk_of(x->dout, p, C, o_width(p), c),
                .out = alloc_zero(tokens * o_width(p)), .lse = mt_malloc(tokens * p->heads * sizeof(real)),
                .dq = alloc_zero(tokens * q_width(p)), .dk = alloc_zero(tokens * k_width(p)),
                .dv = alloc_zero(tokens * v_width(p))};
    for (size_t i = 0; i < tokens * p->heads; i++) ch.lse[i] = -INFINITY;  // nothing merged yet
    if (p->key_start) {
        ChunkLayout l = token_layout(p, C, 1, sizeof(int32_t));
        ch.key_start = mt_malloc(tokens * sizeof(int32_t));
        gather_chunk(ch.key_start, p->key_start, &l, c);
    }
    return ch;
}

static void free_chunk(Chunk *ch) {
    free(ch->key_start), free(ch->q), free(ch->k), free(ch->v), free(ch->dout);
    free(ch->out), free(ch->lse), free(ch->dq), free(ch->dk), free(ch->dv);
}

// The ring's results put back into whole-sequence tensors.
static void scatter_results(Tensors *x, const Chunk *chunks, const Problem *p, int C, int n_chunks) {
    ChunkLayout lo = token_layout(p, C, o_width(p), sizeof(real)), ll = lse_layout(p, C);
    ChunkLayout lq = token_layout(p, C, q_width(p), sizeof(real)), lk = token_layout(p, C, k_width(p), sizeof(real));
    ChunkLayout lv = token_layout(p, C, v_width(p), sizeof(real));
    for (int c = 0; c < n_chunks; c++) {
        scatter_chunk(x->out, chunks[c].out, &lo, c);
        scatter_chunk(x->lse, chunks[c].lse, &ll, c);
        scatter_chunk(x->dq, chunks[c].dq, &lq, c);
        scatter_chunk(x->dk, chunks[c].dk, &lk, c);
        scatter_chunk(x->dv, chunks[c].dv, &lv, c);
    }
}

// ---- the ring --------------------------------------------------------------------------------

// The two chunks rank r of cp holds (Megatron-Core's load-balanced causal split).
static void rank_chunks(int r, int cp, int chunk[2]) {
    chunk[0] = r;
    chunk[1] = 2 * cp - 1 - r;
}

// Calls visit(query chunk, key chunk) for every block a rank computes, in ring order: rank
// r's two query chunks, for each against the key chunks of ranks r, r − 1, … (mod cp) as
// the K/V blocks arrive, skipping key chunks entirely after the query chunk.
typedef void (*BlockVisit)(Chunk *chunks, const Problem *p, int C, int query_chunk, int key_chunk, void *scratch);

static void ring_blocks(Chunk *chunks, const Problem *p, int cp, BlockVisit visit, void *scratch) {
    int C = p->T / (2 * cp);
    for (int r = 0; r < cp; r++) {
        int mine[2];
        rank_chunks(r, cp, mine);
        for (int qi = 0; qi < 2; qi++)
            for (int step = 0; step < cp; step++) {
                int theirs[2];
                rank_chunks((r - step + cp) % cp, cp, theirs);
                for (int ki = 0; ki < 2; ki++)
                    if (theirs[ki] <= mine[qi]) visit(chunks, p, C, mine[qi], theirs[ki], scratch);
            }
    }
}

static AttentionShape block_shape(const Problem *p, int C, const Chunk *query, int query_chunk, int key_chunk) {
    return problem_shape(p, C, C, query_chunk * C, key_chunk * C, query->key_start);
}

typedef struct {
    real *out, *lse;  // one block's partial result
} BlockScratch;

static void forward_block(Chunk *chunks, const Problem *p, int C, int qc, int kc, void *scratch) {
    BlockScratch *b = scratch;
    Chunk *query = &chunks[qc];
    AttentionShape s = block_shape(p, C, query, qc, kc);
    attention_forward(b->out, b->lse, query->q, chunks[kc].k, chunks[kc].v, &s);
    attention_merge(query->out, query->lse, b->out, b->lse, &s);
}

static void backward_block(Chunk *chunks, const Problem *p, int C, int qc, int kc, void *scratch) {
    Chunk *query = &chunks[qc];
    AttentionShape s = block_shape(p, C, query, qc, kc);
    attention_backward(query->dq, chunks[kc].dk, chunks[kc].dv, query->dout, query->out, query->lse, query->q,
                       chunks[kc].k, chunks[kc].v, &s);
}

static Tensors ring_attention(const Problem *p, int cp, uint64_t seed) {
    int C = p->T / (2 * cp), n_chunks = 2 * cp;
    Tensors x = alloc_inputs(p, seed);
    alloc_outputs(&x, p);
    Chunk *chunks = mt_malloc(n_chunks * sizeof(Chunk));
    for (int c = 0; c < n_chunks; c++) chunks[c] = make_chunk(&x, p, C, c);
    BlockScratch b = {mt_malloc((size_t)p->B * C * o_width(p) * sizeof(real)),
                      mt_malloc((size_t)p->B * C * p->heads * sizeof(real))};
    ring_blocks(chunks, p, cp, forward_block, &b);
    ring_blocks(chunks, p, cp, backward_block, &b);
    scatter_results(&x, chunks, p, C, n_chunks);
    for (int c = 0; c < n_chunks; c++) free_chunk(&chunks[c]);
    free(chunks), free(b.out), free(b.lse);
    return x;
}

// ---- comparisons -------------------------------------------------------------------------------

// |got − want| ≤ tol·(1 + |want|) everywhere; −∞ only where want is −∞.
static void check_close(const char *what, const real *got, const real *want, size_t n, double tol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        int same_inf = isinf(want[i]) && got[i] == want[i];
        if (!same_inf && !(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))) && bad++ < 3)
            CHECK(0, "%s[%zu]: got %.17g expected %.17g", what, i, (double)got[i], (double)want[i]);
    }
}

static void check_ring(const Problem *p, int cp, uint64_t seed) {
    CHECK(p->T % (2 * cp) == 0, "T = %d does not split into %d chunks", p->T, 2 * cp);
    Tensors ring = ring_attention(p, cp, seed), whole = unsplit_attention(p, seed);
    size_t tokens = (size_t)p->B * p->T;
    check_close("out", ring.out, whole.out, tokens * o_width(p), RING_TOL);
    check_close("lse", ring.lse, whole.lse, tokens * p->heads, RING_TOL);
    check_close("dq", ring.dq, whole.dq, tokens * q_width(p), RING_TOL);
    check_close("dk", ring.dk, whole.dk, tokens * k_width(p), RING_TOL);
    check_close("dv", ring.dv, whole.dv, tokens * v_width(p), RING_TOL);
    free_tensors(&ring), free_tensors(&whole);
}

// key_start (B·T) of documents starting at the given positions of each row (starts[b][0] = 0).
enum { MAX_DOCS = 8 };
static int32_t *documents(int B, int T, const int starts[][MAX_DOCS], const int *n_docs) {
    int32_t *key_start = mt_malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        for (int d = 0; d < n_docs[b]; d++) {
            int end = d + 1 < n_docs[b] ? starts[b][d + 1] : T;
            for (int t = starts[b][d]; t < end; t++) key_start[(size_t)b * T + t] = starts[b][d];
        }
    return key_start;
}

// Row 0: documents [0,5) [5,13) [13,20) [20,24); row 1: [0,9) [9,10) [10,17) [17,24). With 4
// chunks of 6 (CP = 2) or 8 of 3 (CP = 4) documents cross chunk boundaries and start inside
// chunks: the queries of a document starting mid-chunk see nothing of the earlier chunks, so
// those blocks are fully masked for some rows only (lse = −∞ there, merged with weight 0).
static const int DOC_STARTS[2][MAX_DOCS] = {{0, 5, 13, 20}, {0, 9, 10, 17}};
static const int DOC_COUNTS[2] = {4, 4};

static void check_ring_documents(int cp, int kv_heads, int v_head_dim, uint64_t seed) {
    int32_t *key_start = documents(2, 24, DOC_STARTS, DOC_COUNTS);
    Problem p = {.B = 2, .T = 24, .heads = 4, .kv_heads = kv_heads, .head_dim = 4, .v_head_dim = v_head_dim,
                 .key_start = key_start};
    check_ring(&p, cp, seed);
    free(key_start);
}

static void test_ring_cp2_gqa_documents(void) { check_ring_documents(2, 2, 6, 41); }
static void test_ring_cp4_gqa_documents(void) { check_ring_documents(4, 2, 6, 42); }
static void test_ring_cp4_mqa_narrow_values(void) { check_ring_documents(4, 1, 3, 43); }

static void test_ring_cp2_causal(void) {
    Problem p = {.B = 2, .T = 24, .heads = 2, .kv_heads = 2, .head_dim = 4, .v_head_dim = 4};
    check_ring(&p, 2, 44);
}

// Chunks of 70 tokens: more than one 64-query tile of the cpu kernel per block; documents at
// random positions (about one token in 12 starts one).
static void test_ring_cp2_long_chunks(void) {
    enum { B = 2, T = 280 };
    Rng rng;
    rng_seed(&rng, 45);
    int32_t *key_start = mt_malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0; t < T; t++) {
            if (t > 0 && rng_below(&rng, 12) == 0) start = t;
            key_start[(size_t)b * T + t] = start;
        }
    Problem p = {.B = B, .T = T, .heads = 4, .kv_heads = 2, .head_dim = 8, .v_head_dim = 5, .key_start = key_start};
    check_ring(&p, 2, 46);
    free(key_start);
}

// ---- k_pos0 itself -------------------------------------------------------------------------------

// Moving every position (queries, keys, document starts) by the same amount changes no bit:
// k_pos0 = 1000 against the k_pos0 = 0 shape every existing caller uses (a chunk of 70
// queries after a prefix of 20, as with a KV cache: two query tiles, documents).
static void test_k_pos0_shift_same_bits(void) {
    enum { SHIFT = 1000, B = 2, PREFIX = 20, TQ = 70, TK = PREFIX + TQ };
    Problem p = {.B = B, .T = TK, .heads = 4, .kv_heads = 2, .head_dim = 4, .v_head_dim = 6};
    Rng rng;
    rng_seed(&rng, 47);
    size_t nq = (size_t)B * TQ * q_width(&p), nk = (size_t)B * TK * k_width(&p), nv = (size_t)B * TK * v_width(&p);
    size_t no = (size_t)B * TQ * o_width(&p), nl = (size_t)B * TQ * p.heads;
    real *q = alloc_normal(&rng, nq), *k = alloc_normal(&rng, nk), *v = alloc_normal(&rng, nv);
    real *dout = alloc_normal(&rng, no);
    int32_t key_start[2][B * TQ];
    for (int i = 0; i < B * TQ; i++) {
        int t = i % TQ, doc = PREFIX + t >= 50 ? 50 : PREFIX + t >= 7 ? 7 : 0;
        key_start[0][i] = i < TQ ? doc : 0;  // row 0 holds documents, row 1 one
        key_start[1][i] = key_start[0][i] + SHIFT;
    }
    real *out[2], *lse[2], *grads[2][3];
    for (int run = 0; run < 2; run++) {
        AttentionShape s = problem_shape(&p, TQ, TK, PREFIX + run * SHIFT, run * SHIFT, key_start[run]);
        out[run] = mt_malloc(no * sizeof(real)), lse[run] = mt_malloc(nl * sizeof(real));
        grads[run][0] = alloc_zero(nq), grads[run][1] = alloc_zero(nk), grads[run][2] = alloc_zero(nv);
        attention_forward(out[run], lse[run], q, k, v, &s);
        attention_backward(grads[run][0], grads[run][1], grads[run][2], dout, out[run], lse[run], q, k, v, &s);
    }
    CHECK(memcmp(out[0], out[1], no * sizeof(real)) == 0, "out differs when every position moves by %d", SHIFT);
    CHECK(memcmp(lse[0], lse[1], nl * sizeof(real)) == 0, "lse differs when every position moves by %d", SHIFT);
    CHECK(memcmp(grads[0][0], grads[1][0], nq * sizeof(real)) == 0, "dq differs");
    CHECK(memcmp(grads[0][1], grads[1][1], nk * sizeof(real)) == 0, "dk differs");
    CHECK(memcmp(grads[0][2], grads[1][2], nv * sizeof(real)) == 0, "dv differs");
    for (int run = 0; run < 2; run++) free(out[run]), free(lse[run]), free(grads[run][0]), free(grads[run][1]), free(grads[run][2]);
    free(q), free(k), free(v), free(dout);
}

// Query rows that see no key of the block: out = 0 and lse = −∞ (written over NaN), and
// backward adds nothing (dq, dk, dv keep their bits). Three blocks of 8 keys against 8
// queries at positions 16..23: keys 24..31 (all in the future), keys 0..7 with every
// document starting at 12 or later (all masked), keys 8..15 with documents starting at 8
// (rows 16..19) and at 20 (rows 20..23): the block is masked for the last four rows only.
static void test_rows_seeing_no_key(void) {
    enum { B = 1, TQ = 8, TK = 8, Q_POS0 = 16 };
    Problem p = {.B = B, .T = TK, .heads = 2, .kv_heads = 1, .head_dim = 4, .v_head_dim = 3};
    Rng rng;
    rng_seed(&rng, 48);
    size_t nq = (size_t)TQ * q_width(&p), nk = (size_t)TK * k_width(&p), nv = (size_t)TK * v_width(&p);
    size_t no = (size_t)TQ * o_width(&p), nl = (size_t)TQ * p.heads;
    real *q = alloc_normal(&rng, nq), *k = alloc_normal(&rng, nk), *v = alloc_normal(&rng, nv);
    real *dout = alloc_normal(&rng, no), *out = mt_malloc(no * sizeof(real)), *lse = mt_malloc(nl * sizeof(real));
    real *dq0 = alloc_normal(&rng, nq), *dk0 = alloc_normal(&rng, nk), *dv0 = alloc_normal(&rng, nv);
    static const int32_t late_docs[TQ] = {12, 12, 12, 12, 12, 12, 20, 20};
    static const int32_t split_docs[TQ] = {8, 8, 8, 8, 20, 20, 20, 20};
    const struct {
        const char *name;
        int k_pos0;
        const int32_t *key_start;
        int masked_from;  // the rows from this one on see nothing
    } blocks[] = {{"future block", 24, NULL, 0}, {"masked block", 0, late_docs, 0}, {"split block", 8, split_docs, 4}};
    for (size_t c = 0; c < sizeof blocks / sizeof blocks[0]; c++) {
        AttentionShape s = problem_shape(&p, TQ, TK, Q_POS0, blocks[c].k_pos0, blocks[c].key_start);
        for (size_t i = 0; i < no; i++) out[i] = NAN;
        for (size_t i = 0; i < nl; i++) lse[i] = NAN;
        attention_forward(out, lse, q, k, v, &s);
        real *dq = mt_malloc(nq * sizeof(real)), *dk = mt_malloc(nk * sizeof(real)), *dv = mt_malloc(nv * sizeof(real));
        memcpy(dq, dq0, nq * sizeof(real)), memcpy(dk, dk0, nk * sizeof(real)), memcpy(dv, dv0, nv * sizeof(real));
        attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &s);
        for (int t = 0; t < TQ; t++) {
            int masked = t >= blocks[c].masked_from;
            for (int h = 0; h < p.heads; h++) {
                real l = lse[(size_t)h * TQ + t];
                CHECK(masked ? l == -INFINITY : isfinite(l), "%s row %d head %d: lse %g", blocks[c].name, t, h, (double)l);
            }
            for (int i = 0; i < o_width(&p); i++) {
                real o = out[(size_t)t * o_width(&p) + i];
                CHECK(masked ? o == 0 : isfinite(o), "%s row %d: out %g", blocks[c].name, t, (double)o);
            }
            size_t row = (size_t)t * q_width(&p);
            int dq_kept = memcmp(dq + row, dq0 + row, q_width(&p) * sizeof(real)) == 0;
            CHECK(masked == dq_kept, "%s row %d: dq %s", blocks[c].name, t, dq_kept ? "unchanged" : "changed");
        }
        int all_masked = blocks[c].masked_from == 0;
        int dk_kept = memcmp(dk, dk0, nk * sizeof(real)) == 0, dv_kept = memcmp(dv, dv0, nv * sizeof(real)) == 0;
        CHECK(dk_kept == all_masked && dv_kept == all_masked, "%s: dk %s, dv %s", blocks[c].name,
              dk_kept ? "unchanged" : "changed", dv_kept ? "unchanged" : "changed");
        free(dq), free(dk), free(dv);
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq0), free(dk0), free(dv0);
}

// attention_merge on hand-made rows: −∞ on either side or both, and two finite sides
// against log(e^a + e^c) and the weighted sum computed directly.
static void test_merge_infinities(void) {
    enum { ROWS = 4, DV = 2 };
    AttentionShape s = {.B = 1, .Tq = ROWS, .heads = 1, .kv_heads = 1, .head_dim = DV};
    real out[ROWS * DV] = {0, 0, 0.25, -0.5, 0, 0, 0.75, 0.125};
    real lse[ROWS] = {-INFINITY, 1.5, -INFINITY, 0.25};
    const real out_block[ROWS * DV] = {0.375, -2, 0, 0, 0, 0, -1, 3};
    const real lse_block[ROWS] = {2.5, -INFINITY, -INFINITY, 1.75};
    attention_merge(out, lse, out_block, lse_block, &s);
    CHECK(lse[0] == 2.5 && out[0] == 0.375 && out[1] == -2, "nothing merged yet: the block's result");
    CHECK(lse[1] == 1.5 && out[2] == 0.25 && out[3] == -0.5, "an empty block changes nothing");
    CHECK(lse[2] == -INFINITY && out[4] == 0 && out[5] == 0, "two empty sides stay empty (no NaN)");
    double merged = log(exp(0.25) + exp(1.75)), w = exp(0.25 - merged), w_block = exp(1.75 - merged);
    CHECK_CLOSE(lse[3], merged, 0, 1e-15, "lse of two finite sides");
    CHECK_CLOSE(out[6], w * 0.75 + w_block * -1, 0, 1e-15, "out[0] of two finite sides");
    CHECK_CLOSE(out[7], w * 0.125 + w_block * 3, 0, 1e-15, "out[1] of two finite sides");
}

int main(void) {
    RUN(test_ring_cp2_gqa_documents);
    RUN(test_ring_cp4_gqa_documents);
    RUN(test_ring_cp4_mqa_narrow_values);
    RUN(test_ring_cp2_causal);
    RUN(test_ring_cp2_long_chunks);
    RUN(test_k_pos0_shift_same_bits);
    RUN(test_rows_seeing_no_key);
    RUN(test_merge_infinities);
    TESTS_DONE();
}
