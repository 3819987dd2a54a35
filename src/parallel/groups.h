// groups.h — the process groups of a run with Parallel Folding, in Megatron-Core's rank
// order (docs/parallelism.md).
//
// World ranks are laid out in the order tp-cp-ep-dp-pp (tp varies fastest) twice:
//   dense layers   tp, cp, dp, pp        world = tp * cp * dp * pp
//   expert layers  etp, ep, edp, pp      world = etp * ep * edp * pp
// so rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)) for the dense layout,
// and the same with (etp, ep, edp) for the experts; pp is last in both, so both layouts
// have the same pipeline stages. A group of a kind holds the ranks that differ only in
// that kind's coordinates; its members (and the groups of a kind) are ordered with the
// first coordinate of the order varying fastest, as megatron.core.parallel_state's
// RankGenerator.get_ranks.
#pragma once
#include "core/config.h"
#include "parallel/comm.h"

typedef enum {
    PG_TP,      // dense tensor parallel                         "tp"
    PG_CP,      // context parallel                              "cp"
    PG_DP,      // dense data parallel                           "dp"
    PG_PP,      // pipeline stages                               "pp"
    PG_DP_CP,   // dense gradient reduction                      "dp-cp"
    PG_MP,      // model parallel (grad norms of dense shards)   "tp-pp"
    PG_ETP,     // expert tensor parallel                        expert "tp"
    PG_EP,      // expert parallel (token all-to-all)            expert "ep"
    PG_EDP,     // expert data parallel: expert gradients        expert "dp"
    PG_ETP_EP,  // expert tensor and expert parallel             expert "tp-ep"
    PG_EMP,     // expert model parallel (expert grad norms)     expert "tp-ep-pp"
    PG_TP_CP,   // tensor x context parallel: a micro-batch's     "tp-cp"
                // tokens (the router's token group)
    PG_COUNT
} GroupKind;

typedef struct {
    int world;
    int tp, cp, pp, dp;  // dense layout
    int etp, ep, edp;    // expert layout (same pp)
} ParallelSizes;

// Fill s from the world size and the flag values; dp and edp are derived. Dies with one
// line naming the flags when the world is not divisible by tp*cp*pp or by etp*ep*pp.
void parallel_sizes_init(ParallelSizes *s, int world, int tp, int cp, int pp, int ep, int etp);
const char *group_kind_name(GroupKind kind);  // "tp", "dp_cp", "edp", ...
int group_size(const ParallelSizes *s, GroupKind kind);
int group_count(const ParallelSizes *s, GroupKind kind);  // world / group_size
// The world ranks of group `index` (0 <= index < group_count) of a kind, in group-rank
// order, into ranks[group_size].
void group_ranks(const ParallelSizes *s, GroupKind kind, int index, int *ranks);
// The index of the group of a kind that holds world rank `rank`.
int group_index_of(const ParallelSizes *s, GroupKind kind, int rank);

// This process's groups. parallel_groups_init is collective over the world (every
// process calls it at start-up with the same sizes).
typedef struct {
    ParallelSizes sizes;
    Comm comm[PG_COUNT];
    // --hierarchical-context-parallel-sizes inner outer: the CP group cut into consecutive
    // groups of `inner` CP ranks (the all-to-all of a2a+p2p) and the rings across them
    // (CP rank = outer_rank · inner + inner_rank, as Megatron-Core's hierarchical groups);
    // without it cp_inner is this process alone and cp_outer the CP group.
    Comm cp_inner, cp_outer;
    int described;  // parallel_groups_describe's: descriptions, no communicators
} ParallelGroups;

// The sizes from --tensor-model-parallel-size, --context-parallel-size,
// --pipeline-model-parallel-size, --expert-model-parallel-size and
// --expert-tensor-parallel-size and the world size.
void parallel_groups_init(ParallelGroups *pg, const Config *c);
// What a training run needs of its sizes besides divisibility: expert parallelism needs
// experts, and the global batch whole micro-batches for every data-parallel rank. Dies with
// one line naming the flags.
void parallel_layout_check(const ParallelSizes *s, const Config *c);
// The same groups of world rank `rank` of a world of `world` processes, described only
// (each Comm's rank and size, no communicator: never used to communicate), for planning a
// layout without launching it (train/memory_plan.h). Freed with parallel_groups_free.
void parallel_groups_describe(ParallelGroups *pg, const Config *c, int world, int rank);
void parallel_groups_free(ParallelGroups *pg);
