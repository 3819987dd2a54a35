// cp_a2a.c — --cp-comm-type a2a and a2a+p2p (cp_attention.h): an all-to-all over the inner
// group (A ranks) trades sequence for heads, then the ring runs over the outer group.
//
// Inner member i holds chunks r and 2·P−1−r (r = outer·A + i) of C tokens each and every
// head. After the all-to-all it holds heads [i·h/A, (i+1)·h/A) of every member's chunks,
// laid out per batch row as the members' early chunks in member order, then their late
// chunks in reverse member order: exactly the two "super-chunks" (outer and 2·P/A−1−outer,
// of A·C tokens) that ring attention over the outer group expects. The outputs (and the
// gradients) go back by the inverse all-to-all. Plain a2a is the case A = P, outer of one.
#include <string.h>

#include "model/cp_attention.h"

typedef struct {
    const Comm *inner, *outer;
    int B, C, A;  // batch rows, tokens per chunk, inner members
} A2aLayout;

// Member and local token (0 .. 2C) of super-row position p (0 .. 2·A·C) of a batch row.
static void super_source(const A2aLayout *l, int p, int *member, int *t) {
    int AC = l->A * l->C;
    if (p < AC) {
        *member = p / l->C, *t = p % l->C;
    } else {
        *member = l->A - 1 - (p - AC) / l->C, *t = l->C + (p - AC) % l->C;
    }
}

// x (B, 2C, heads, w) of this member -> super (B, 2·A·C, heads/A, w): its head slice of
// every member's tokens.
static void sequence_gather(const A2aLayout *l, const real *x, real *super, int heads, int w) {
    int A = l->A, hs = heads / A, T2 = 2 * l->C;
    size_t row = (size_t)hs * w, block = (size_t)l->B * T2 * row;
    real *send = mt_malloc((size_t)A * block * sizeof(real)), *recv = mt_malloc((size_t)A * block * sizeof(real));
    for (int j = 0; j < A; j++)  // send[j][b][t] = heads of member j of token (b, t)
        for (int bt = 0; bt < l->B * T2; bt++)
            memcpy(send + j * block + bt * row, x + ((size_t)bt * heads + (size_t)j * hs) * w, row * sizeof(real));
    comm_alltoall(l->inner, send, recv, block);
    for (int b = 0; b < l->B; b++)
        for (int p = 0; p < A * T2; p++) {
            int member, t;
            super_source(l, p, &member, &t);
            memcpy(super + ((size_t)b * A * T2 + p) * row, recv + member * block + ((size_t)b * T2 + t) * row,
                   row * sizeof(real));
        }
    free(send), free(recv);
}

// The inverse of sequence_gather: super (B, 2·A·C, heads/A, w) -> x (B, 2C, heads, w),
// overwritten, or added to x when `accumulate`.
static void sequence_scatter(const A2aLayout *l, const real *super, real *x, int heads, int w, int accumulate) {
    int A = l->A, hs = heads / A, T2 = 2 * l->C;
    size_t row = (size_t)hs * w, block = (size_t)l->B * T2 * row;
    real *send = mt_malloc((size_t)A * block * sizeof(real)), *recv = mt_malloc((size_t)A * block * sizeof(real));
    for (int b = 0; b < l->B; b++)
        for (int p = 0; p < A * T2; p++) {
            int member, t;
            super_source(l, p, &member, &t);
            memcpy(send + member * block + ((size_t)b * T2 + t) * row, super + ((size_t)b * A * T2 + p) * row,
                   row * sizeof(real));
        }
    comm_alltoall(l->inner, send, recv, block);
    for (int j = 0; j < A; j++)
        for (int bt = 0; bt < l->B * T2; bt++) {
            real *to = x + ((size_t)bt * heads + (size_t)j * hs) * w;
            const real *from = recv + j * block + bt * row;
            for (size_t i = 0; i < row; i++) to[i] = accumulate ? to[i] + from[i] : from[i];
        }
    free(send), free(recv);
}

// lse (B, heads, T) <-> (B, T, heads): the token-major layout the all-to-all moves.
static void transpose_lse(real *to, const real *from, int B, int rows, int cols) {
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                to[((size_t)b * cols + c) * rows + r] = from[((size_t)b * rows + r) * cols + c];
}

// key_start of this member's tokens -> those of the super rows (gathered over the inner group).
static int32_t *super_key_start(const A2aLayout *l, const int32_t *key_start) {
    if (!key_start) return NULL;
    int A = l->A, T2 = 2 * l->C;
    size_t block = (size_t)l->B * T2;
    int32_t *all = mt_malloc((size_t)A * block * sizeof(int32_t)), *super = mt_malloc((size_t)A * block * sizeof(int32_t));
    comm_allgather_int32(l->inner, key_start, all, block);
    for (int b = 0; b < l->B; b++)
        for (int p = 0; p < A * T2; p++) {
            int member, t;
            super_source(l, p, &member, &t);
            super[(size_t)b * A * T2 + p] = all[member * block + (size_t)b * T2 + t];
        }
    free(all);
    return super;
}

// The ring's shape over the outer group: chunks of A·C tokens, heads/A.
static RingAttentionShape super_shape(const A2aLayout *l, const RingAttentionShape *s, const int32_t *key_start) {
    RingAttentionShape r = *s;
    r.C = l->A * s->C;
    r.heads = s->heads / l->A;
    r.kv_heads = s->kv_heads / l->A;
    r.key_start = key_start;
    return r;
}

static A2aLayout layout_of(const Comm *inner, const Comm *outer, const RingAttentionShape *s) {
    MT_ASSERT(s->heads % inner->size == 0 && s->kv_heads % inner->size == 0);
    return (A2aLayout){.inner = inner, .outer = outer, .B = s->B, .C = s->C, .A = inner->size};
}

static int v_width(const RingAttentionShape *s) { return s->v_head_dim ? s->v_head_dim : s->head_dim; }

// The super-row q, k, v (and, for backward, out, dout, lse) of this member.
typedef struct {
    real *q, *k, *v, *out, *lse, *dout;
    int32_t *key_start;
} SuperTensors;

static size_t tokens_of(const A2aLayout *l) { return (size_t)l->B * 2 * l->C; }

static void gather_qkv(const A2aLayout *l, const RingAttentionShape *s, SuperTensors *t, const real *q,
                       const real *k, const real *v) {
    size_t n = tokens_of(l);  // super rows hold as many elements as the local tensors
    t->q = mt_malloc(n * s->heads * s->head_dim * sizeof(real));
    t->k = mt_malloc(n * s->kv_heads * s->head_dim * sizeof(real));
    t->v = mt_malloc(n * s->kv_heads * v_width(s) * sizeof(real));
    sequence_gather(l, q, t->q, s->heads, s->head_dim);
    sequence_gather(l, k, t->k, s->kv_heads, s->head_dim);
    sequence_gather(l, v, t->v, s->kv_heads, v_width(s));
    t->key_start = super_key_start(l, s->key_start);
}

static void free_super(SuperTensors *t) {
    free(t->q), free(t->k), free(t->v), free(t->out), free(t->lse), free(t->dout), free(t->key_start);
}

void a2a_attention_forward(const Comm *inner, const Comm *outer, real *out, real *lse, const real *q,
                           const real *k, const real *v, const RingAttentionShape *s) {
    A2aLayout l = layout_of(inner, outer, s);
    SuperTensors t = {0};
    gather_qkv(&l, s, &t, q, k, v);
    RingAttentionShape rs = super_shape(&l, s, t.key_start);
    size_t n = tokens_of(&l);
    t.out = mt_malloc(n * s->heads * v_width(s) * sizeof(real));
    t.lse = mt_malloc(n * s->heads * sizeof(real));
    ring_attention_forward(outer, t.out, t.lse, t.q, t.k, t.v, &rs);
    sequence_scatter(&l, t.out, out, s->heads, v_width(s), 0);
    real *super_rows = mt_malloc(n * s->heads * sizeof(real)), *local_rows = mt_malloc(n * s->heads * sizeof(real));
    transpose_lse(super_rows, t.lse, l.B, rs.heads, 2 * rs.C);  // (B, heads/A, 2AC) -> (B, 2AC, heads/A)
    sequence_scatter(&l, super_rows, local_rows, s->heads, 1, 0);
    transpose_lse(lse, local_rows, l.B, 2 * s->C, s->heads);  // (B, 2C, heads) -> (B, heads, 2C)
    free(super_rows), free(local_rows);
    free_super(&t);
}

void a2a_attention_backward(const Comm *inner, const Comm *outer, real *dq, real *dk, real *dv, const real *dout,
                            const real *out, const real *lse, const real *q, const real *k, const real *v,
                            const RingAttentionShape *s) {
    A2aLayout l = layout_of(inner, outer, s);
    SuperTensors t = {0};
    gather_qkv(&l, s, &t, q, k, v);  // again: forward kept only the local tensors
    RingAttentionShape rs = super_shape(&l, s, t.key_start);
    size_t n = tokens_of(&l);
    t.out = mt_malloc(n * s->heads * v_width(s) * sizeof(real));
    t.dout = mt_malloc(n * s->heads * v_width(s) * sizeof(real));
    t.lse = mt_malloc(n * s->heads * sizeof(real));
    sequence_gather(&l, out, t.out, s->heads, v_width(s));
    sequence_gather(&l, dout, t.dout, s->heads, v_width(s));
    real *rows = mt_malloc(n * s->heads * sizeof(real)), *super_rows = mt_malloc(n * s->heads * sizeof(real));
    transpose_lse(rows, lse, l.B, s->heads, 2 * s->C);
    sequence_gather(&l, rows, super_rows, s->heads, 1);
    transpose_lse(t.lse, super_rows, l.B, 2 * rs.C, rs.heads);
    free(rows), free(super_rows);
    real *sdq = mt_calloc(n * s->heads * s->head_dim, sizeof(real));
    real *sdk = mt_calloc(n * s->kv_heads * s->head_dim, sizeof(real));
    real *sdv = mt_calloc(n * s->kv_heads * v_width(s), sizeof(real));
    ring_attention_backward(outer, sdq, sdk, sdv, t.dout, t.out, t.lse, t.q, t.k, t.v, &rs);
    sequence_scatter(&l, sdq, dq, s->heads, s->head_dim, 1);
    sequence_scatter(&l, sdk, dk, s->kv_heads, s->head_dim, 1);
    sequence_scatter(&l, sdv, dv, s->kv_heads, v_width(s), 1);
    free(sdq), free(sdk), free(sdv);
    free_super(&t);
}
