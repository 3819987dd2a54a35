// plan.c — `moetron plan`: the memory every rank of a training run would hold, and the
// step's FLOPs, from train's flags and a world size, without allocating the model or
// starting any process: each rank's groups are described (parallel_groups_describe), its
// model and schedule described, and train/memory_plan.h — the trainer's own start-up
// model — gives its bytes. Ranks holding the same are one row.
#include <stdio.h>
#include <string.h>

#include "cmd/commands.h"
#include "hf/hf_config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/comm_plan.h"
#include "train/memory_plan.h"

static const double MIB = 1024.0 * 1024.0;

// One row of the table: what a set of ranks holds (all equal), and which ranks.
typedef struct {
    MemoryNeed need;
    int stage;
    int ranks;
    char rank_list[160];
    char chunks[512];  // each model chunk's activations per micro-batch and micro-batches in flight
    CommPlan comm;     // the first rank's bytes sent per step
} PlanRow;

static int same_need(const PlanRow *row, const MemoryNeed *n, int stage) {
    const MemoryNeed *a = &row->need;
    return row->stage == stage && a->parameters == n->parameters && a->gradients == n->gradients &&
           a->optimizer == n->optimizer && a->activations == n->activations && a->exchange == n->exchange &&
           a->reduction == n->reduction;
}

// Appends world rank r to a row's list ("0-3 8-11"; "..." once it is long).
static void add_rank(PlanRow *row, int r, int *last) {
    size_t len = strlen(row->rank_list);
    if (row->ranks++ && r == *last + 1) {
        char *dash = strrchr(row->rank_list, ' ');
        char *tail = dash ? dash + 1 : row->rank_list;
        char *range = strchr(tail, '-');
        size_t keep = range ? (size_t)(range - row->rank_list) : len;
        if (keep + 24 < sizeof(row->rank_list)) snprintf(row->rank_list + keep, sizeof(row->rank_list) - keep, "-%d", r);
    } else if (len + 24 < sizeof(row->rank_list)) {
        snprintf(row->rank_list + len, sizeof(row->rank_list) - len, "%s%d", len ? " " : "", r);
    } else if (!strstr(row->rank_list, "...")) {
        snprintf(row->rank_list + len, sizeof(row->rank_list) - len, " ...");
    }
    *last = r;
}

// "45.1 x 12, 45.1 x 10, ...": each chunk's activations (plan and exchange) per micro-batch
// in MiB, times the micro-batches the schedule keeps in flight.
static void describe_chunks(const Pipeline *pl, char *out, size_t size) {
    out[0] = 0;
    for (int k = 0; k < pl->schedule.chunks; k++) {
        double exchange, mib = (pipeline_chunk_bytes(pl, k, &exchange) + exchange) / MIB;
        size_t len = strlen(out);
        snprintf(out + len, size - len, "%s%.1f x %d", k ? ", " : "", mib, pl->slots[k]);
    }
}

// What world rank r of the run holds.
static MemoryNeed plan_rank(const Config *c, int world, int r, int *stage, char *chunks, size_t chunks_size,
                            CommPlan *comm) {
    ParallelGroups pg;
    parallel_groups_describe(&pg, c, world, r);
    ModelGroups groups = plan_model_groups(&pg);
    Model m;
    model_describe(&m, c, &groups);
    Pipeline pl;
    int micro_batches = c->num_micro_batches / pg.sizes.dp;
    pipeline_init(&pl, &m, &pg.comm[PG_PP], micro_batches, c->microbatch_group_size_per_vp_stage,
                  c->overlap_moe_expert_parallel_comm, c->micro_batch_size, c->seq_length / pg.sizes.cp);
    GradGroups grad_groups = plan_grad_groups(&pg);
    MemoryNeed need = memory_plan(c, &m, &pl, &grad_groups, !strcmp(c->device, "cuda"));
    *comm = comm_plan(c, &m, &pl, &grad_groups);
    *stage = pg.comm[PG_PP].rank;
    describe_chunks(&pl, chunks, chunks_size);
    pipeline_free(&pl);
    model_free(&m);
    parallel_groups_free(&pg);
    return need;
}

// The fewest processes the layout needs: a multiple of both TP·CP·PP and ETP·EP·PP.
static int fewest_processes(const Config *c) {
    int dense = c->tensor_model_parallel_size * c->context_parallel_size * c->pipeline_model_parallel_size;
    int expert = c->expert_tensor_parallel_size * c->expert_model_parallel_size * c->pipeline_model_parallel_size;
    int world = dense;
    while (world % expert) world += dense;
    return world;
}

static void print_row(const PlanRow *row) {
    const MemoryNeed *n = &row->need;
    printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", row->rank_list, row->stage,
           n->parameters / MIB, n->gradients / MIB, n->optimizer / MIB, n->exchange / MIB, n->reduction / MIB,
           n->activations / MIB, memory_need_total(n) / MIB);
}

// The bytes sent per step to each dimension's ranks, by the first rank of each row ("~": an
// estimate, train/comm_plan.h).
static void print_comm(const PlanRow *rows, int n_rows) {
    printf("\nMiB sent per step by a rank to the ranks of each parallel dimension (~: an estimate):\n\n| ranks |");
    for (int d = 0; d < DIMS; d++) printf(" %s |", parallel_dim_name((ParallelDim)d));
    printf("\n|---|");
    for (int d = 0; d < DIMS; d++) printf("---|");
    printf("\n");
    for (int i = 0; i < n_rows; i++) {
        printf("| %s |", rows[i].rank_list);
        for (int d = 0; d < DIMS; d++)
            printf(" %s%.3f |", rows[i].comm.estimated[d] ? "~" : "", rows[i].comm.bytes[d] / MIB);
        printf("\n");
    }
}

int plan_main(Config *c) {
    if (c->load[0]) {
        char resolved[MT_PATH_MAX + 32];
        checkpoint_resolve(resolved, c->load);
        config_from_checkpoint(c, resolved);
    }
    int world = c->plan_world_size ? c->plan_world_size : fewest_processes(c);
    if (world < 1) mt_die("--world-size %d: use a positive number of processes", world);
    ParallelSizes sizes;
    parallel_sizes_init(&sizes, world, c->tensor_model_parallel_size, c->context_parallel_size,
                        c->pipeline_model_parallel_size, c->expert_model_parallel_size, c->expert_tensor_parallel_size);
    parallel_layout_check(&sizes, c);
    double parameters, active;
    model_parameter_counts(c, &parameters, &active);
    double tokens = (double)c->global_batch_size * c->seq_length, flops = tokens * model_train_flops_per_token(c);
    printf("moetron plan: %d layers, hidden %d, %d experts top-%d, %.2fM parameters (%.2fM active)\n", c->num_layers,
           c->hidden_size, c->num_experts, c->moe_router_topk, parameters / 1e6, active / 1e6);
    printf("world %d: tp %d, cp %d, pp %d, dp %d; experts: etp %d, ep %d, edp %d\n", world, sizes.tp, sizes.cp,
           sizes.pp, sizes.dp, sizes.etp, sizes.ep, sizes.edp);
    printf("step: %.0f tokens (%d sequences of %d), %.4g TFLOP (%.4g TFLOP per rank; recomputed forwards not "
           "counted)\n", tokens, c->global_batch_size, c->seq_length, flops / 1e12, flops / 1e12 / world);
    printf("\nmemory per rank in MiB (micro-batches of %d x %d tokens; %s):\n\n", c->micro_batch_size,
           c->seq_length / sizes.cp, !strcmp(c->device, "cuda") ? "on the GPU" : "host memory");
    printf("| ranks | stage | parameters | gradients | AdamW moments | expert exchange | gradient reductions | "
           "activations | total |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    PlanRow *rows = mt_calloc((size_t)world, sizeof(PlanRow));
    int *last = mt_calloc((size_t)world, sizeof(int)), n_rows = 0;
    for (int r = 0; r < world; r++) {
        int stage, i;
        char chunks[sizeof(rows->chunks)];
        CommPlan comm;
        MemoryNeed need = plan_rank(c, world, r, &stage, chunks, sizeof(chunks), &comm);
        for (i = 0; i < n_rows && !same_need(&rows[i], &need, stage); i++) {}
        if (i == n_rows) {
            rows[n_rows++] = (PlanRow){.need = need, .stage = stage, .comm = comm};
            snprintf(rows[i].chunks, sizeof(rows[i].chunks), "%s", chunks);
        }
        add_rank(&rows[i], r, &last[i]);
    }
    for (int i = 0; i < n_rows; i++) print_row(&rows[i]);
    printf("\nactivations of each model chunk per micro-batch (MiB, the plan's and the exchange's) x micro-batches "
           "in flight:\n");
    for (int i = 0; i < n_rows; i++) printf("  ranks %s: %s\n", rows[i].rank_list, rows[i].chunks);
    print_comm(rows, n_rows);
    free(rows);
    free(last);
    return 0;
}
