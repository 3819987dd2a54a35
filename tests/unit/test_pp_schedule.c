// test_pp_schedule.c — the order of forward and backward passes of each pipeline rank
// (src/train/pp_schedule.c) against Megatron-Core 0.16.1's, for a table of (pp, chunks,
// micro-batches, group); the refusals; the micro-batch order within each chunk.
//
// GOLDEN was printed by this script (python3 with megatron-core installed): each order is
// Megatron's convert_schedule_table_to_order: "c" a forward of chunk c − 1, "−c" a backward
// of chunk c − 1.
//
// from types import SimpleNamespace as NS
// from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table
// from megatron.core.transformer.cuda_graphs import convert_schedule_table_to_order
// CASES = [  # pp, chunks, micro-batches, group (None: pp)
//     (1, 1, 4, None), (2, 1, 1, None), (2, 1, 3, None), (2, 1, 4, None), (4, 1, 3, None), (4, 1, 8, None),
//     (2, 2, 2, None), (2, 2, 4, None), (2, 2, 5, 3), (4, 2, 8, None), (2, 3, 6, None), (4, 2, 4, None),
//     (2, 2, 6, 4), (3, 2, 7, 4)]
// for pp, v, m, g in CASES:
//     group = g or pp
//     for r in range(pp):
//         comm = NS(pp_group=NS(size=lambda: pp, rank=lambda: r),
//                   virtual_pipeline_model_parallel_size=v if v > 1 else None)
//         _, _, warmup, _ = get_pp_rank_microbatches(m, v, group, p2p_communicator=comm)
//         order = convert_schedule_table_to_order(warmup, v, get_schedule_table(m, v, group))
//         print('    {%d, %d, %d, %d, %d, "%s"},' % (pp, v, m, g or 0, r, " ".join(map(str, order))))
#include <string.h>

#include "testlib.h"
#include "train/pp_schedule.h"

typedef struct {
    int pp, chunks, micro_batches, group, rank;
    const char *order;
} Case;

static const Case GOLDEN[] = {
    {1, 1, 4, 0, 0, "1 -1 1 -1 1 -1 1 -1"},
    {2, 1, 1, 0, 0, "1 -1"},
    {2, 1, 1, 0, 1, "1 -1"},
    {2, 1, 3, 0, 0, "1 1 -1 1 -1 -1"},
    {2, 1, 3, 0, 1, "1 -1 1 -1 1 -1"},
    {2, 1, 4, 0, 0, "1 1 -1 1 -1 1 -1 -1"},
    {2, 1, 4, 0, 1, "1 -1 1 -1 1 -1 1 -1"},
    {4, 1, 3, 0, 0, "1 1 1 -1 -1 -1"},
    {4, 1, 3, 0, 1, "1 1 1 -1 -1 -1"},
    {4, 1, 3, 0, 2, "1 1 -1 1 -1 -1"},
    {4, 1, 3, 0, 3, "1 -1 1 -1 1 -1"},
    {4, 1, 8, 0, 0, "1 1 1 1 -1 1 -1 1 -1 1 -1 1 -1 -1 -1 -1"},
    {4, 1, 8, 0, 1, "1 1 1 -1 1 -1 1 -1 1 -1 1 -1 1 -1 -1 -1"},
    {4, 1, 8, 0, 2, "1 1 -1 1 -1 1 -1 1 -1 1 -1 1 -1 1 -1 -1"},
    {4, 1, 8, 0, 3, "1 -1 1 -1 1 -1 1 -1 1 -1 1 -1 1 -1 1 -1"},
    {2, 2, 2, 0, 0, "1 1 2 2 -2 -2 -1 -1"},
    {2, 2, 2, 0, 1, "1 1 2 -2 2 -2 -1 -1"},
    {2, 2, 4, 0, 0, "1 1 2 2 1 -2 1 -2 2 -1 2 -1 -2 -2 -1 -1"},
    {2, 2, 4, 0, 1, "1 1 2 -2 2 -2 1 -1 1 -1 2 -2 2 -2 -1 -1"},
    {2, 2, 5, 3, 0, "1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1"},
    {2, 2, 5, 3, 1, "1 1 1 2 -2 2 -2 2 -2 1 -1 1 -1 2 -1 2 -2 -2 -1 -1"},
    {4, 2, 8, 0, 0, "1 1 1 1 2 2 2 2 1 1 1 -2 1 -2 2 -2 2 -2 2 -1 2 -1 -1 -1 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 1, "1 1 1 1 2 2 2 2 1 -2 1 -2 1 -2 1 -2 2 -1 2 -1 2 -1 2 -1 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 2, "1 1 1 1 2 2 2 -2 2 -2 1 -2 1 -2 1 -1 1 -1 2 -1 2 -1 2 -2 2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 3, "1 1 1 1 2 -2 2 -2 2 -2 2 -2 1 -1 1 -1 1 -1 1 -1 2 -2 2 -2 2 -2 2 -2 -1 -1 -1 -1"},
    {2, 3, 6, 0, 0, "1 1 2 2 3 3 1 -3 1 -3 2 -2 2 -2 3 -1 3 -1 1 -3 1 -3 2 -2 2 -2 3 -1 3 -1 -3 -3 -2 -2 -1 -1"},
    {2, 3, 6, 0, 1, "1 1 2 2 3 -3 3 -3 1 -2 1 -2 2 -1 2 -1 3 -3 3 -3 1 -2 1 -2 2 -1 2 -1 3 -3 3 -3 -2 -2 -1 -1"},
    {4, 2, 4, 0, 0, "1 1 1 1 2 2 2 2 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 4, 0, 1, "1 1 1 1 2 2 2 2 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 4, 0, 2, "1 1 1 1 2 2 2 -2 2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 4, 0, 3, "1 1 1 1 2 -2 2 -2 2 -2 2 -2 -1 -1 -1 -1"},
    {2, 2, 6, 4, 0, "1 1 1 1 2 2 2 -2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -1 -2 -2 -1 -1"},
    {2, 2, 6, 4, 1, "1 1 1 1 2 -2 2 -2 2 -2 2 -2 1 -1 1 -1 2 -1 2 -1 -2 -2 -1 -1"},
    {3, 2, 7, 4, 0, "1 1 1 1 2 2 2 2 1 -2 1 -2 1 -2 2 -2 2 -1 2 -1 -1 -1 -2 -2 -2 -1 -1 -1"},
    {3, 2, 7, 4, 1, "1 1 1 1 2 2 2 -2 2 -2 1 -2 1 -2 1 -1 2 -1 2 -1 2 -1 -2 -2 -2 -1 -1 -1"},
    {3, 2, 7, 4, 2, "1 1 1 1 2 -2 2 -2 2 -2 2 -2 1 -1 1 -1 1 -1 2 -1 2 -2 2 -2 -2 -1 -1 -1"},
};
#define CASES ((int)(sizeof(GOLDEN) / sizeof(GOLDEN[0])))

// The combined 1F1B schedule (--overlap-moe-expert-parallel-comm), printed by the script
// above with CASES = [(2, 2, 4, None), (4, 2, 8, None), (2, 3, 6, None), (2, 2, 2, None)], the
// virtual size always v and overlap_moe_expert_parallel_comm=True passed to
// get_pp_rank_microbatches.
static const Case GOLDEN_COMBINED[] = {
    {2, 2, 4, 0, 0, "1 1 2 2 1 1 -2 2 -2 2 -1 -1 -2 -2 -1 -1"},
    {2, 2, 4, 0, 1, "1 1 2 2 -2 1 -2 1 -1 2 -1 2 -2 -2 -1 -1"},
    {4, 2, 8, 0, 0, "1 1 1 1 2 2 2 2 1 1 1 1 -2 2 -2 2 -2 2 -2 2 -1 -1 -1 -1 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 1, "1 1 1 1 2 2 2 2 1 1 -2 1 -2 1 -2 2 -2 2 -1 2 -1 2 -1 -1 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 2, "1 1 1 1 2 2 2 2 -2 1 -2 1 -2 1 -2 1 -1 2 -1 2 -1 2 -1 2 -2 -2 -2 -2 -1 -1 -1 -1"},
    {4, 2, 8, 0, 3, "1 1 1 1 2 2 -2 2 -2 2 -2 1 -2 1 -1 1 -1 1 -1 2 -1 2 -2 2 -2 2 -2 -2 -1 -1 -1 -1"},
    {2, 3, 6, 0, 0, "1 1 2 2 3 3 1 1 -3 2 -3 2 -2 3 -2 3 -1 1 -1 1 -3 2 -3 2 -2 3 -2 3 -1 -1 -3 -3 -2 -2 -1 -1"},
    {2, 3, 6, 0, 1, "1 1 2 2 3 3 -3 1 -3 1 -2 2 -2 2 -1 3 -1 3 -3 1 -3 1 -2 2 -2 2 -1 3 -1 3 -3 -3 -2 -2 -1 -1"},
    {2, 2, 2, 0, 0, "1 1 2 2 -2 -2 -1 -1"},
    {2, 2, 2, 0, 1, "1 1 2 2 -2 -2 -1 -1"},
};
#define COMBINED_CASES ((int)(sizeof(GOLDEN_COMBINED) / sizeof(GOLDEN_COMBINED[0])))

// The schedule written as Megatron's order list.
static void order_of(const PpSchedule *s, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < s->n && at < n; i++) {
        const PpStep *st = &s->steps[i];
        int code = st->kind == PP_FORWARD ? st->chunk + 1 : -(st->chunk + 1);
        at += (size_t)snprintf(out + at, n - at, i ? " %d" : "%d", code);
    }
}

// Each case's schedule (combined or not) has Megatron's order; in a combined one each
// pair that runs together is a forward and the backward after it, of another micro-batch.
static void check_orders(const Case *cases, int n, int combined) {
    for (int c = 0; c < n; c++) {
        const Case *g = &cases[c];
        PpSchedule s;
        char err[512], got[4096];
        int refused = pp_schedule_make(&s, g->pp, g->rank, g->chunks, g->micro_batches, g->group, combined, err,
                                       sizeof(err));
        CHECK(!refused, "pp %d v %d m %d refused: %s", g->pp, g->chunks, g->micro_batches, err);
        if (refused) continue;
        order_of(&s, got, sizeof(got));
        CHECK(strcmp(got, g->order) == 0, "%s pp %d v %d m %d group %d rank %d:\n got      %s\n megatron %s",
              combined ? "combined" : "", g->pp, g->chunks, g->micro_batches, g->group, g->rank, got, g->order);
        for (int i = 0; i < s.n; i++)
            if (pp_schedule_pair_at(&s, i))
                CHECK(s.steps[i].kind == PP_FORWARD && s.steps[i + 1].kind == PP_BACKWARD &&
                          (s.steps[i].micro_batch != s.steps[i + 1].micro_batch ||
                           s.steps[i].chunk != s.steps[i + 1].chunk),
                      "step %d is not a forward paired with another micro-batch's backward", i);
        pp_schedule_free(&s);
    }
}

static void test_orders_match_megatron(void) { check_orders(GOLDEN, CASES, 0); }
static void test_combined_orders_match_megatron(void) { check_orders(GOLDEN_COMBINED, COMBINED_CASES, 1); }

// Without a pipeline the combined schedule is Megatron's combined_1f1b_schedule_for_no_pipelining:
// the first forward alone, then each backward together with the next forward, the last
// backward alone; 1F1B with one chunk is refused (Megatron asks for virtual stages).
static void test_combined_without_pipeline(void) {
    PpSchedule s;
    char err[512], got[256];
    CHECK(pp_schedule_make(&s, 1, 0, 1, 4, 0, 1, err, sizeof(err)) == 0, "refused: %s", err);
    order_of(&s, got, sizeof(got));
    CHECK(strcmp(got, "1 1 -1 1 -1 1 -1 -1") == 0, "got %s", got);
    int pairs = 0;
    for (int i = 0; i < s.n; i++) pairs += pp_schedule_pair_at(&s, i);
    CHECK(pairs == 3, "%d pairs run together, not 3", pairs);
    pp_schedule_free(&s);
    CHECK(pp_schedule_make(&s, 2, 0, 1, 4, 0, 1, err, sizeof(err)) == 1 && strstr(err, "virtual pipeline stages"),
          "PP 2 without virtual stages: %s", err);
}

// Every (micro-batch, chunk) runs forward once and backward once, after its forward; per
// chunk both visit the micro-batches in increasing order; in_flight is the most forwarded
// and not yet backwarded micro-batches of the chunk.
static void test_each_micro_batch_once_in_order(void) {
    for (int c = 0; c < CASES; c++) {
        const Case *g = &GOLDEN[c];
        PpSchedule s;
        char err[512];
        if (pp_schedule_make(&s, g->pp, g->rank, g->chunks, g->micro_batches, g->group, 0, err, sizeof(err))) continue;
        int next_forward[8] = {0}, next_backward[8] = {0}, now[8] = {0}, most[8] = {0};
        CHECK(s.n == 2 * g->micro_batches * g->chunks, "%d steps", s.n);
        for (int i = 0; i < s.n; i++) {
            const PpStep *st = &s.steps[i];
            int *next = st->kind == PP_FORWARD ? next_forward : next_backward;
            CHECK(st->micro_batch == next[st->chunk], "case %d step %d: micro-batch %d of chunk %d out of order", c,
                  i, st->micro_batch, st->chunk);
            next[st->chunk]++;
            now[st->chunk] += st->kind == PP_FORWARD ? 1 : -1;
            CHECK(now[st->chunk] >= 0, "case %d step %d: a backward before its forward", c, i);
            if (now[st->chunk] > most[st->chunk]) most[st->chunk] = now[st->chunk];
        }
        for (int k = 0; k < g->chunks; k++)
            CHECK(s.in_flight[k] == most[k] && now[k] == 0, "case %d chunk %d: in flight %d, counted %d", c, k,
                  s.in_flight[k], most[k]);
        pp_schedule_free(&s);
    }
}

// Megatron's refusals of the interleaved schedule: a group outside [pp, m], a last group
// shorter than pp.
static void test_interleaved_refusals(void) {
    PpSchedule s;
    char err[512];
    CHECK(pp_schedule_make(&s, 2, 0, 2, 5, 0, 0, err, sizeof(err)) == 1 && strstr(err, "--global-batch-size"),
          "m 5 over groups of 2 leaves 1 < pp: %s", err);
    CHECK(pp_schedule_make(&s, 4, 0, 2, 3, 0, 0, err, sizeof(err)) == 1 &&
              strstr(err, "--microbatch-group-size-per-virtual-pipeline-stage"),
          "m 3 < group 4: %s", err);
    CHECK(pp_schedule_make(&s, 2, 0, 2, 4, 1, 0, err, sizeof(err)) == 1, "group 1 < pp 2");
    CHECK(pp_schedule_make(&s, 2, 1, 1, 3, 0, 0, err, sizeof(err)) == 0, "1F1B takes any micro-batch count");
    pp_schedule_free(&s);
}

static void test_ideal_bubble(void) {
    PpSchedule s;
    char err[512];
    pp_schedule_make(&s, 4, 0, 1, 8, 0, 0, err, sizeof(err));
    CHECK_CLOSE(pp_schedule_ideal_bubble(&s), 3.0 / 11.0, 1e-12, 0, "pp 4 m 8");
    pp_schedule_free(&s);
    pp_schedule_make(&s, 4, 0, 2, 8, 0, 0, err, sizeof(err));
    CHECK_CLOSE(pp_schedule_ideal_bubble(&s), 3.0 / 19.0, 1e-12, 0, "pp 4 v 2 m 8");
    pp_schedule_free(&s);
}

int main(void) {
    RUN(test_orders_match_megatron);
    RUN(test_combined_orders_match_megatron);
    RUN(test_combined_without_pipeline);
    RUN(test_each_micro_batch_once_in_order);
    RUN(test_interleaved_refusals);
    RUN(test_ideal_bubble);
    TESTS_DONE();
}
