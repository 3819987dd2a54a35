// test_comm_mpi.c — the MPI collectives (src/parallel/comm*.c) on 2+ processes, run by
// tests/cli/test_mpi_comm.sh under mpirun -np 2, 3 and 4.
//
//   test_comm_mpi          every collective against a serial reference that each rank
//                          computes itself (each rank can make every rank's data):
//                          bit-identical sums in rank order, identical on every rank,
//                          sub-groups, Parallel Folding's groups, non-blocking overlap
//   test_comm_mpi die      rank 1 calls mt_die while the others wait in a barrier
//   test_comm_mpi badgroup ranks 0 and 1 name the ranks of one group in different orders
//
// Rank 0 prints "ok <check>_np<P>" when no rank failed; a failing rank prints
// "FAIL <check>_np<P>: [rank r] ...".
#include <stdarg.h>
#include <string.h>

#include "parallel/groups.h"

#include "mpi_check.h"

// ---- data every rank can compute for every rank ----------------------------------------------


// Values of mixed sign and magnitude, so a different summation order changes the bits.
static double value(int rank, size_t i, int salt) {
    uint64_t h = mix64(((uint64_t)salt << 48) ^ ((uint64_t)rank << 32) ^ i);
    double scale[] = {1e-3, 0.1, 1, 10, 1e3};
    return ((double)(h % 20001) - 10000.0) / 9999.0 * scale[(h >> 20) % 5];
}

static void fill(real *x, size_t n, int rank, int salt) {
    for (size_t i = 0; i < n; i++) x[i] = (real)value(rank, i, salt);
}

// The sum over `members` ranks (in that order) of their fill(salt): ((x_0 + x_1) + ...)
// in real, as comm.h promises.
static void serial_sum(real *out, size_t n, const int *members, int count, int salt, size_t offset) {
    for (size_t i = 0; i < n; i++) {
        real s = (real)value(members[0], offset + i, salt);
        for (int q = 1; q < count; q++) s += (real)value(members[q], offset + i, salt);
        out[i] = s;
    }
}

static int *identity_ranks(int n) {
    int *r = mt_malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) r[i] = i;
    return r;
}

static int same_bits(const real *a, const real *b, size_t n, size_t *where) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(real))) {
            *where = i;
            return 0;
        }
    return 1;
}

// ---- checks ------------------------------------------------------------------------------------

// All-reduce of lengths around the block split and past one chunk (4M elements).
static void check_allreduce(void) {
    begin("comm_allreduce_ordered");
    static const size_t lengths[] = {0, 1, 2, 3, 5, 1000, 4099, ((size_t)1 << 22) + 12345};
    int *members = identity_ranks(world.size);
    for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
        size_t n = lengths[l], where = 0;
        real *x = mt_malloc((n + 1) * sizeof(real)), *want = mt_malloc((n + 1) * sizeof(real));
        fill(x, n, world.rank, (int)l);
        serial_sum(want, n, members, world.size, (int)l, 0);
        comm_allreduce_sum(&world, x, n);
        expect(same_bits(x, want, n, &where), "n=%zu: element %zu is %.9g, the rank-order sum %.9g", n, where,
               (double)x[where], (double)want[where]);
        free(x);
        free(want);
    }
    free(members);
    end();
}

// The reference really depends on the order (else bit equality would prove little), and
// repeated all-reduces give the same bits on every rank.
static void check_repeatable(void) {
    begin("comm_allreduce_repeatable");
    size_t n = 20000, where = 0, differ = 0;
    real *x = mt_malloc(n * sizeof(real)), *first = mt_malloc(n * sizeof(real)), *root = mt_malloc(n * sizeof(real));
    int *reversed = mt_malloc((size_t)world.size * sizeof(int));
    for (int q = 0; q < world.size; q++) reversed[q] = world.size - 1 - q;
    serial_sum(root, n, reversed, world.size, 77, 0);
    for (int rep = 0; rep < 5; rep++) {
        fill(x, n, world.rank, 77);
        comm_allreduce_sum(&world, x, n);
        if (rep == 0) memcpy(first, x, n * sizeof(real));
        expect(same_bits(x, first, n, &where), "repeat %d differs at %zu", rep, where);
    }
    for (size_t i = 0; i < n; i++) differ += memcmp(&first[i], &root[i], sizeof(real)) != 0;
    expect(world.size == 2 || differ > 0, "summing in reverse rank order gave the same bits: the data is too tame");
    memcpy(root, first, n * sizeof(real));
    comm_bcast(&world, root, n * sizeof(real), 0);
    expect(same_bits(first, root, n, &where), "differs from rank 0 at element %zu", where);
    free(x);
    free(first);
    free(root);
    free(reversed);
    end();
}

// Rank r's element i for the maximum: mixed signs, and a zero every rank holds (a tie).
static real held(int rank, size_t i) { return i % 7 == 0 ? 0 : (real)value(rank, i, 9); }

// The elementwise maximum over the ranks (delayed scaling's amax agreement): every rank
// gets the largest of the values the ranks hold, with ties and negative values.
static void check_allreduce_max(void) {
    begin("comm_allreduce_max");
    size_t n = 5003;
    real *x = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = held(world.rank, i);
    comm_allreduce_max(&world, x, n);
    for (size_t i = 0; i < n; i++) {
        real want = held(0, i);
        for (int q = 1; q < world.size; q++) want = MT_MAX(want, held(q, i));
        expect(!memcmp(&x[i], &want, sizeof(real)), "element %zu: %.9g, the maximum %.9g", i, (double)x[i],
               (double)want);
    }
    free(x);
    end();
}

static void check_allreduce_types(void) {
    begin("comm_allreduce_double_int64");
    size_t n = 3001;
    double *d = mt_malloc(n * sizeof(double));
    int64_t *k = mt_malloc(n * sizeof(int64_t));
    for (size_t i = 0; i < n; i++) {
        d[i] = value(world.rank, i, 5) * 1e-7 + value(world.rank, i, 6);
        k[i] = ((int64_t)1 << 50) * (world.rank + 1) + (int64_t)i - world.rank;
    }
    comm_allreduce_sum_double(&world, d, n);
    comm_allreduce_sum_int64(&world, k, n);
    for (size_t i = 0; i < n; i++) {
        double s = value(0, i, 5) * 1e-7 + value(0, i, 6);
        int64_t t = ((int64_t)1 << 50) + (int64_t)i;
        for (int q = 1; q < world.size; q++) {
            s += value(q, i, 5) * 1e-7 + value(q, i, 6);
            t += ((int64_t)1 << 50) * (q + 1) + (int64_t)i - q;
        }
        expect(!memcmp(&d[i], &s, sizeof(s)), "double element %zu: %.17g vs %.17g", i, d[i], s);
        expect(k[i] == t, "int64 element %zu: %lld vs %lld", i, (long long)k[i], (long long)t);
    }
    free(d);
    free(k);
    end();
}

// Uneven counts (some zero) for the -v collectives: rank q's block has (q * 7 + salt) % 5 * 3.
static size_t *uneven(int salt) {
    size_t *c = mt_malloc((size_t)world.size * sizeof(size_t));
    for (int q = 0; q < world.size; q++) c[q] = (size_t)((q * 7 + salt) % 5) * 3;
    return c;
}

static size_t total(const size_t *c) {
    size_t t = 0;
    for (int q = 0; q < world.size; q++) t += c[q];
    return t;
}

static void check_reduce_scatter(void) {
    begin("comm_reduce_scatter");
    int *members = identity_ranks(world.size);
    size_t block = 1001, where = 0;
    real *send = mt_malloc(block * world.size * sizeof(real)), *recv = mt_malloc(block * sizeof(real));
    real *want = mt_malloc(block * world.size * sizeof(real));
    fill(send, block * world.size, world.rank, 11);
    serial_sum(want, block * world.size, members, world.size, 11, 0);
    comm_reduce_scatter(&world, send, recv, block);
    expect(same_bits(recv, want + block * world.rank, block, &where), "equal blocks: element %zu", where);
    for (int salt = 0; salt < 3; salt++) {
        size_t *counts = uneven(salt), at = 0;
        for (int q = 0; q < world.rank; q++) at += counts[q];
        fill(send, total(counts), world.rank, 20 + salt);
        serial_sum(want, counts[world.rank], members, world.size, 20 + salt, at);
        comm_reduce_scatter_v(&world, send, recv, counts);
        expect(same_bits(recv, want, counts[world.rank], &where), "counts salt %d: element %zu", salt, where);
        free(counts);
    }
    free(send);
    free(recv);
    free(want);
    free(members);
    end();
}

static void check_allgather(void) {
    begin("comm_allgather");
    size_t block = 513, *counts = uneven(1), all = total(counts), at = 0;
    real *send = mt_malloc((block + all) * sizeof(real)), *recv = mt_malloc((block * world.size + all) * sizeof(real));
    fill(send, block, world.rank, 30);
    comm_allgather(&world, send, recv, block);
    for (int q = 0; q < world.size; q++)
        for (size_t i = 0; i < block; i++) expect(recv[q * block + i] == (real)value(q, i, 30), "block %d element %zu", q, i);
    fill(send, counts[world.rank], world.rank, 31);
    comm_allgather_v(&world, send, recv, counts);
    for (int q = 0; q < world.size; at += counts[q++])
        for (size_t i = 0; i < counts[q]; i++) expect(recv[at + i] == (real)value(q, i, 31), "-v block %d element %zu", q, i);
    // In place: each rank's block already sits in recv.
    at = 0;
    for (int q = 0; q < world.rank; q++) at += counts[q];
    memset(recv, 0, all * sizeof(real));
    fill(recv + at, counts[world.rank], world.rank, 32);
    comm_allgather_v(&world, recv + at, recv, counts);
    at = 0;
    for (int q = 0; q < world.size; at += counts[q++])
        for (size_t i = 0; i < counts[q]; i++) expect(recv[at + i] == (real)value(q, i, 32), "in place block %d", q);
    free(send);
    free(recv);
    free(counts);
    end();
}

// comm_gather_v: root receives each rank's piece at the displacement it names; the pieces
// land in reverse rank order with gaps, so placement by displacement (not by rank) is
// checked; the rest of recv and every other rank's buffers stay untouched. Also the int64
// all-gather.
static void check_gather(void) {
    begin("comm_gather_v");
    enum { GAP = 2 };
    int P = world.size, root = P - 1;
    size_t *counts = uneven(3), *displs = mt_calloc((size_t)P, sizeof(size_t)), all = GAP;
    for (int q = P - 1; q >= 0; q--) displs[q] = all, all += counts[q] + GAP;
    real *send = mt_malloc((counts[world.rank] + 1) * sizeof(real)), *recv = mt_malloc(all * sizeof(real));
    fill(send, counts[world.rank], world.rank, 40);
    for (size_t i = 0; i < all; i++) recv[i] = -1;
    comm_gather_v(&world, send, counts[world.rank], recv, counts, displs, root);
    size_t untouched = 0;
    for (size_t i = 0; i < all; i++) untouched += recv[i] == -1;
    if (world.rank != root) expect(untouched == all, "a non-root rank's recv was written");
    for (int q = 0; world.rank == root && q < P; q++)
        for (size_t i = 0; i < counts[q]; i++)
            expect(recv[displs[q] + i] == (real)value(q, i, 40), "piece of rank %d element %zu", q, i);
    if (world.rank == root) expect(untouched == (size_t)GAP * (P + 1), "%zu gap elements kept", untouched);
    int64_t mine[2] = {world.rank, -((int64_t)world.rank << 40)}, every[8];
    comm_allgather_int64(&world, mine, every, 2);
    for (int q = 0; q < P; q++)
        expect(every[2 * q] == q && every[2 * q + 1] == -((int64_t)q << 40), "int64 block %d", q);
    free(send);
    free(recv);
    free(counts);
    free(displs);
    end();
}

// Rank p sends (p + 2q) % 4 * 5 + 1 elements to q, laid out with gaps of 3; value = 1000p + 100q + i.
static size_t a2a_count(int from, int to) { return (size_t)((from + 2 * to) % 4 * 5 + 1); }

static void check_alltoall(void) {
    begin("comm_alltoall");
    int P = world.size, me = world.rank;
    size_t block = 7;
    real *s = mt_malloc(block * P * sizeof(real)), *r = mt_malloc(block * P * sizeof(real));
    int32_t *si = mt_malloc(block * P * sizeof(int32_t)), *ri = mt_malloc(block * P * sizeof(int32_t));
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < block; i++) {
            s[q * block + i] = (real)(1000 * me + 100 * q + i);
            si[q * block + i] = -(1000 * me + 100 * q + (int)i);
        }
    comm_alltoall(&world, s, r, block);
    comm_alltoall_int32(&world, si, ri, block);
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < block; i++) {
            expect(r[q * block + i] == (real)(1000 * q + 100 * me + i), "real from %d element %zu", q, i);
            expect(ri[q * block + i] == -(1000 * q + 100 * me + (int)i), "int32 from %d element %zu", q, i);
        }
    size_t *sc = mt_malloc(4 * P * sizeof(size_t)), *sd = sc + P, *rc = sd + P, *rd = rc + P, sat = 2, rat = 5;
    for (int q = 0; q < P; q++) {
        sc[q] = a2a_count(me, q), sd[q] = sat, sat += sc[q] + 3;
        rc[q] = a2a_count(q, me), rd[q] = rat, rat += rc[q] + 3;
    }
    real *sv = mt_calloc(sat, sizeof(real)), *rv = mt_calloc(rat, sizeof(real));
    int32_t *svi = mt_calloc(sat, sizeof(int32_t)), *rvi = mt_calloc(rat, sizeof(int32_t));
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < sc[q]; i++) sv[sd[q] + i] = (real)(1000 * me + 100 * q + i), svi[sd[q] + i] = 7 * (int)i - me;
    comm_alltoall_v(&world, sv, sc, sd, rv, rc, rd);
    comm_alltoall_v_int32(&world, svi, sc, sd, rvi, rc, rd);
    for (int q = 0; q < P; q++) {
        for (size_t i = 0; i < rc[q]; i++) {
            expect(rv[rd[q] + i] == (real)(1000 * q + 100 * me + i), "-v real from %d element %zu", q, i);
            expect(rvi[rd[q] + i] == 7 * (int)i - q, "-v int32 from %d element %zu", q, i);
        }
        expect(rv[rd[q] - 1] == 0 && rvi[rd[q] - 1] == 0, "-v wrote into the gap before block %d", q);
    }
    // the non-blocking form, twice in flight at once with a blocking all-to-all between
    real *rv2 = mt_calloc(rat, sizeof(real)), *rv3 = mt_calloc(rat, sizeof(real));
    CommRequest first, second;
    comm_ialltoall_v(&world, sv, sc, sd, rv2, rc, rd, &first);
    comm_ialltoall_v(&world, sv, sc, sd, rv3, rc, rd, &second);
    comm_alltoall(&world, s, r, block);
    comm_wait(&second);
    comm_wait(&first);
    for (size_t i = 0; i < rat; i++)
        expect(rv2[i] == rv[i] && rv3[i] == rv[i], "non-blocking -v element %zu differs from the blocking one", i);
    free(rv2), free(rv3);
    free(s), free(r), free(si), free(ri), free(sc), free(sv), free(rv), free(svi), free(rvi);
    end();
}

static void check_bcast_barrier(void) {
    begin("comm_bcast_barrier");
    for (int root = 0; root < world.size; root++) {
        char buf[100];
        for (int i = 0; i < 100; i++) buf[i] = (char)(world.rank == root ? root * 3 + i : -1);
        comm_bcast(&world, buf, sizeof(buf), root);
        for (int i = 0; i < 100; i++) expect(buf[i] == (char)(root * 3 + i), "root %d byte %d", root, i);
        comm_barrier(&world);
    }
    end();
}

// Even and odd ranks; the world in reverse order (group rank i = world rank P-1-i, so
// sums run in that order); a group that ranks 2.. stay out of.
static void check_subgroups(void) {
    begin("comm_subgroups");
    int P = world.size, me = world.rank, members[4], n = 0;
    for (int q = me % 2; q < P; q += 2) members[n++] = q;
    Comm parity = comm_group(me % 2 ? "odd" : "even", members, n);
    expect(parity.size == n && members[parity.rank] == me, "parity group: rank %d of %d", parity.rank, parity.size);
    size_t len = 777, where = 0;
    real *x = mt_malloc(len * sizeof(real)), *want = mt_malloc(len * sizeof(real));
    fill(x, len, me, 40);
    serial_sum(want, len, members, n, 40, 0);
    comm_allreduce_sum(&parity, x, len);
    expect(same_bits(x, want, len, &where), "parity all-reduce element %zu", where);

    int reversed[4];
    for (int q = 0; q < P; q++) reversed[q] = P - 1 - q;
    Comm rev = comm_group("reversed", reversed, P);
    expect(rev.rank == P - 1 - me && rev.size == P, "reversed: rank %d", rev.rank);
    fill(x, len, me, 41);
    serial_sum(want, len, reversed, P, 41, 0);
    comm_allreduce_sum(&rev, x, len);
    expect(same_bits(x, want, len, &where), "reversed all-reduce element %zu", where);
    real mine = (real)me, gathered[4];
    comm_allgather(&rev, &mine, gathered, 1);
    for (int q = 0; q < P; q++) expect(gathered[q] == (real)(P - 1 - q), "reversed all-gather slot %d", q);

    static const int pair[2] = {0, 1};
    Comm first_two = comm_group("first_two", pair, 2);
    expect(me < 2 ? first_two.size == 2 && first_two.rank == me : first_two.size == 0 && first_two.rank == -1,
           "first_two: rank %d of %d", first_two.rank, first_two.size);
    if (me < 2) comm_barrier(&first_two);
    comm_free(&parity);
    comm_free(&rev);
    comm_free(&first_two);
    free(x);
    free(want);
    end();
}

// Parallel Folding's groups on this world: each Comm holds the ranks groups.c lists, and
// an all-reduce of the world ranks over it gives their sum.
static void check_parallel_groups(void) {
    begin("parallel_groups");
    Config c;
    config_defaults(&c);
    if (world.size % 2 == 0) c.tensor_model_parallel_size = 2;
    c.expert_model_parallel_size = world.size;
    ParallelGroups pg;
    parallel_groups_init(&pg, &c);
    for (int k = 0; k < PG_COUNT; k++) {
        int ranks[4], n = group_size(&pg.sizes, k);
        group_ranks(&pg.sizes, k, group_index_of(&pg.sizes, k, world.rank), ranks);
        int64_t sum = world.rank, want = 0;
        for (int i = 0; i < n; i++) want += ranks[i];
        comm_allreduce_sum_int64(&pg.comm[k], &sum, 1);
        expect(pg.comm[k].size == n && ranks[pg.comm[k].rank] == world.rank && sum == want,
               "%s: rank %d of %d, sum %lld want %lld", group_kind_name(k), pg.comm[k].rank, pg.comm[k].size,
               (long long)sum, (long long)want);
    }
    parallel_groups_free(&pg);
    end();
}

// Busy work between comm_test calls.
static double compute(double seed) {
    double acc = seed;
    for (int i = 0; i < 200000; i++) acc = acc * 0.9999999 + 1e-9 * i;
    return acc;
}

// Three non-blocking collectives in flight on the world and one on a sub-group, a blocking
// all-reduce issued in between, compute with comm_test in between, waits in another order.
static void check_nonblocking(void) {
    begin("comm_nonblocking_overlap");
    int P = world.size, me = world.rank, *members = identity_ranks(P);
    size_t n = 100003, block = 4099, where = 0;
    real *ar = mt_malloc(n * sizeof(real)), *ar_want = mt_malloc(n * sizeof(real));
    real *rs_send = mt_malloc(block * P * sizeof(real)), *rs = mt_malloc(block * sizeof(real));
    real *rs_want = mt_malloc(block * P * sizeof(real));
    real *ag_send = mt_malloc(block * sizeof(real)), *ag = mt_malloc(block * P * sizeof(real));
    real *blocking = mt_malloc(n * sizeof(real)), *blocking_want = mt_malloc(n * sizeof(real));
    real *sub = mt_malloc(n * sizeof(real)), *sub_want = mt_malloc(n * sizeof(real));
    fill(ar, n, me, 50);
    fill(rs_send, block * P, me, 51);
    fill(ag_send, block, me, 52);
    fill(blocking, n, me, 53);
    fill(sub, n, me, 54);
    serial_sum(ar_want, n, members, P, 50, 0);
    serial_sum(rs_want, block * P, members, P, 51, 0);
    serial_sum(blocking_want, n, members, P, 53, 0);
    int half[4], h = 0;
    for (int q = me < P / 2 ? 0 : P / 2; q < (me < P / 2 ? P / 2 : P); q++) half[h++] = q;
    serial_sum(sub_want, n, half, h, 54, 0);
    Comm halves = comm_group("half", half, h);

    CommRequest r_ar, r_rs, r_ag, r_sub;
    comm_iallreduce_sum(&world, ar, n, &r_ar);
    comm_ireduce_scatter(&world, rs_send, rs, block, &r_rs);
    comm_iallreduce_sum(&halves, sub, n, &r_sub);
    double acc = compute(me);
    comm_allreduce_sum(&world, blocking, n);
    comm_iallgather(&world, ag_send, ag, block, &r_ag);
    int polls = 0;
    while (!(comm_test(&r_ar) & comm_test(&r_rs) & comm_test(&r_sub)) && polls < 100000) {
        acc += compute(acc);
        polls++;
    }
    comm_wait(&r_ag);
    comm_wait(&r_sub);
    comm_wait(&r_rs);
    comm_wait(&r_ar);
    expect(acc == acc, "compute");
    expect(same_bits(ar, ar_want, n, &where), "all-reduce element %zu", where);
    expect(same_bits(rs, rs_want + block * me, block, &where), "reduce-scatter element %zu", where);
    expect(same_bits(blocking, blocking_want, n, &where), "blocking all-reduce between them, element %zu", where);
    expect(same_bits(sub, sub_want, n, &where), "half-group all-reduce element %zu", where);
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < block; i++) expect(ag[q * block + i] == (real)value(q, i, 52), "all-gather block %d", q);

    // Uneven -v variants, completed by comm_wait alone.
    size_t *counts = uneven(2), at = 0;
    for (int q = 0; q < me; q++) at += counts[q];
    fill(rs_send, total(counts), me, 55);
    serial_sum(rs_want, counts[me], members, P, 55, at);
    comm_ireduce_scatter_v(&world, rs_send, rs, counts, &r_rs);
    fill(ag + at, counts[me], me, 56);
    comm_iallgather_v(&world, ag + at, ag, counts, &r_ag);
    comm_wait(&r_rs);
    comm_wait(&r_ag);
    expect(same_bits(rs, rs_want, counts[me], &where), "reduce-scatter-v element %zu", where);
    at = 0;
    for (int q = 0; q < P; at += counts[q++])
        for (size_t i = 0; i < counts[q]; i++) expect(ag[at + i] == (real)value(q, i, 56), "all-gather-v block %d", q);
    comm_free(&halves);
    free(counts), free(members), free(ar), free(ar_want), free(rs_send), free(rs), free(rs_want), free(ag_send);
    free(ag), free(blocking), free(blocking_want), free(sub), free(sub_want);
    end();
}

// Point to point: every rank sends two messages of each tag to the next rank and one to the
// previous (a large one and small ones, posted in an order that differs from the receives'),
// while a non-blocking all-reduce on the same group is in flight: each lands by its tag, the
// two of one tag in the order they were sent.
static void check_point_to_point(void) {
    begin("comm_point_to_point");
    int P = world.size, me = world.rank, next = (me + 1) % P, prev = (me + P - 1) % P;
    size_t big = 300007, small = 17, where = 0;
    real *ar = mt_malloc(big * sizeof(real)), *ar_want = mt_malloc(big * sizeof(real));
    int *members = identity_ranks(P);
    fill(ar, big, me, 60);
    serial_sum(ar_want, big, members, P, 60, 0);
    real *out_big = mt_malloc(big * sizeof(real)), *in_big = mt_malloc(big * sizeof(real));
    real out_small[2][17], in_small[2][17], out_back[17], in_back[17];
    fill(out_big, big, me, 61);
    for (int i = 0; i < 2; i++) fill(out_small[i], small, me, 62 + i);
    fill(out_back, small, me, 64);
    CommRequest ar_req, sends[4], recvs[4];
    comm_iallreduce_sum(&world, ar, big, &ar_req);
    comm_isend(&world, out_small[0], small, next, 7, &sends[0]);
    comm_isend(&world, out_big, big, next, 3, &sends[1]);
    comm_isend(&world, out_small[1], small, next, 7, &sends[2]);
    comm_isend(&world, out_back, small, prev, COMM_MAX_TAG - 1, &sends[3]);
    comm_irecv(&world, in_back, small, next, COMM_MAX_TAG - 1, &recvs[0]);
    comm_irecv(&world, in_big, big, prev, 3, &recvs[1]);
    comm_irecv(&world, in_small[0], small, prev, 7, &recvs[2]);
    comm_irecv(&world, in_small[1], small, prev, 7, &recvs[3]);
    for (int i = 3; i >= 0; i--) comm_wait(&recvs[i]);
    for (int i = 0; i < 4; i++) comm_wait(&sends[i]);
    comm_wait(&ar_req);
    for (size_t i = 0; i < big; i++) expect(in_big[i] == (real)value(prev, i, 61), "large message element %zu", i);
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < small; i++)
            expect(in_small[k][i] == (real)value(prev, i, 62 + k), "message %d of tag 7, element %zu", k, i);
    for (size_t i = 0; i < small; i++) expect(in_back[i] == (real)value(next, i, 64), "backward message element %zu", i);
    expect(same_bits(ar, ar_want, big, &where), "all-reduce in flight with them, element %zu", where);
    free(ar), free(ar_want), free(members), free(out_big), free(in_big);
    end();
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_world_init(&argc, &argv);
    world = comm_world();
    const char *mode = argc > 1 ? argv[1] : "all";
    if (world.size < 2 || world.size > 4) mt_die("run under mpirun -np 2, 3 or 4 (this world has %d)", world.size);
    if (!strcmp(mode, "die")) {
        if (world.rank == 1) mt_die("deliberate failure on rank 1 (test)");
        comm_barrier(&world);  // never returns: rank 1 is gone
        printf("FAIL die_np%d: [rank %d] passed a barrier without rank 1\n", world.size, world.rank);
    } else if (!strcmp(mode, "badgroup")) {
        int pair[2] = {world.rank == 1 ? 1 : 0, world.rank == 1 ? 0 : 1};
        comm_group("bad", pair, 2);  // rank 1 names the group (1, 0), rank 0 (0, 1): rank 1 dies
        comm_barrier(&world);
        printf("FAIL badgroup_np%d: [rank %d] formed a group its members disagree on\n", world.size, world.rank);
    } else {
        int ok = 1;
        void (*checks[])(void) = {check_allreduce, check_repeatable, check_allreduce_types, check_allreduce_max,
                                  check_reduce_scatter,
                                  check_allgather, check_gather, check_alltoall, check_bcast_barrier, check_subgroups,
                                  check_parallel_groups, check_nonblocking, check_point_to_point};
        for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
            checks[i]();
            ok &= check_failures == 0;
        }
        comm_world_finalize();
        return ok ? 0 : 1;
    }
    comm_world_finalize();
    return 1;
}
