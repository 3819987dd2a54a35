// test_cp_attention.c — attention over a context-parallel group (model/cp_attention.h) by
// every --cp-comm-type, under mpirun on 2 and 4 processes. Every rank builds the same
// whole-sequence q, k, v and dout (fixed seed), computes the reference with one
// attention_forward / attention_backward over the whole sequence, runs cp_attention_forward
// (twice: reruns must agree bit for bit) and _backward on its two chunks (r and 2·P−1−r)
// with the world as the CP group — p2p, allgather, a2a where the heads split over the
// world, and on 4 ranks a2a+p2p with inner groups {0,1}, {2,3} — and compares out, lse, dq,
// dk and dv of its chunks, |got − want| ≤ tol·(1 + |want|). Checks are named
// <type>_<case>_<precision>. Built in double (tol 1e-10) and in float (1e-5: the blocks
// are summed in another order than the one-pass kernel, in 24 bits). Also checks
// comm_sendrecv and its bytes.
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "model/cp_attention.h"
#include "mpi_check.h"

#ifdef MT_DOUBLE
#define RING_TOL 1e-10
#define PRECISION "double"
#else
#define RING_TOL 1e-5
#define PRECISION "float"
#endif

// Begins check `<what>_<precision>`: the two builds' lines apart.
static void begin_named(const char *what) {
    static char name[96];
    snprintf(name, sizeof(name), "%s_%s", what, PRECISION);
    begin(name);
}

typedef struct {
    const char *name;
    int B, T, heads, kv_heads, head_dim, v_head_dim;
    int documents;  // 1: packed documents, starting every `doc_every`-ish token
} Case;

static const Case CASES[] = {
    {"causal", 2, 24, 2, 2, 4, 4, 0},
    {"gqa_narrow_values_documents", 2, 24, 4, 2, 4, 6, 1},
    {"mqa_documents", 2, 48, 4, 1, 8, 3, 1},
    {"long_chunks_documents", 2, 560, 4, 2, 8, 5, 1},
    {"wide_heads_documents", 2, 48, 8, 4, 4, 3, 1},  // a2a on 4 ranks
};

static real *normal(Rng *rng, size_t n) {
    real *x = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)rng_normal(rng);
    return x;
}

// Documents at random positions (about one token in 7 starts one), so they cross chunks.
static int32_t *random_documents(Rng *rng, int B, int T) {
    int32_t *key_start = mt_malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0; t < T; t++) {
            if (t > 0 && rng_below(rng, 7) == 0) start = t;
            key_start[(size_t)b * T + t] = start;
        }
    return key_start;
}

// Rows [chunk·C, chunk·C + C) of each of `outer` runs of T rows of row_bytes, into the
// local tensor's slot `slot` (runs of 2·C rows).
static void take_chunk(void *local, const void *whole, int outer, int T, int C, size_t row_bytes, int chunk, int slot) {
    for (int o = 0; o < outer; o++)
        memcpy((char *)local + ((size_t)o * 2 * C + (size_t)slot * C) * row_bytes,
               (const char *)whole + ((size_t)o * T + (size_t)chunk * C) * row_bytes, (size_t)C * row_bytes);
}

// This rank's two chunks of a whole-sequence tensor, (outer, 2C, width).
static void *local_of(const void *whole, int outer, int T, int C, size_t row_bytes) {
    void *local = mt_malloc((size_t)outer * 2 * C * row_bytes);
    int chunks[2] = {world.rank, 2 * world.size - 1 - world.rank};
    for (int slot = 0; slot < 2; slot++) take_chunk(local, whole, outer, T, C, row_bytes, chunks[slot], slot);
    return local;
}

static void expect_close(const char *what, const real *got, const real *want, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n && bad < 1; i++) {
        int same_inf = isinf(want[i]) && got[i] == want[i];
        if (!same_inf && !(fabs(got[i] - want[i]) <= RING_TOL * (1 + fabs(want[i])))) {
            expect(0, "%s[%zu]: got %.17g expected %.17g", what, i, (double)got[i], (double)want[i]);
            bad++;
        }
    }
}

// Runs cp_attention_forward twice (the reruns must agree bit for bit) and backward once.
static void run_group_attention(const CpAttention *g, real *out, real *lse, real *dq, real *dk, real *dv,
                                const real *dout, const real *q, const real *k, const real *v,
                                const RingAttentionShape *s, size_t out_elems, size_t lse_elems) {
    cp_attention_forward(g, out, lse, q, k, v, s);
    real *again = mt_malloc(out_elems * sizeof(real)), *again_lse = mt_malloc(lse_elems * sizeof(real));
    cp_attention_forward(g, again, again_lse, q, k, v, s);
    expect(!memcmp(again, out, out_elems * sizeof(real)) && !memcmp(again_lse, lse, lse_elems * sizeof(real)),
           "a rerun of forward differs");
    free(again), free(again_lse);
    cp_attention_backward(g, dq, dk, dv, dout, out, lse, q, k, v, s);
}

static void run_case(const Case *c, const CpAttention *g, uint64_t seed) {
    int P = world.size, C = c->T / (2 * P), B = c->B, T = c->T;
    int qw = c->heads * c->head_dim, kw = c->kv_heads * c->head_dim, vw = c->kv_heads * c->v_head_dim;
    int ow = c->heads * c->v_head_dim;
    size_t tokens = (size_t)B * T, rs = sizeof(real);
    Rng rng;
    rng_seed(&rng, seed);
    real *q = normal(&rng, tokens * qw), *k = normal(&rng, tokens * kw), *v = normal(&rng, tokens * vw);
    real *dout = normal(&rng, tokens * ow);
    int32_t *key_start = c->documents ? random_documents(&rng, B, T) : NULL;
    real *out = mt_malloc(tokens * ow * rs), *lse = mt_malloc(tokens * c->heads * rs);
    real *dq = mt_calloc(tokens * qw, rs), *dk = mt_calloc(tokens * kw, rs), *dv = mt_calloc(tokens * vw, rs);
    AttentionShape whole = {.B = B, .Tq = T, .Tk = T, .heads = c->heads, .kv_heads = c->kv_heads,
                            .head_dim = c->head_dim, .v_head_dim = c->v_head_dim, .kv_row_stride = T,
                            .scale = 1 / sqrt((double)c->head_dim), .key_start = key_start};
    attention_forward(out, lse, q, k, v, &whole);
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &whole);

    real *lq = local_of(q, B, T, C, qw * rs), *lk = local_of(k, B, T, C, kw * rs), *lv = local_of(v, B, T, C, vw * rs);
    real *ldout = local_of(dout, B, T, C, ow * rs);
    int32_t *lks = key_start ? local_of(key_start, B, T, C, sizeof(int32_t)) : NULL;
    size_t local = (size_t)B * 2 * C;
    real *rout = mt_malloc(local * ow * rs), *rlse = mt_malloc(local * c->heads * rs);
    real *rdq = mt_calloc(local * qw, rs), *rdk = mt_calloc(local * kw, rs), *rdv = mt_calloc(local * vw, rs);
    RingAttentionShape s = {.B = B, .C = C, .heads = c->heads, .kv_heads = c->kv_heads, .head_dim = c->head_dim,
                            .v_head_dim = c->v_head_dim, .scale = whole.scale, .key_start = lks};
    run_group_attention(g, rout, rlse, rdq, rdk, rdv, ldout, lq, lk, lv, &s, local * ow, local * c->heads);

    real *want_out = local_of(out, B, T, C, ow * rs), *want_lse = local_of(lse, B * c->heads, T, C, rs);
    real *want_dq = local_of(dq, B, T, C, qw * rs), *want_dk = local_of(dk, B, T, C, kw * rs);
    real *want_dv = local_of(dv, B, T, C, vw * rs);
    expect_close("out", rout, want_out, local * ow);
    expect_close("lse", rlse, want_lse, local * c->heads);
    expect_close("dq", rdq, want_dq, local * qw);
    expect_close("dk", rdk, want_dk, local * kw);
    expect_close("dv", rdv, want_dv, local * vw);
    free(q), free(k), free(v), free(dout), free(key_start), free(out), free(lse), free(dq), free(dk), free(dv);
    free(lq), free(lk), free(lv), free(ldout), free(lks), free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
    free(want_out), free(want_lse), free(want_dq), free(want_dk), free(want_dv);
}

// comm_sendrecv / comm_isendrecv: rank r receives rank r−1's values, n·es bytes counted.
static void check_ring_shift(void) {
    enum { N = 1000 };
    begin_named("ring_shift");
    int P = world.size, prev = (world.rank - 1 + P) % P;
    real send[N], recv[N];
    for (int i = 0; i < N; i++) send[i] = (real)(world.rank * N + i);
    comm_bytes_reset();
    comm_sendrecv(&world, send, recv, N);
    for (int i = 0; i < N; i++) expect(recv[i] == (real)(prev * N + i), "blocking: recv[%d] = %g", i, (double)recv[i]);
    CommRequest req;
    memset(recv, 0, sizeof(recv));
    comm_isendrecv(&world, send, recv, N, &req);
    comm_wait(&req);
    for (int i = 0; i < N; i++) expect(recv[i] == (real)(prev * N + i), "non-blocking: recv[%d] = %g", i, (double)recv[i]);
    uint64_t bytes = comm_bytes_take("world");
    expect(bytes == 2 * N * sizeof(real), "bytes sent %llu, expected %zu", (unsigned long long)bytes, 2 * N * sizeof(real));
    Comm self = comm_self("self");
    comm_sendrecv(&self, send, recv, N);
    expect(memcmp(send, recv, sizeof(send)) == 0, "a group of one copies");
    end();
}

// Whether a case's heads split over an all-to-all of `size` ranks.
static int heads_split(const Case *c, int size) { return c->heads % size == 0 && c->kv_heads % size == 0; }

// Every comm type the case and the world allow, over the world as the CP group; a2a+p2p
// on 4 ranks with inner groups {0,1}, {2,3} and rings {0,2}, {1,3}.
static void run_every_type(const Case *c, uint64_t seed, const Comm *inner, const Comm *outer) {
    CpAttention types[] = {{CP_COMM_P2P, &world, NULL, NULL}, {CP_COMM_ALLGATHER, &world, NULL, NULL},
                           {CP_COMM_A2A, &world, NULL, NULL}, {CP_COMM_A2A_P2P, &world, inner, outer}};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        CpAttention *g = &types[t];
        if (g->type == CP_COMM_A2A && !heads_split(c, world.size)) continue;
        if (g->type == CP_COMM_A2A_P2P && (!inner || !heads_split(c, inner->size))) continue;
        char name[64];
        snprintf(name, sizeof(name), "%s_%s", CP_COMM_TYPE_NAMES[g->type], c->name);
        begin_named(name);
        run_case(c, g, seed);
        end();
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_world_init(&argc, &argv);
    world = comm_world();
    if (world.size < 2) mt_die("run under mpirun -np 2 or 4 (this world has %d)", world.size);
    check_ring_shift();
    Comm inner = {0}, outer = {0};
    int hierarchical = world.size == 4;
    if (hierarchical) {
        int r = world.rank, inner_ranks[2] = {r / 2 * 2, r / 2 * 2 + 1}, outer_ranks[2] = {r % 2, r % 2 + 2};
        inner = comm_group("cp_inner", inner_ranks, 2);
        outer = comm_group("cp_outer", outer_ranks, 2);
    }
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        if (CASES[i].T % (2 * world.size)) continue;
        run_every_type(&CASES[i], 60 + i, hierarchical ? &inner : NULL, hierarchical ? &outer : NULL);
    }
    if (hierarchical) comm_free(&inner), comm_free(&outer);
    int ok = failed_checks == 0;
    comm_world_finalize();
    return ok ? 0 : 1;
}
