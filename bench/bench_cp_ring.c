// bench_cp_ring.c — how much of ring attention's K/V transfer is hidden behind its compute
// (--cp-comm-type p2p). Under mpirun -np P: one sequence of T tokens (argv[1], default
// 32768) split over the world as the CP group, `heads` heads (GQA kv heads) of width d;
// each rank runs ring_attention_forward and _backward REPS times and reports, averaged
// over ranks: the time of one K/V shift alone (blocking comm_sendrecv of the same block),
// the compute of the blocks, the wait for shifts still in flight after their step's compute
// (cp_ring_take_times), and the hidden fraction 1 − wait / (shifts × shift time).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/rng.h"
#include "core/timer.h"
#include "model/cp_attention.h"

enum { REPS = 3, HEADS = 4, KV_HEADS = 2, HEAD_DIM = 32 };

static real *normal(Rng *rng, size_t n) {
    real *x = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)rng_normal(rng);
    return x;
}

// Mean over the world's ranks.
static double world_mean(const Comm *world, double x) {
    comm_allreduce_sum_double(world, &x, 1);
    return x / world->size;
}

int main(int argc, char **argv) {
    comm_world_init(&argc, &argv);
    Comm world = comm_world();
    int T = argc > 1 ? atoi(argv[1]) : 32768, P = world.size, C = T / (2 * P);
    if (P < 2 || T % (2 * P)) mt_die("run under mpirun -np P (2+) with a length divisible by 2·P");
    size_t local = (size_t)2 * C, kw = KV_HEADS * HEAD_DIM, qw = HEADS * HEAD_DIM;
    Rng rng;
    rng_seed(&rng, 1 + world.rank);
    real *q = normal(&rng, local * qw), *k = normal(&rng, local * kw), *v = normal(&rng, local * kw);
    real *dout = normal(&rng, local * qw), *out = mt_malloc(local * qw * sizeof(real));
    real *lse = mt_malloc(local * HEADS * sizeof(real));
    real *dq = mt_calloc(local * qw, sizeof(real)), *dk = mt_calloc(local * kw, sizeof(real));
    real *dv = mt_calloc(local * kw, sizeof(real));
    RingAttentionShape s = {.B = 1, .C = C, .heads = HEADS, .kv_heads = KV_HEADS, .head_dim = HEAD_DIM,
                            .scale = (real)(1 / sqrt((double)HEAD_DIM))};
    // one K/V shift alone: the packed k and v of a rank's block
    size_t n = 2 * local * kw;
    real *send = mt_calloc(n, sizeof(real)), *recv = mt_malloc(n * sizeof(real));
    comm_sendrecv(&world, send, recv, n);  // warm-up
    double t0 = now_seconds();
    for (int r = 0; r < REPS; r++) comm_sendrecv(&world, send, recv, n);
    double shift_s = world_mean(&world, (now_seconds() - t0) / REPS);
    const char *phase[2] = {"forward", "backward"};
    if (world.rank == 0)
        printf("ring attention: T %d on CP=%d (chunks of %d), %d heads (%d kv) of %d; one K/V shift alone %.2f ms "
               "(%.1f MiB)\n", T, P, C, HEADS, KV_HEADS, HEAD_DIM, 1e3 * shift_s, n * sizeof(real) / 1048576.0);
    for (int backward = 0; backward < 2; backward++) {
        cp_ring_take_times();
        for (int r = 0; r < REPS; r++) {
            if (backward) ring_attention_backward(&world, dq, dk, dv, dout, out, lse, q, k, v, &s);
            else ring_attention_forward(&world, out, lse, q, k, v, &s);
        }
        CpRingTimes t = cp_ring_take_times();
        double compute = world_mean(&world, t.compute_s / REPS), wait = world_mean(&world, t.kv_wait_s / REPS);
        double dkdv = world_mean(&world, t.dkdv_s / REPS), transfer = (double)t.kv_shifts / REPS * shift_s;
        double hidden = transfer > 0 ? 1 - wait / transfer : 1;
        if (world.rank == 0)
            printf("%s: compute %.1f ms, K/V shifts %.1f ms alone, waited %.1f ms: %.0f%% hidden\n", phase[backward],
                   1e3 * compute, 1e3 * transfer, 1e3 * wait, 100 * (hidden < 0 ? 0 : hidden));
        if (world.rank == 0 && backward) printf("backward: dK/dV shifts (blocking, not overlapped) %.1f ms\n", 1e3 * dkdv);
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(send), free(recv);
    comm_free(&world);
    comm_world_finalize();
    return 0;
}
