// pp_schedule.h — the order in which one pipeline rank runs the forward and backward
// passes of a step's micro-batches over its model chunks (Megatron-Core's schedules).
//
//   no pipeline (pp 1)        F0 B0 F1 B1 ...: each micro-batch forward then backward
//   1F1B (pp > 1, 1 chunk)    warm-up: min(pp − rank − 1, m) forwards; steady state: one
//                             forward then one backward; cool-down: the remaining backwards
//   interleaved (chunks v>1)  the forwards follow the schedule table (micro-batches in groups
//                             of g, each group through chunk 0, then chunk 1, ...); warm-up
//                             (pp − rank − 1)·2 + (v − 1)·g of them, then forward k + warm-up
//                             and backward k alternate; backward k is the micro-batch of
//                             table entry k on chunk v − 1 − (its chunk)
//   combined (--overlap-moe-expert-parallel-comm)  one more warm-up forward (no pipeline:
//                             one), so that each steady-state forward and the backward after
//                             it are of different micro-batches and can run together
//
// Chunk c of rank r is virtual stage c·pp + r: its input comes from virtual stage c·pp + r − 1
// (rank r − 1, or rank pp − 1's chunk c − 1), its output goes to the next. Within a chunk,
// forwards and backwards both visit the micro-batches in increasing order, so gradients
// accumulate in the order a single process adds them.
#pragma once
#include <stddef.h>

typedef enum { PP_FORWARD, PP_BACKWARD } PpStepKind;

typedef struct {
    PpStepKind kind;
    int micro_batch, chunk;
} PpStep;

typedef struct {
    int pp, rank, chunks, micro_batches;  // the micro-batches of this rank in one step
    int group;          // micro-batches of a group of the schedule table (interleaved)
    int warmup;         // forwards before the first backward
    int combined;       // each steady-state forward runs together with the backward after it
    int n;              // 2 · micro_batches · chunks steps
    PpStep *steps;      // (n) in the order this rank runs them
    int *in_flight;     // (chunks) most micro-batches forwarded and not yet backwarded at once
} PpSchedule;

// Builds the schedule; group 0 means pp (Megatron's default); combined: the combined 1F1B
// schedule (not with pp > 1 and one chunk). Returns 0, or 1 with a one-line reason in err
// (naming the flags) when Megatron refuses the combination.
int pp_schedule_make(PpSchedule *s, int pp, int rank, int chunks, int micro_batches, int group, int combined,
                     char *err, size_t err_size);
// Whether steps i and i + 1 run together: a steady-state forward and the backward after it
// of a combined schedule.
int pp_schedule_pair_at(const PpSchedule *s, int i);
void pp_schedule_free(PpSchedule *s);

// The ideal bubble fraction of the schedule: (pp − 1) / (v·m + pp − 1).
double pp_schedule_ideal_bubble(const PpSchedule *s);
