#include "train/pp_schedule.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"

// Forward k of an interleaved schedule: micro-batches in groups of `group`, each group run
// through every chunk in turn (a last group that is shorter takes all that remain).
static void table_entry(int k, int m, int chunks, int group, int *micro_batch, int *chunk) {
    for (int first = 0;;) {
        int size = first + group >= m ? m - first : group;
        if (k < size * chunks) {
            *chunk = k / size;
            *micro_batch = first + k % size;
            return;
        }
        k -= size * chunks;
        first += size;
    }
}

static void add(PpSchedule *s, PpStepKind kind, int micro_batch, int chunk) {
    s->steps[s->n++] = (PpStep){kind, micro_batch, chunk};
}

static void add_forward(PpSchedule *s, int k) {
    int mb, chunk;
    if (s->chunks == 1) mb = k, chunk = 0;
    else table_entry(k, s->micro_batches, s->chunks, s->group, &mb, &chunk);
    add(s, PP_FORWARD, mb, chunk);
}

static void add_backward(PpSchedule *s, int k) {
    int mb, chunk;
    if (s->chunks == 1) mb = k, chunk = 0;
    else table_entry(k, s->micro_batches, s->chunks, s->group, &mb, &chunk);
    add(s, PP_BACKWARD, mb, s->chunks - 1 - chunk);
}

static int refuse(char *err, size_t n, const char *fmt, int a, int b) {
    snprintf(err, n, fmt, a, b);
    return 1;
}

// Megatron's conditions for the interleaved schedule.
static int check_interleaved(int pp, int m, int group, char *err, size_t n) {
    if (group < pp || group > m)
        return refuse(err, n,
                      "--microbatch-group-size-per-virtual-pipeline-stage %d must lie between "
                      "--pipeline-model-parallel-size and the micro-batches per data-parallel rank (%d) with virtual "
                      "stages; use more micro-batches (--global-batch-size) or a smaller group",
                      group, m);
    int last = m % group;
    if (last > 0 && last < pp)
        return refuse(err, n,
                      "with virtual pipeline stages the micro-batches per data-parallel rank modulo the group size "
                      "(--microbatch-group-size-per-virtual-pipeline-stage %d) must be 0 or at least "
                      "--pipeline-model-parallel-size, not %d; change --global-batch-size",
                      group, last);
    return 0;
}

static void count_in_flight(PpSchedule *s) {
    int *now = mt_calloc((size_t)s->chunks, sizeof(int));
    for (int i = 0; i < s->n; i++) {
        int c = s->steps[i].chunk;
        now[c] += s->steps[i].kind == PP_FORWARD ? 1 : -1;
        if (now[c] > s->in_flight[c]) s->in_flight[c] = now[c];
    }
    free(now);
}

int pp_schedule_make(PpSchedule *s, int pp, int rank, int chunks, int micro_batches, int group, int combined,
                     char *err, size_t err_size) {
    memset(s, 0, sizeof(*s));
    int m = micro_batches, total = m * chunks;
    s->pp = pp, s->rank = rank, s->chunks = chunks, s->micro_batches = m, s->group = group ? group : pp;
    s->combined = combined;
    if (chunks > 1 && check_interleaved(pp, m, s->group, err, err_size)) return 1;
    if (combined && pp > 1 && chunks == 1)
        return refuse(err, err_size, "--overlap-moe-expert-parallel-comm with --pipeline-model-parallel-size %d needs "
                      "virtual pipeline stages (%d per rank now)", pp, chunks);
    if (pp == 1) s->warmup = 0;
    else if (chunks == 1) s->warmup = pp - rank - 1;
    else s->warmup = (pp - rank - 1) * 2 + (chunks - 1) * s->group;
    s->warmup += combined;
    if (s->warmup > total) s->warmup = total;
    s->steps = mt_malloc((size_t)2 * total * sizeof(PpStep));
    s->in_flight = mt_calloc((size_t)chunks, sizeof(int));
    int remaining = total - s->warmup;
    for (int k = 0; k < s->warmup; k++) add_forward(s, k);
    for (int k = 0; k < remaining; k++) {
        add_forward(s, k + s->warmup);
        add_backward(s, k);
    }
    for (int k = remaining; k < total; k++) add_backward(s, k);
    count_in_flight(s);
    return 0;
}

void pp_schedule_free(PpSchedule *s) {
    free(s->steps);
    free(s->in_flight);
    memset(s, 0, sizeof(*s));
}

int pp_schedule_pair_at(const PpSchedule *s, int i) {
    int steady = s->n - 2 * s->warmup;  // after the warm-up forwards, before the cool-down backwards
    return s->combined && i >= s->warmup && i < s->warmup + steady && (i - s->warmup) % 2 == 0;
}

double pp_schedule_ideal_bubble(const PpSchedule *s) {
    return (s->pp - 1.0) / ((double)s->chunks * s->micro_batches + s->pp - 1.0);
}
