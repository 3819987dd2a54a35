// groups.c — Parallel Folding's process groups as pure functions of the sizes, and this
// process's Comm of each kind. The layout is explained in groups.h.
#include "parallel/groups.h"

#include <string.h>

enum { D_TP, D_CP, D_EP, D_DP, D_PP, DIMS };  // the order tp-cp-ep-dp-pp, fastest first

static const struct {
    const char *name;
    int expert;     // 1: the expert layout (etp, ep, edp), 0: the dense one (tp, cp, dp)
    unsigned dims;  // bit d: the group spans dimension d
} KINDS[PG_COUNT] = {
    [PG_TP] = {"tp", 0, 1u << D_TP},
    [PG_CP] = {"cp", 0, 1u << D_CP},
    [PG_DP] = {"dp", 0, 1u << D_DP},
    [PG_PP] = {"pp", 0, 1u << D_PP},
    [PG_DP_CP] = {"dp_cp", 0, 1u << D_CP | 1u << D_DP},
    [PG_MP] = {"mp", 0, 1u << D_TP | 1u << D_PP},
    [PG_ETP] = {"etp", 1, 1u << D_TP},
    [PG_EP] = {"ep", 1, 1u << D_EP},
    [PG_EDP] = {"edp", 1, 1u << D_DP},
    [PG_ETP_EP] = {"etp_ep", 1, 1u << D_TP | 1u << D_EP},
    [PG_EMP] = {"emp", 1, 1u << D_TP | 1u << D_EP | 1u << D_PP},
    [PG_TP_CP] = {"tp_cp", 0, 1u << D_TP | 1u << D_CP},
};

static void require_size(const char *flag, int value) {
    if (value <= 0) mt_die("--%s must be positive, got %d", flag, value);
}

void parallel_sizes_init(ParallelSizes *s, int world, int tp, int cp, int pp, int ep, int etp) {
    MT_ASSERT(world >= 1);
    require_size("tensor-model-parallel-size", tp);
    require_size("context-parallel-size", cp);
    require_size("pipeline-model-parallel-size", pp);
    require_size("expert-model-parallel-size", ep);
    require_size("expert-tensor-parallel-size", etp);
    long long dense = (long long)tp * cp * pp, expert = (long long)etp * ep * pp;
    if (world % dense)
        mt_die("the world of %d processes is not divisible by --tensor-model-parallel-size %d x "
               "--context-parallel-size %d x --pipeline-model-parallel-size %d = %lld; launch a multiple of %lld "
               "processes or change the sizes", world, tp, cp, pp, dense, dense);
    if (world % expert)
        mt_die("the world of %d processes is not divisible by --expert-tensor-parallel-size %d x "
               "--expert-model-parallel-size %d x --pipeline-model-parallel-size %d = %lld; launch a multiple of "
               "%lld processes or change the sizes", world, etp, ep, pp, expert, expert);
    *s = (ParallelSizes){.world = world, .tp = tp, .cp = cp, .pp = pp, .dp = (int)(world / dense),
                         .etp = etp, .ep = ep, .edp = (int)(world / expert)};
}

const char *group_kind_name(GroupKind kind) { return KINDS[kind].name; }

static void layout_of(const ParallelSizes *s, GroupKind kind, int size[DIMS]) {
    int expert = KINDS[kind].expert;
    size[D_TP] = expert ? s->etp : s->tp;
    size[D_CP] = expert ? 1 : s->cp;
    size[D_EP] = expert ? s->ep : 1;
    size[D_DP] = expert ? s->edp : s->dp;
    size[D_PP] = s->pp;
}

int group_size(const ParallelSizes *s, GroupKind kind) {
    int size[DIMS], n = 1;
    layout_of(s, kind, size);
    for (int d = 0; d < DIMS; d++)
        if (KINDS[kind].dims >> d & 1) n *= size[d];
    return n;
}

int group_count(const ParallelSizes *s, GroupKind kind) { return s->world / group_size(s, kind); }

// The world-rank offset of the coordinates that `index` spells over the dimensions with
// bit `inside` in `dims` (as a mixed-radix number, the first such dimension fastest).
static int offset_of(const int size[DIMS], unsigned dims, int inside, int index) {
    int offset = 0, stride = 1;
    for (int d = 0; d < DIMS; d++) {
        if ((int)(dims >> d & 1) == inside) {
            offset += index % size[d] * stride;
            index /= size[d];
        }
        stride *= size[d];
    }
    return offset;
}

void group_ranks(const ParallelSizes *s, GroupKind kind, int index, int *ranks) {
    int size[DIMS], n = group_size(s, kind);
    MT_ASSERT(index >= 0 && index < group_count(s, kind));
    layout_of(s, kind, size);
    int base = offset_of(size, KINDS[kind].dims, 0, index);
    for (int i = 0; i < n; i++) ranks[i] = base + offset_of(size, KINDS[kind].dims, 1, i);
}

int group_index_of(const ParallelSizes *s, GroupKind kind, int rank) {
    int size[DIMS], index = 0, radix = 1, stride = 1;
    MT_ASSERT(rank >= 0 && rank < s->world);
    layout_of(s, kind, size);
    for (int d = 0; d < DIMS; d++) {
        if (!(KINDS[kind].dims >> d & 1)) {
            index += rank / stride % size[d] * radix;
            radix *= size[d];
        }
        stride *= size[d];
    }
    return index;
}

// How a group is made from its world ranks, seen from world rank `me`: a communicator
// (comm_group, collective), or only its description (rank and size: parallel_groups_describe).
typedef Comm (*GroupMaker)(const char *name, const int *ranks, int n, int me);

static Comm communicator(const char *name, const int *ranks, int n, int me) { return comm_group(name, ranks, n); }

static Comm description(const char *name, const int *ranks, int n, int me) {
    Comm g = {.name = name, .rank = -1, .size = 0};
    for (int i = 0; i < n; i++)
        if (ranks[i] == me) g.rank = i, g.size = n;
    return g;
}

// The inner groups (consecutive CP ranks) and outer ones (every inner-th) of size `inner`.
// Collective over the world when the maker is: every rank makes one of each.
static void make_cp_hierarchy(ParallelGroups *pg, int inner, int me, GroupMaker make) {
    const Comm *cp = &pg->comm[PG_CP];
    int *ranks = mt_malloc((size_t)cp->size * sizeof(int)), *members = mt_malloc((size_t)cp->size * sizeof(int));
    group_ranks(&pg->sizes, PG_CP, group_index_of(&pg->sizes, PG_CP, me), ranks);
    int outer = cp->size / inner, inner_rank = cp->rank % inner, outer_rank = cp->rank / inner;
    for (int i = 0; i < inner; i++) members[i] = ranks[outer_rank * inner + i];
    pg->cp_inner = make("cp_inner", members, inner, me);
    for (int o = 0; o < outer; o++) members[o] = ranks[o * inner + inner_rank];
    pg->cp_outer = make("cp_outer", members, outer, me);
    free(members);
    free(ranks);
}

static void build_groups(ParallelGroups *pg, const Config *c, int world, int me, GroupMaker make) {
    memset(pg, 0, sizeof(*pg));
    parallel_sizes_init(&pg->sizes, world, c->tensor_model_parallel_size, c->context_parallel_size,
                        c->pipeline_model_parallel_size, c->expert_model_parallel_size,
                        c->expert_tensor_parallel_size);
    int *ranks = mt_malloc((size_t)pg->sizes.world * sizeof(int));
    for (int k = 0; k < PG_COUNT; k++) {
        group_ranks(&pg->sizes, k, group_index_of(&pg->sizes, k, me), ranks);
        pg->comm[k] = make(KINDS[k].name, ranks, group_size(&pg->sizes, k), me);
    }
    free(ranks);
    make_cp_hierarchy(pg, c->cp_a2a_size > 0 ? c->cp_a2a_size : 1, me, make);
}

void parallel_layout_check(const ParallelSizes *s, const Config *c) {
    if (s->etp > 1 && !c->num_experts)
        mt_die("--expert-tensor-parallel-size %d needs a MoE model (--num-experts)", s->etp);
    if (s->ep > 1 && !c->num_experts)
        mt_die("--expert-model-parallel-size %d needs a MoE model (--num-experts)", s->ep);
    if (c->num_micro_batches % s->dp)
        mt_die("--global-batch-size %d must be a multiple of --micro-batch-size %d times the %d data-parallel "
               "ranks", c->global_batch_size, c->micro_batch_size, s->dp);
}

void parallel_groups_init(ParallelGroups *pg, const Config *c) {
    build_groups(pg, c, comm_world_size(), comm_world_rank(), communicator);
}

void parallel_groups_describe(ParallelGroups *pg, const Config *c, int world, int rank) {
    build_groups(pg, c, world, rank, description);
    pg->described = 1;
}

void parallel_groups_free(ParallelGroups *pg) {
    for (int k = 0; k < PG_COUNT; k++) comm_free(&pg->comm[k]);
    comm_free(&pg->cp_inner);
    comm_free(&pg->cp_outer);
}
