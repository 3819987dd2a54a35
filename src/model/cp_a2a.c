// cp_a2a.c — --cp-comm-type a2a and a2a+p2p (cp_attention.h): an all-to-all over the inner
// group (A ranks) trades sequence for heads, then the ring runs over the outer group.
//
// Inner member i holds chunks r and 2·P−1−r (r = outer·A + i) of C tokens each and every
// head. After the all-to-all it holds heads [i·h/A, (i+1)·h/A) of every member's chunks,
// laid out per batch row as the members' early chunks in member order, then their late
// chunks in reverse member order: exactly the two "super-chunks" (outer and 2·P/A−1−outer,
// of A·C tokens) that ring attention over the outer group expects. The outputs (and the
// gradients) go back by the inverse all-to-all. Plain a2a is the case A = P, outer of one.
// Every buffer is tensor memory; the re-layouts around the all-to-alls are strided-copy ops.
#include "model/cp_attention.h"
#include "core/device.h"
#include "ops/ops_parallel.h"

typedef struct {
    const Comm *inner, *outer;
    int B, C, A;  // batch rows, tokens per chunk, inner members
} A2aLayout;

// Super rows (B, 2·A·C, row) <-> member blocks (A, B, 2C, row), rows of `row_bytes` bytes:
// super position p < A·C holds member p / C's early token p % C, position A·C + q·C + t
// holds member A−1−q's late token C + t. One strided copy per member and half (over B).
static void super_rows_copy(const A2aLayout *l, char *super, char *members, size_t row_bytes, int to_super) {
    int A = l->A, C = l->C, T2 = 2 * C;
    size_t run = (size_t)C * row_bytes, block = (size_t)l->B * T2 * row_bytes;
    size_t super_pitch = (size_t)A * T2 * row_bytes, member_pitch = (size_t)T2 * row_bytes;
    for (int m = 0; m < A; m++)
        for (int half = 0; half < 2; half++) {
            char *sp = super + (half ? (size_t)A * run + (size_t)(A - 1 - m) * run : (size_t)m * run);
            char *mp = members + m * block + half * run;
            if (to_super) rows_copy_strided(sp, super_pitch, mp, member_pitch, run, l->B);
            else rows_copy_strided(mp, member_pitch, sp, super_pitch, run, l->B);
        }
}

// x (B·2C, heads, w) <-> blocks (A, B·2C, heads/A, w): block j holds head slice j of every token.
static void head_blocks_copy(const A2aLayout *l, real *x, real *blocks, int heads, int w, int to_blocks) {
    int hs = heads / l->A, tokens = l->B * 2 * l->C;
    size_t row = (size_t)hs * w, block = (size_t)tokens * row;
    for (int j = 0; j < l->A; j++) {
        real *xj = x + (size_t)j * row, *bj = blocks + j * block;
        if (to_blocks) rows_copy_strided(bj, row * sizeof(real), xj, (size_t)heads * w * sizeof(real), row * sizeof(real), tokens);
        else rows_copy_strided(xj, (size_t)heads * w * sizeof(real), bj, row * sizeof(real), row * sizeof(real), tokens);
    }
}

// x (B, 2C, heads, w) of this member -> super (B, 2·A·C, heads/A, w): its head slice of
// every member's tokens. bf16: x travels as bf16 (only the attention's bf16-input GEMMs read
// it: q, k, v with RingAttentionShape.bf16_kv), packed into recv's halves and widened back
// into send.
static void sequence_gather(const A2aLayout *l, const real *x, real *super, int heads, int w, int bf16) {
    size_t n = (size_t)l->B * 2 * l->C * heads * w;  // A blocks of (B·2C, heads/A, w)
    real *send = device_calloc(n, sizeof(real)), *recv = device_calloc(n, sizeof(real)), *arrived = recv;
    head_blocks_copy(l, (real *)x, send, heads, w, 1);
    if (bf16 && n % (2 * (size_t)l->A) == 0) {
        real *packed_send = recv, *packed_recv = recv + n / 2;
        bf16_pack(packed_send, send, n);
        comm_alltoall(l->inner, packed_send, packed_recv, n / 2 / l->A);
        bf16_unpack(send, packed_recv, n);
        arrived = send;
    } else {
        comm_alltoall(l->inner, send, recv, n / l->A);
    }
    super_rows_copy(l, (char *)super, (char *)arrived, (size_t)heads / l->A * w * sizeof(real), 1);
    device_free(send), device_free(recv);
}

// The inverse of sequence_gather: super (B, 2·A·C, heads/A, w) -> x (B, 2C, heads, w),
// overwritten, or added to x when `accumulate`.
static void sequence_scatter(const A2aLayout *l, const real *super, real *x, int heads, int w, int accumulate) {
    size_t n = (size_t)l->B * 2 * l->C * heads * w;
    real *send = device_calloc(n, sizeof(real)), *recv = device_calloc(n, sizeof(real));
    super_rows_copy(l, (char *)super, (char *)send, (size_t)heads / l->A * w * sizeof(real), 0);
    comm_alltoall(l->inner, send, recv, n / l->A);
    if (accumulate) {  // send (done with) takes x's blocks, += the received ones
        head_blocks_copy(l, x, send, heads, w, 1);
        vec_add(send, recv, n);
        head_blocks_copy(l, x, send, heads, w, 0);
    } else {
        head_blocks_copy(l, x, recv, heads, w, 0);
    }
    device_free(send), device_free(recv);
}

// key_start of this member's tokens -> those of the super rows (gathered over the inner group).
static int32_t *super_key_start(const A2aLayout *l, const int32_t *key_start) {
    if (!key_start) return NULL;
    size_t block = (size_t)l->B * 2 * l->C;
    int32_t *all = device_calloc((size_t)l->A * block, sizeof(int32_t));
    int32_t *super = device_calloc((size_t)l->A * block, sizeof(int32_t));
    comm_allgather_int32(l->inner, key_start, all, block);
    super_rows_copy(l, (char *)super, (char *)all, sizeof(int32_t), 1);
    device_free(all);
    return super;
}

// The ring's shape over the outer group: chunks of A·C tokens, heads/A.
static RingAttentionShape super_shape(const A2aLayout *l, const RingAttentionShape *s, const int32_t *key_start) {
    RingAttentionShape r = *s;
    r.C = l->A * s->C;
    r.heads = s->heads / l->A;
    r.kv_heads = s->kv_heads / l->A;
    r.head_first = s->head_first + l->inner->rank * r.heads;  // this member's head slice
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
    t->q = device_calloc(n * s->heads * s->head_dim, sizeof(real));
    t->k = device_calloc(n * s->kv_heads * s->head_dim, sizeof(real));
    t->v = device_calloc(n * s->kv_heads * v_width(s), sizeof(real));
    sequence_gather(l, q, t->q, s->heads, s->head_dim, s->bf16_kv);
    sequence_gather(l, k, t->k, s->kv_heads, s->head_dim, s->bf16_kv);
    sequence_gather(l, v, t->v, s->kv_heads, v_width(s), s->bf16_kv);
    t->key_start = super_key_start(l, s->key_start);
}

static void free_super(SuperTensors *t) {
    device_free(t->q), device_free(t->k), device_free(t->v), device_free(t->out), device_free(t->lse);
    device_free(t->dout), device_free(t->key_start);
}

void a2a_attention_forward(const Comm *inner, const Comm *outer, real *out, real *lse, const real *q,
                           const real *k, const real *v, const RingAttentionShape *s) {
    A2aLayout l = layout_of(inner, outer, s);
    SuperTensors t = {0};
    gather_qkv(&l, s, &t, q, k, v);
    RingAttentionShape rs = super_shape(&l, s, t.key_start);
    size_t n = tokens_of(&l);
    t.out = device_calloc(n * s->heads * v_width(s), sizeof(real));
    t.lse = device_calloc(n * s->heads, sizeof(real));
    ring_attention_forward(outer, t.out, t.lse, t.q, t.k, t.v, &rs);
    sequence_scatter(&l, t.out, out, s->heads, v_width(s), 0);
    real *super_rows = device_calloc(n * s->heads, sizeof(real)), *local_rows = device_calloc(n * s->heads, sizeof(real));
    batched_transpose(super_rows, t.lse, l.B, rs.heads, 2 * rs.C);  // (B, heads/A, 2AC) -> (B, 2AC, heads/A)
    sequence_scatter(&l, super_rows, local_rows, s->heads, 1, 0);
    batched_transpose(lse, local_rows, l.B, 2 * s->C, s->heads);  // (B, 2C, heads) -> (B, heads, 2C)
    device_free(super_rows), device_free(local_rows);
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
    t.out = device_calloc(n * s->heads * v_width(s), sizeof(real));
    t.dout = device_calloc(n * s->heads * v_width(s), sizeof(real));
    t.lse = device_calloc(n * s->heads, sizeof(real));
    sequence_gather(&l, out, t.out, s->heads, v_width(s), 0);  // read outside the GEMMs too (D = rowsum(dout ⊙ out))
    sequence_gather(&l, dout, t.dout, s->heads, v_width(s), 0);
    real *rows = device_calloc(n * s->heads, sizeof(real)), *super_rows = device_calloc(n * s->heads, sizeof(real));
    batched_transpose(rows, lse, l.B, s->heads, 2 * s->C);
    sequence_gather(&l, rows, super_rows, s->heads, 1, 0);
    batched_transpose(t.lse, super_rows, l.B, 2 * rs.C, rs.heads);
    device_free(rows), device_free(super_rows);
    real *sdq = device_calloc(n * s->heads * s->head_dim, sizeof(real));
    real *sdk = device_calloc(n * s->kv_heads * s->head_dim, sizeof(real));
    real *sdv = device_calloc(n * s->kv_heads * v_width(s), sizeof(real));
    ring_attention_backward(outer, sdq, sdk, sdv, t.dout, t.out, t.lse, t.q, t.k, t.v, &rs);
    sequence_scatter(&l, sdq, dq, s->heads, s->head_dim, 1);
    sequence_scatter(&l, sdk, dk, s->kv_heads, s->head_dim, 1);
    sequence_scatter(&l, sdv, dv, s->kv_heads, v_width(s), 1);
    device_free(sdq), device_free(sdk), device_free(sdv);
    free_super(&t);
}
