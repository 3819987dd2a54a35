// trainer.c — the training loop: micro-batches with gradient accumulation, gradient
// reduction over the data-parallel group, clipping, AdamW, the LR schedule, held-out
// evaluation, metrics and checkpoints.
#include "core/device.h"
#include "train/trainer.h"

#include <math.h>
#include <errno.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/profile.h"
#include "core/progress.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "hf/hf_config.h"
#include "model/cp_batch.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/gemm.h"
#include "ops/op_profile.h"
#include "ops/ops.h"
#include "core/float_formats.h"
#include "ops/quantized_linear.h"
#include "parallel/comm.h"
#include "parallel/groups.h"
#include "parallel/watchdog.h"
#include "train/grad_sync.h"
#include "train/run_summary.h"
#include "train/step_stats.h"
#include "data/prefetch.h"
#include "train/checkpoint.h"
#include "train/ckpt_shards.h"
#include "moe/expert_parallel.h"
#include "moe/routing_trace.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/memory_check.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/run_control.h"
#include "train/thread_governor.h"
#include "tokenizer/run_tokenizer.h"

typedef struct {
    Config *cfg;
    Model model;
    Optimizer opt;
    LossScaler scaler;          // --fp16 / --loss-scale (scale 1 and unused otherwise)
    TrainerState state;
    Dataset data;
    RunTokenizer *tokenizer;  // read once at start-up; NULL: byte-level
    Pipeline pipeline;          // the schedule of a step and the activations it keeps
    Comm tied_embedding;        // PP with two copies of the embedding: the first and last stage (size 0 elsewhere)
    Prefetcher prefetch;        // training micro-batches, read ahead on a thread
    DataBatch eval_batch;       // validation micro-batches
    ParallelGroups groups;      // every process group of the layout
    const Comm *dp;             // data parallel: the ranks that split each global batch
    GradSync sync;              // gradient reduction / distributed optimizer over dp and edp
    double comm_s;              // time in gradient / parameter collectives, this step
    double comm_hidden_s;       // gradient sums in flight behind backward, this step
    double bubble_s, bubble;    // the pipeline's waits this step (mean over stages) and their share
    Metrics metrics;
    double peak_flops, flops_per_token;
    MemoryNeed memory_need;     // what this process holds (check_memory)
    RouterStats *layer_stats;   // (all layers) scratch for per-layer router statistics
    int64_t *layer_counts;      // (all layers, num_experts) kept tokens per expert this step
    double *mtp_loss;           // (mtp depths) this step's loss of each
    // the step's micro-batches (train_step_micro_batches)
    struct RankBatch *step_batches;  // (micro-batches per rank) this rank's part of each, as fetched
    DataBatch *step_data;       // (micro-batches per rank) copies of them with PP (chunks revisit them)
    int fetched;                // micro-batches of the step fetched so far
    StepLosses *step_losses;
    RunSummary summary;         // what the run prints at its end
    double parameters, active_parameters;  // of the whole model
} Trainer;

// The model's view of a micro-batch of data.
static Batch batch_of(const DataBatch *db, int L) {
    Batch b = {.B = db->B, .T = L, .tokens = db->tokens, .targets = db->targets, .loss_mask = db->loss_mask,
               .positions = db->positions, .key_start = db->key_start};
    return b;
}

// The part of a micro-batch this rank computes: with context parallelism its two chunks
// of each sequence (model/cp_batch.h; cp holds them, freed with it), else all of it.
typedef struct RankBatch {
    Batch batch;
    CpBatch cp;  // all NULL without context parallelism
} RankBatch;

static void rank_batch_of(RankBatch *r, const Trainer *t, const Batch *full) {
    const Comm *cp = &t->groups.comm[PG_CP];
    memset(r, 0, sizeof(*r));
    r->batch = *full;
    if (cp->size == 1) return;
    cp_batch_slice(&r->cp, full, cp->size, cp->rank, t->cfg->mtp_num_layers);  // keeps the batch's other fields
    r->batch = r->cp.batch;
}

static void rank_batch_free(RankBatch *r) { cp_batch_free(&r->cp); }

// Tokens of a sequence this rank holds: seq_length / CP.
static int rank_seq_length(const Trainer *t) { return t->cfg->seq_length / t->groups.sizes.cp; }

// Seeds the router noise of one micro-batch from the run seed and its sample position.
static uint64_t noise_seed(const Config *c, int64_t first_sample) {
    return (uint64_t)c->seed * 0x9E3779B97F4A7C15ULL ^ (uint64_t)first_sample * 0xBF58476D1CE4E5B9ULL;
}

// Sample position of micro-batch mb of this data-parallel rank in the step that starts at
// `consumed`: as Megatron's sampler splits a global batch, micro-batch mb of rank r holds
// samples [consumed + (mb·dp + r)·B, + B). Every layout thus runs the same micro-batches.
static int64_t micro_batch_first(int64_t consumed, int mb, int B, const Comm *dp) {
    return consumed + ((int64_t)mb * dp->size + dp->rank) * B;
}

// With PP and a tied LM head the embedding's gradient is the sum of the first stage's
// (embedding) and the last stage's (LM head copy): those parts wait for the schedule's end.
static int tied_part(const Trainer *t, int part) {
    const LayoutPlan *p = &t->model.plan;
    if (t->tied_embedding.size < 2) return 0;
    return (part == GRADS_EMBEDDING && p->holds_embedding) || (part == GRADS_HEAD && p->holds_head);
}

// A part's gradients are complete: sum them over tensor-parallel ranks, then start their
// sum over the data-parallel group.
static void start_part_sums(Trainer *t, int part) {
    ElemRange dense, experts;
    model_sum_partial_grads(&t->model, part);  // over tensor-parallel ranks first
    model_grads_part_ranges(&t->model, part, &dense, &experts);
    grad_sync_part_ready(&t->sync, &t->model.tt, REGION_DENSE, dense.begin, dense.end);
    grad_sync_part_ready(&t->sync, &t->model.tt, REGION_EXPERT, experts.begin, experts.end);
}

// Backward finished the gradients of a part (during each chunk's last backward).
static void grads_ready(void *ctx, int part) {
    Trainer *t = ctx;
    if (!tied_part(t, part)) start_part_sums(t, part);
}

// The two copies of a tied embedding get the sum of their gradients (before the data-
// parallel sums, so both stages then sum the same values).
static void sum_tied_embedding(Trainer *t) {
    if (t->tied_embedding.size < 2) return;
    const Model *m = &t->model;
    TensorId id = m->plan.holds_embedding ? m->embed : m->embed_copy;
    comm_allreduce_sum(&t->tied_embedding, tt_grad(&m->tt, id), m->tt.descs[id].numel);
}

// The copy of a fetched micro-batch that outlives the prefetcher's next one.
static void copy_data_batch(DataBatch *dst, const DataBatch *src) {
    size_t n = (size_t)src->B * src->L;
    memcpy(dst->tokens, src->tokens, n * sizeof(int32_t));
    memcpy(dst->targets, src->targets, n * sizeof(int32_t));
    memcpy(dst->loss_mask, src->loss_mask, n * sizeof(real));
    if (src->positions) memcpy(dst->positions, src->positions, n * sizeof(int32_t));
    if (src->key_start) memcpy(dst->key_start, src->key_start, n * sizeof(int32_t));
    if (!src->positions) dst->positions = NULL;
    if (!src->key_start) dst->key_start = NULL;
}

// The schedule's micro-batch mb of this rank: fetched in order the first time (the next
// one read ahead), kept until the step ends.
static const Batch *step_batch(void *ctx, int mb) {
    Trainer *t = ctx;
    const Config *c = t->cfg;
    if (mb < t->fetched) return &t->step_batches[mb].batch;
    MT_ASSERT(mb == t->fetched);
    int M = c->num_micro_batches / t->dp->size, B = c->micro_batch_size;
    int64_t consumed = t->state.consumed_train_samples, first = micro_batch_first(consumed, mb, B, t->dp);
    int last_step = t->state.iteration + 1 >= c->train_iters;
    int64_t next = mb + 1 < M ? micro_batch_first(consumed, mb + 1, B, t->dp)
                   : last_step ? -1
                               : micro_batch_first(consumed + c->global_batch_size, 0, B, t->dp);
    const DataBatch *db;
    {
        PROF_SCOPE(PROF_DATA);
        db = prefetch_get(&t->prefetch, first, next);
    }
    if (t->step_data) {
        copy_data_batch(&t->step_data[mb], db);
        db = &t->step_data[mb];
    }
    Batch full = batch_of(db, c->seq_length);
    full.training = 1;
    full.noise_seed = noise_seed(c, first - t->state.rng_start_sample);
    full.iteration = t->state.iteration;
    full.first_sample = first;
    rank_batch_of(&t->step_batches[t->fetched++], t, &full);
    return &t->step_batches[mb].batch;
}

// MOETRON_TEST_FAIL_MID_SCHEDULE=R (for tests/cli/test_mpi_pp.sh): world rank R fails in
// the middle of the second step's schedule, after the forward of its micro-batch 1, while
// its pipeline neighbours wait for it.
static void fail_mid_schedule_for_test(const Trainer *t, int mb) {
    const char *v = getenv("MOETRON_TEST_FAIL_MID_SCHEDULE");
    if (v && atoi(v) == comm_world_rank() && t->state.iteration == 1 && mb == 1)
        mt_die("failing in the middle of the pipeline schedule (MOETRON_TEST_FAIL_MID_SCHEDULE)");
}

static void forward_done(void *ctx, const ModelActs *a, int mb) {
    Trainer *t = ctx;
    fail_mid_schedule_for_test(t, mb);
    double weight = 1.0 / t->cfg->num_micro_batches;  // every micro-batch of every rank counts alike
    StepLosses *s = t->step_losses;
    s->lm_loss += a->lm_loss * weight;  // 0 on chunks without the head
    s->aux_objective += a->aux_objective * weight;
    s->mtp_objective += a->mtp_objective * weight;
    for (int k = 0; k < a->mtp_depths; k++) s->mtp_loss[k] += a->mtp_loss[k] * weight;
    accumulate_router_stats(s, &t->model, a, weight);
}

// After the schedule: the gradients' sums over tensor-parallel, tied-embedding and data-
// parallel ranks (those started during backward finish here).
static void sum_step_grads(Trainer *t) {
    if (t->sync.overlap) {  // only the part not hidden behind backward
        for (int part = GRADS_EMBEDDING; part <= GRADS_HEAD; part++)
            if (tied_part(t, part)) {
                sum_tied_embedding(t);
                start_part_sums(t, part);
            }
        grad_sync_finish(&t->sync, &t->model.tt);
        t->comm_hidden_s = t->sync.hidden_s;
    } else {
        model_sum_all_partial_grads(&t->model);
        sum_tied_embedding(t);
        grad_sync_reduce(&t->sync, &t->model.tt);
    }
}

// The pipeline bubble of the step: each stage's waits for its neighbours, as a mean over
// the stages and as their share of the schedule's time.
static void measure_bubble(Trainer *t) {
    double times[2] = {t->pipeline.waited_s, t->pipeline.step_s};
    const Comm *pp = &t->groups.comm[PG_PP];
    comm_allreduce_sum_double(pp, times, 2);
    t->bubble_s = times[0] / pp->size;
    t->bubble = times[1] > 0 ? times[0] / times[1] : 0;
}

static StepLosses train_step_micro_batches(Trainer *t) {
    const Config *c = t->cfg;
    StepLosses s = {.layers = t->layer_stats, .counts = t->layer_counts, .num_experts = c->num_experts,
                    .moe_layers = model_moe_layers(c), .mtp_loss = t->mtp_loss, .mtp_depths = c->mtp_num_layers};
    memset(t->layer_stats, 0, config_all_layers(c) * sizeof(RouterStats));
    memset(t->layer_counts, 0, (size_t)config_all_layers(c) * MT_MAX(c->num_experts, 1) * sizeof(int64_t));
    memset(t->mtp_loss, 0, (size_t)c->mtp_num_layers * sizeof(double));
    vec_zero(t->model.tt.grads, t->model.tt.total);
    t->step_losses = &s;
    t->fetched = 0;
    PipelineStep step = {.batch = step_batch, .forward_done = forward_done,
                         .grads_ready = t->sync.overlap ? grads_ready : NULL, .ctx = t,
                         .loss_scale = (double)t->scaler.state.scale / c->num_micro_batches};
    pipeline_run(&t->pipeline, &step);
    for (int mb = 0; mb < t->fetched; mb++) rank_batch_free(&t->step_batches[mb]);
    t->state.consumed_train_samples += c->global_batch_size;
    PROF_SCOPE(PROF_GRAD_SYNC);
    double t0 = now_seconds();
    sum_step_grads(t);
    t->comm_s += now_seconds() - t0;
    measure_bubble(t);
    step_losses_allreduce(&s, t->dp);
    step_losses_allreduce(&s, &t->groups.comm[PG_PP]);  // each stage's layers and the last stage's loss
    router_state_allreduce(&t->model, t->dp);
    return s;
}

static double evaluate(Trainer *t) {
    const Config *c = t->cfg;
    int B = c->micro_batch_size, L = c->seq_length;
    double total = 0;
    Progress pg;
    progress_begin(&pg, "evaluation", "batches", 1, c->eval_iters, PROGRESS_WHEN_SLOW);
    for (int i = 0; i < c->eval_iters; i++) {
        progress_update(&pg, i);
        dataset_batch(&t->data, DATA_VALID, (int64_t)i * B, &t->eval_batch);
        Batch full = batch_of(&t->eval_batch, L);
        RankBatch rank;
        rank_batch_of(&rank, t, &full);
        total += pipeline_forward_only(&t->pipeline, &rank.batch);
        rank_batch_free(&rank);
    }
    progress_update(&pg, c->eval_iters);
    progress_end(&pg);
    comm_allreduce_sum_double(&t->groups.comm[PG_PP], &total, 1);  // the last stage's
    return total / c->eval_iters;
}

// The process groups of the layout (parallel/groups.h).
static void setup_parallel(Trainer *t) {
    const Config *c = t->cfg;
    parallel_groups_init(&t->groups, c);
    parallel_layout_check(&t->groups.sizes, c);
    t->dp = &t->groups.comm[PG_DP];
}

// Every rank's peak resident memory (MB), on every rank.
static double *rank_peak_memory(void) {
    Comm world = comm_world();
    double *peaks = mt_calloc((size_t)world.size, sizeof(double));
    peaks[world.rank] = peak_memory_mb();
    comm_allreduce_sum_double(&world, peaks, (size_t)world.size);
    comm_free(&world);
    return peaks;
}

static void print_rank_memory(const char *label, const double *peaks) {
    printf("%s", label);
    for (int r = 0; r < comm_world_size(); r++) printf(" %.1f", peaks[r]);
    printf(" MB");
}

// The FP8 / FP4 quantizers' state of every rank into t->state (rank 0 writes it with the
// trainer state): each rank's floats as bits, padded to the longest. Collective over the world.
static void gather_quant_state(Trainer *t) {
    Comm world = comm_world();
    int64_t mine = t->model.quant ? (int64_t)quant_context_state_floats(t->model.quant) : 0, longest = 0;
    int64_t *counts = mt_malloc((size_t)world.size * sizeof(int64_t));
    comm_allgather_int64(&world, &mine, counts, 1);
    for (int r = 0; r < world.size; r++) longest = MT_MAX(longest, counts[r]);
    free(t->state.quant_bits);
    free(t->state.quant_lengths);
    t->state.quant_bits = NULL;
    t->state.quant_lengths = counts;
    if (longest > 0) {
        float *floats = mt_calloc((size_t)longest, sizeof(float));
        int64_t *bits = mt_calloc((size_t)longest, sizeof(int64_t)), *all = mt_malloc((size_t)longest * world.size * sizeof(int64_t));
        if (mine) quant_context_state_save(t->model.quant, floats);
        for (int64_t i = 0; i < mine; i++) bits[i] = float_bits(floats[i]);
        comm_allgather_int64(&world, bits, all, (size_t)longest);
        t->state.quant_bits = mt_malloc((size_t)longest * world.size * sizeof(uint32_t));
        for (size_t i = 0; i < (size_t)longest * world.size; i++) t->state.quant_bits[i] = (uint32_t)all[i];
        t->state.quant_ranks = (size_t)world.size, t->state.quant_floats = (size_t)longest;
        free(floats), free(bits), free(all);
    }
    comm_free(&world);
}

// After --load: this rank's quantizers continue from the checkpoint's state when it has one
// for the same number of ranks and of this rank's size (the same quantizers and history
// length), else they start afresh (said on the console).
static void restore_quant_state(Trainer *t) {
    QuantContext *q = t->model.quant;
    size_t need = q ? quant_context_state_floats(q) : 0, rank = (size_t)comm_world_rank();
    if (!need) return;
    if (!t->state.quant_bits || !t->state.quant_lengths || t->state.quant_ranks != (size_t)comm_world_size() ||
        t->state.quant_lengths[rank] != (int64_t)need) {
        printf("note: the checkpoint has no FP8 / FP4 quantizer state for these quantizers on this layout (%zu ranks; "
               "a checkpoint of another recipe, history length or moetron version): the quantizers start afresh "
               "(amax histories empty, scales 1)\n", (size_t)comm_world_size());
        return;
    }
    float *floats = mt_malloc(need * sizeof(float));
    for (size_t i = 0; i < need; i++) floats[i] = bits_float(t->state.quant_bits[rank * t->state.quant_floats + i]);
    quant_context_state_load(q, floats);
    free(floats);
}

// Each rank reads its own tensors and the ranges of its optimizer shards (checkpoint_load).
static void load_checkpoint(Trainer *t, const char *resolved) {
    watchdog_io_begin();  // every rank reads its part; the collective below ends the phase
    checkpoint_load(resolved, &t->model, &t->opt, &t->state);
    double *peaks = rank_peak_memory();
    watchdog_io_end();
    print_rank_memory("memory: peak RSS per rank after loading:", peaks);
    printf("\n");
    free(peaks);
}

// A run that starts at iteration 0 from another model's weights (flag: --moe-use-upcycling or
// --finetune) needs a --save without checkpoints: its iterations would replace theirs.
static void require_fresh_save_dir(const Config *c, const char *flag) {
    if (c->save[0] && checkpoint_dir_has_checkpoints(c->save))
        mt_die("--save %s already holds checkpoints; --%s starts a new run at iteration 0 (it needs an empty --save), "
               "or resume it with --load %s and without --%s", c->save, flag, c->save, flag);
}

// --moe-use-upcycling: the model initialised, then the dense checkpoint's weights read into
// it (its MLPs into the experts: hf_weights.c), the routers set as Megatron-Core does; the
// run starts at step 0 with a new optimizer.
static void upcycle_checkpoint(Trainer *t, const char *resolved) {
    require_fresh_save_dir(t->cfg, "moe-use-upcycling");
    model_init_weights(&t->model, (uint64_t)t->cfg->seed);
    watchdog_io_begin();
    checkpoint_load(resolved, &t->model, NULL, NULL);
    watchdog_io_end();
    model_upcycle_routers(&t->model);
    printf("upcycled %s into %d experts per MoE layer (granularity %d)\n", resolved, t->cfg->num_experts,
           t->cfg->moe_upcycling_granularity);
}

// The first and last pipeline stage of this rank's pipeline, when they hold two copies of
// the embedding (a tied LM head, or multi-token prediction's table). Collective over the world.
static void make_tied_embedding_group(Trainer *t) {
    const Comm *pp = &t->groups.comm[PG_PP];
    const Config *c = t->cfg;
    t->tied_embedding = (Comm){.name = "embd"};
    if (pp->size == 1 || (c->untie_embeddings_and_output_weights && !c->mtp_num_layers)) return;  // the same on every rank
    int64_t me = comm_world_rank(), *stages = mt_malloc((size_t)pp->size * sizeof(int64_t));
    comm_allgather_int64(pp, &me, stages, 1);
    int ends[2] = {(int)stages[0], (int)stages[pp->size - 1]};  // the middle stages stay out
    t->tied_embedding = comm_group("embd", ends, 2);
    free(stages);
}

// The schedule of a step (and, with PP, room for its micro-batches).
static void setup_pipeline(Trainer *t) {
    const Config *c = t->cfg;
    const Comm *pp = &t->groups.comm[PG_PP];
    int M = c->num_micro_batches / t->dp->size;
    pipeline_init(&t->pipeline, &t->model, pp, M, c->microbatch_group_size_per_vp_stage,
                  c->overlap_moe_expert_parallel_comm, c->micro_batch_size, rank_seq_length(t));
    make_tied_embedding_group(t);
    t->step_batches = mt_calloc((size_t)M, sizeof(RankBatch));
    if (pp->size == 1) return;
    t->step_data = mt_calloc((size_t)M, sizeof(DataBatch));
    for (int mb = 0; mb < M; mb++) data_batch_alloc(&t->step_data[mb], c, c->micro_batch_size);
}

// The loss scaler of the flags; a dynamic one continues from a checkpoint's state.
static void setup_loss_scaler(Trainer *t) {
    loss_scaler_init(&t->scaler, t->cfg);
    if (t->state.loss_scaling && t->scaler.kind == LOSS_SCALING_DYNAMIC) t->scaler.state = t->state.loss_scaler;
    t->state.loss_scaling = t->scaler.kind != LOSS_SCALING_NONE;
    t->state.loss_scaler = t->scaler.state;
}

// The optimizer as a run starts it: this rank's shards of the state, fresh moments.
static void init_optimizer(Trainer *t) {
    FlatRange shards[REGIONS];
    int n_shards = grad_sync_shards(&t->sync, shards);
    OptimizerOptions options = optimizer_options(t->cfg);
    optimizer_init_ranges(&t->opt, &t->model.tt, shards, n_shards, &options);
}

// --load for training, as Megatron's flags say: everything (a resume); --finetune the
// weights only (iteration 0, fresh optimizer, schedule, random streams and data position;
// the quantizers' state is the model's and stays); --no-load-optim fresh AdamW moments, step
// count and loss scaler, the learning-rate schedule restarting here; --no-load-rng the random
// streams restarting here. The checkpoint is read whole (its F32 master weights are the
// weights), then the optimizer made afresh.
static void load_training_checkpoint(Trainer *t, const char *resolved) {
    const Config *c = t->cfg;
    if (c->finetune) require_fresh_save_dir(c, "finetune");
    load_checkpoint(t, resolved);
    if (c->finetune || c->no_load_optim) {
        optimizer_free(&t->opt);
        init_optimizer(t);
        t->state.loss_scaling = 0;
        t->state.overflow_skips = 0;
        t->state.lr_schedule_start = t->state.iteration;
    }
    if (c->finetune) {
        TrainerState fresh = {.quant_bits = t->state.quant_bits, .quant_ranks = t->state.quant_ranks,
                              .quant_floats = t->state.quant_floats, .quant_lengths = t->state.quant_lengths};
        t->state = fresh;
    }
    if (c->no_load_rng) t->state.rng_start_sample = t->state.consumed_train_samples;
    restore_quant_state(t);
    printf("loaded %s (iteration %ld%s%s%s)\n", resolved, t->state.iteration,
           c->finetune ? "; --finetune: the weights only, from iteration 0" : "",
           c->no_load_optim && !c->finetune ? "; --no-load-optim: a fresh optimizer and learning-rate schedule" : "",
           c->no_load_rng && !c->finetune ? "; --no-load-rng: fresh random streams" : "");
}

static void trainer_setup(Trainer *t, Config *c) {
    memset(t, 0, sizeof(*t));
    t->cfg = c;
    char resolved[MT_PATH_MAX + 32];
    if (c->load[0]) {
        checkpoint_resolve(resolved, c->load);
        config_from_checkpoint(c, resolved);
    }
    t->tokenizer = run_tokenizer_open(c);  // before any work: checkpoints carry what is read here
    tb_check_dir(c->tensorboard_dir);
    setup_parallel(t);
    if (comm_world_size() > 1) {
        watchdog_start(60 * c->distributed_timeout_minutes);
        ops_set_between_ops(comm_progress);  // transfers in flight move on while the ops compute
    }
    if (comm_world_rank() != 0) {  // one process reports and saves; every rank computes the same
        c->log_jsonl[0] = 0;
        if (!freopen("/dev/null", "w", stdout)) mt_die("cannot silence the output of rank %d", comm_world_rank());
    }
    ModelGroups groups = plan_model_groups(&t->groups);
    model_describe(&t->model, c, &groups);
    model_parameter_counts(c, &t->parameters, &t->active_parameters);
    setup_pipeline(t);
    GradGroups grad_groups = plan_grad_groups(&t->groups);
    // before the large buffers exist (the same plan as `moetron plan`'s)
    t->memory_need = memory_plan(c, &t->model, &t->pipeline, &grad_groups, device_active() == DEVICE_CUDA);
    memory_check_fits(&t->memory_need);
    grad_sync_init(&t->sync, &grad_groups, &t->model.tt, c->use_distributed_optimizer, config_all_layers(c) + 2);
    model_allocate(&t->model);
    init_optimizer(t);
    if (c->load[0] && c->moe_use_upcycling) {
        upcycle_checkpoint(t, resolved);
    } else if (c->load[0]) {
        load_training_checkpoint(t, resolved);
    } else {
        model_init_weights(&t->model, (uint64_t)c->seed);
    }
    dataset_open(&t->data, c);
    t->model.routing_trace = routing_trace_open(c, c->num_experts, c->moe_router_topk);
    // --save created, proved writable and locked once everything else has been checked, so
    // that a run refused at start-up leaves no directory behind; rank 0 writes
    if (c->save[0] && comm_world_rank() == 0) checkpoint_claim_save_dir(c->save);
    pipeline_allocate(&t->pipeline);
    prefetch_start(&t->prefetch, &t->data, c, c->micro_batch_size);
    data_batch_alloc(&t->eval_batch, c, c->micro_batch_size);
    t->layer_stats = mt_calloc(config_all_layers(c), sizeof(RouterStats));
    t->layer_counts = mt_calloc((size_t)config_all_layers(c) * MT_MAX(c->num_experts, 1), sizeof(int64_t));
    t->mtp_loss = mt_calloc((size_t)MT_MAX(c->mtp_num_layers, 1), sizeof(double));
    setup_loss_scaler(t);
    metrics_open(&t->metrics, c, t->state.iteration, comm_world_rank() == 0);  // rank 0 writes the logs
    t->flops_per_token = model_train_flops_per_token(c);
    t->peak_flops = c->peak_tflops > 0 ? c->peak_tflops * 1e12 : measure_gemm_ceiling_flops();
}

static void trainer_free(Trainer *t) {
    metrics_close(&t->metrics);
    free(t->state.quant_bits);
    free(t->state.quant_lengths);
    free(t->layer_stats);
    free(t->mtp_loss);
    free(t->layer_counts);
    prefetch_stop(&t->prefetch);
    data_batch_free(&t->eval_batch);
    for (int mb = 0; t->step_data && mb < t->pipeline.schedule.micro_batches; mb++)
        data_batch_free(&t->step_data[mb]);
    pipeline_free(&t->pipeline);
    free(t->step_data);
    free(t->step_batches);
    comm_free(&t->tied_embedding);
    dataset_free(&t->data);
    run_tokenizer_free(t->tokenizer);
    parallel_groups_free(&t->groups);
    optimizer_free(&t->opt);
    grad_sync_free(&t->sync);
    routing_trace_close(t->model.routing_trace);
    model_free(&t->model);
}

// Threads each process computes with: OpenMP's, or 1 in a build without it.
static int compute_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// "2 processes x 1 thread; layout TP1 CP1 PP1 DP2 | EP2 ETP1 EDP1"
static void print_layout(const ParallelSizes *ps) {
    int threads = compute_threads();
    printf("%d process%s x %d thread%s; layout TP%d CP%d PP%d DP%d | EP%d ETP%d EDP%d\n", ps->world,
           ps->world == 1 ? "" : "es", threads, threads == 1 ? "" : "s", ps->tp, ps->cp, ps->pp, ps->dp, ps->ep,
           ps->etp, ps->edp);
}

static void print_banner(const Trainer *t) {
    const Config *c = t->cfg;
    printf("moetron train: %s family, %d layers, hidden %d, %d experts top-%d, %.2fM parameters (%.2fM active), "
           "%s\n",
           hf_model_type(t->model.family), c->num_layers, c->hidden_size, c->num_experts, c->moe_router_topk,
           t->parameters / 1e6, t->active_parameters / 1e6, t->data.source);
    if (t->data.reading[0]) printf("data: %s\n", t->data.reading);
    printf("batch %d sequences x %d tokens (%d micro-batches of %d); %ld of %d steps done; MFU peak %.3f TFLOP/s "
           "(%s: %s%s)\n",
           c->global_batch_size, c->seq_length, c->num_micro_batches, c->micro_batch_size, t->state.iteration,
           c->train_iters, t->peak_flops / 1e12, device_active() == DEVICE_CUDA ? "device" : "gemm",
           device_active() == DEVICE_CUDA ? device_description() : mt_gemm_kernel(),
           device_active() == DEVICE_CUDA && config_gemm_inputs(c) ? (c->bf16 ? ", bf16 GEMM inputs" : ", fp16 GEMM inputs") : "");
    if (t->scaler.kind != LOSS_SCALING_NONE)
        printf("loss scaling: %s, scale %g%s\n", loss_scaler_kind_name(&t->scaler), t->scaler.state.scale,
               t->scaler.kind == LOSS_SCALING_DYNAMIC ? " (halves after --hysteresis overflows, doubles after "
                                                        "--loss-scale-window steps without one)" : "");
    print_layout(&t->groups.sizes);
    memory_need_print(&t->memory_need);
    if (t->opt.offloaded)
        printf("optimizer: the state of %d of %d tensor shards (%zu elements) in host memory, stepped on the cpu\n",
               t->opt.offloaded, t->opt.n_fragments, t->opt.offload_elements);
    if (t->model.family_note[0])
        printf("note: checkpoints use moetron's own model_type (transformers cannot load them): %s\n",
               t->model.family_note);
    fflush(stdout);
}

// Rank 0 writes the global checkpoint tensor by tensor; every rank hands it the pieces it
// holds (its experts, its shards of the moments) as each tensor comes (ckpt_shards.h).
// MOETRON_TEST_SLOW_SAVE_S=N (for tests/cli/test_reliability.sh): rank 0's first save takes
// N seconds longer, as writing a very large checkpoint would, while the others wait.
static void slow_first_save_for_test(void) {
    static int done;
    const char *v = getenv("MOETRON_TEST_SLOW_SAVE_S");
    if (done || !v || comm_world_rank() != 0) return;
    done = 1;
    struct timespec pause = {.tv_sec = atoi(v)};
    while (nanosleep(&pause, &pause) && errno == EINTR) continue;
}

// Every rank saves together (the ranks holding pieces send them to rank 0, which writes), so
// the waits while rank 0 writes are I/O the job knows about, not a stuck rank
// (--distributed-timeout-minutes); the phase ends with a collective inside the bracket.
static void save_checkpoint(Trainer *t) {
    watchdog_io_begin();
    double *before = rank_peak_memory();
    slow_first_save_for_test();
    gather_quant_state(t);
    CkptShards shards;
    ckpt_shards_open(&shards, &t->model, &t->opt, &t->sync);
    CkptSource src = ckpt_shards_source(&shards);
    checkpoint_save_from(t->cfg->save, &shards.global, &src, &t->state);
    ckpt_shards_close(&shards);
    double *after = rank_peak_memory();
    watchdog_io_end();
    printf("saved checkpoint %s/iter_%07ld\n", t->cfg->save, t->state.iteration);
    run_summary_saved(&t->summary, t->state.iteration);
    print_rank_memory("memory: peak RSS per rank before saving:", before);
    print_rank_memory("; with the save:", after);
    printf("\n");
    fflush(stdout);
    free(before);
    free(after);
}

// The gradient norm over every rank's gradients (a collective: counted as communication).
static double global_grad_norm(Trainer *t) {
    PROF_SCOPE(PROF_GRAD_SYNC);
    double t0 = now_seconds();
    double norm = grad_sync_norm(&t->sync, &t->model.tt);
    t->comm_s += now_seconds() - t0;
    return norm;
}

// After the optimizer step: every rank gets the parameters others updated.
static void gather_params(Trainer *t) {
    PROF_SCOPE(PROF_GRAD_SYNC);
    double t0 = now_seconds();
    grad_sync_gather_params(&t->sync, &t->model.tt);
    t->comm_s += now_seconds() - t0;
}

// --profile: the steps after the first (warm-up) are profiled; evaluation and saving are not.
typedef struct {
    int on;
    double seconds;  // wall time of the profiled steps
    long steps;
} StepProfile;

static void profile_step_done(StepProfile *p, long step, long first_step, long last_step, double step_time) {
    if (!p->on) return;
    if (step == first_step && last_step > first_step) {  // warm-up: start counting from the next step
        prof_reset();
        op_profile_reset();
        return;
    }
    p->seconds += step_time;
    p->steps++;
}

static void profile_print(const StepProfile *p) {
    if (!p->on || p->steps == 0) return;
    printf("profile: %ld steps, %.3f s (--profile; the first step is warm-up)\n", p->steps, p->seconds);
    prof_print(p->seconds);
    op_profile_print(p->seconds);
}

// With loss scaling: the summed gradients times 1/scale, before their norm is taken.
static void unscale_grads(Trainer *t) {
    if (t->scaler.kind == LOSS_SCALING_NONE) return;
    vec_scale(t->model.tt.grads, loss_scaler_inv_scale(&t->scaler), t->model.tt.total);
}

// The zeros among the clipped gradients (--log-num-zeros-in-grad; a collective: counted as
// communication).
static long long count_zeros_in_grad(Trainer *t) {
    PROF_SCOPE(PROF_GRAD_SYNC);
    double t0 = now_seconds();
    long long zeros = grad_sync_count_zeros(&t->sync, &t->model.tt);
    t->comm_s += now_seconds() - t0;
    return zeros;
}

// Applies the step's gradients unless the step is skipped (a non-finite loss or norm; with
// loss scaling, an overflow of the gradients alone is no error: *overflow is set and the
// scale adapts): then the batch's router bookkeeping is dropped too, except after an
// overflow of a finite loss's scaled gradients, which still updates the expert biases as
// Megatron does. Returns whether it was skipped. With --log-num-zeros-in-grad, *num_zeros is
// the applied gradients' zeros, counted after clipping as Megatron counts them (-1 when skipped).
static int apply_update(Trainer *t, RunControl *rc, long step, double loss, double grad_norm, double lr,
                        int *overflow, long long *num_zeros) {
    *overflow = t->scaler.kind != LOSS_SCALING_NONE && !isfinite(grad_norm);
    int skipped = *overflow && isfinite(loss) ? 1 : run_control_skip_step(rc, step, loss, grad_norm);
    if (t->scaler.kind != LOSS_SCALING_NONE) {
        loss_scaler_update(&t->scaler, *overflow);
        t->state.loss_scaler = t->scaler.state;
        t->state.overflow_skips += *overflow;
    }
    *num_zeros = -1;
    if (!skipped) {
        double clip = optimizer_clip_coeff(t->cfg, grad_norm);
        if (t->cfg->log_num_zeros_in_grad) {  // counted among the clipped gradients: clipped in place first
            optimizer_scale_grads(&t->opt, &t->model.tt, clip);
            clip = 1;
            *num_zeros = count_zeros_in_grad(t);
        }
        optimizer_step(&t->opt, &t->model.tt, t->cfg, lr, clip);  // AdamW multiplies by clip as it reads
        gather_params(t);
    }
    // the expert-bias update from this batch's token counts, also after an overflow of the
    // scaled gradients (Megatron makes it with the gradients' reductions, before its optimizer
    // looks for infinities); not after a non-finite loss, whose router statistics may be too
    model_end_global_batch(&t->model, !skipped || (*overflow && isfinite(loss)));
    return skipped;
}

// What a finished step reports besides its losses.
typedef struct {
    long step, first_step;
    double loss, grad_norm, lr, step_s, elapsed_s, data_wait_s;
    double loss_scale;  // after the step's update of it (what Megatron logs)
    long long num_zeros;  // --log-num-zeros-in-grad: the applied gradients' zeros, else -1
    int skipped, overflow, loss_spike, threads;
} StepOutcome;

// The seconds of the forward's and backward's token exchanges since the last call (take:
// exposed or hidden); a recomputed forward's exchanges repeat the forward's and do not count.
static double expert_comm_seconds(Model *m, double (*take)(struct EpBuffers *)) {
    double s = take(m->ep_buffers[PASS_FORWARD]) + take(m->ep_buffers[PASS_BACKWARD]);
    take(m->ep_buffers[PASS_RECOMPUTE]);
    return s;
}

static void log_step(Trainer *t, const StepLosses *s, const StepOutcome *o) {
    const Config *c = t->cfg;
    double tokens_per_step = (double)c->global_batch_size * c->seq_length;
    double flops = tokens_per_step * t->flops_per_token / o->step_s;
    int moe_layers = model_moe_layers(c);
    StepRecord r = {.step = o->step, .consumed_samples = t->state.consumed_train_samples,
                    .batch_size = c->global_batch_size, .world_size = comm_world_size(),
                    .has_params_norm = c->log_params_norm,
                    .params_norm = c->log_params_norm ? grad_sync_params_norm(&t->sync, &t->model.tt) : 0,
                    .has_num_zeros = o->num_zeros >= 0, .num_zeros = o->num_zeros,
                    .loss = o->loss, .lm_loss = s->lm_loss, .router = s->router,
                    .mtp_loss = s->mtp_loss, .mtp_depths = s->mtp_depths,
                    .balance_coeff = c->balance_coeff, .z_loss_coeff = c->moe_z_loss_coeff,
                    .layers = c->moe_per_layer_logging ? s->layers : NULL,
                    .n_layers = c->moe_per_layer_logging ? moe_layers : 0,
                    .tokens_per_expert = s->counts, .num_experts = c->num_experts,
                    .grad_norm = o->grad_norm, .lr = o->lr, .tokens_per_s = tokens_per_step / o->step_s,
                    .tflops = flops / 1e12, .mfu = flops / t->peak_flops,
                    .mem_peak_mb = peak_memory_mb(), .elapsed_s = o->elapsed_s, .step_s = o->step_s,
                    .data_wait_s = o->data_wait_s, .threads = o->threads, .grad_comm_s = t->comm_s,
                    .grad_comm_hidden_s = t->comm_hidden_s, .expert_comm_s = expert_comm_seconds(&t->model, ep_take_comm_seconds),
                    .expert_comm_hidden_s = expert_comm_seconds(&t->model, ep_take_hidden_seconds),
                    .pipeline = t->groups.sizes.pp > 1, .pp_bubble_s = t->bubble_s, .pp_bubble = t->bubble,
                    .pp_bubble_ideal = pp_schedule_ideal_bubble(&t->pipeline.schedule),
                    .tp_bytes = comm_bytes_take("tp") + comm_bytes_take("kv"),
                    .expert_bytes = comm_bytes_take("ep") + comm_bytes_take("etp") + comm_bytes_take("etp_ep"),
                    .cp_bytes = comm_bytes_take("cp") + comm_bytes_take("cp_inner") + comm_bytes_take("cp_outer"),
                    .dp_bytes = comm_bytes_take("dp") + comm_bytes_take("dp_cp") + comm_bytes_take("edp"),
                    .pp_bytes = comm_bytes_take("pp") + comm_bytes_take("embd"),
                    .skipped = o->skipped, .overflow = o->overflow, .loss_spike = o->loss_spike,
                    .loss_scaling = t->scaler.kind != LOSS_SCALING_NONE, .loss_scale = o->loss_scale,
                    .eta_s = o->elapsed_s / (o->step - o->first_step + 1) * (c->train_iters - o->step)};
    metrics_log_step(&t->metrics, &r);
    if (metrics_console_due(&t->metrics, r.step, r.skipped || r.loss_spike)) run_summary_step(&t->summary, &r);
}

int train_main(Config *c) {
    RunControl rc;  // first: a signal during start-up stops the run after its first step
    run_control_init(&rc, c, now_seconds());
    Trainer t;
    trainer_setup(&t, c);
    print_banner(&t);
    double start = now_seconds();
    long first_step = t.state.iteration + 1;
    long last_saved = c->load[0] ? t.state.iteration : -1;
    int save_due = 0;  // a save scheduled, or postponed by a streak of skipped steps
    StepProfile profile = {.on = c->profile};
    prof_enable(profile.on);
    Comm world = comm_world();
    ThreadGovernor threads;
    thread_governor_init(&threads, c->adapt_threads);
    for (long step = first_step; step <= c->train_iters; step++) {
        thread_governor_before_step(&threads);
        double t0 = now_seconds(), waited0 = t.prefetch.waited_s;
        t.comm_s = t.comm_hidden_s = 0;
        expert_comm_seconds(&t.model, ep_take_comm_seconds);
        expert_comm_seconds(&t.model, ep_take_hidden_seconds);
        comm_bytes_reset();
        StepLosses s = train_step_micro_batches(&t);
        unscale_grads(&t);
        StepOutcome o = {.step = step, .first_step = first_step, .grad_norm = global_grad_norm(&t),
                         .loss = s.lm_loss + s.aux_objective + s.mtp_objective,
                         .lr = lr_at(c, step - 1 - t.state.overflow_skips - t.state.lr_schedule_start)};
        o.skipped = apply_update(&t, &rc, step, o.loss, o.grad_norm, o.lr, &o.overflow, &o.num_zeros);
        o.loss_scale = t.scaler.state.scale;
        o.loss_spike = !o.skipped && run_control_loss_spike(&rc, step, o.loss);
        t.state.iteration = step;
        double now = now_seconds();
        o.step_s = now - t0, o.elapsed_s = now - start, o.data_wait_s = t.prefetch.waited_s - waited0;
        o.threads = thread_governor_step_threads(&threads);
        thread_governor_after_step(&threads, o.step_s);
        profile_step_done(&profile, step, first_step, c->train_iters, o.step_s);
        prof_enable(0);  // evaluation and saving are not part of the steps
        if (metrics_step_due(&t.metrics, step, o.skipped || o.loss_spike)) log_step(&t, &s, &o);
        if (c->eval_interval > 0 && c->eval_iters > 0 && (step % c->eval_interval == 0 || step == c->train_iters)) {
            double loss = evaluate(&t);
            metrics_log_eval(&t.metrics, step, t.state.consumed_train_samples, loss);
            run_summary_eval(&t.summary, step, loss);
        }
        const char *stop = step < c->train_iters ? run_control_stop_reason(&rc, step, &world) : NULL;
        save_due |= c->save[0] && ((c->save_interval > 0 && step % c->save_interval == 0) || stop);
        int saved = save_due && run_control_may_save(&rc, step);
        if (saved) {
            save_checkpoint(&t);
            last_saved = step;
            save_due = 0;
        }
        if (stop) {
            printf("exiting at step %ld: %s%s\n", step, stop,
                   saved ? " (saved)" : c->save[0] ? " (not saved: the step was skipped as not finite)" : "");
            break;
        }
        prof_enable(profile.on);
    }
    if (c->save[0] && last_saved != t.state.iteration && run_control_may_save(&rc, t.state.iteration))
        save_checkpoint(&t);
    double total = now_seconds() - start;
    printf("data: training waited %.2f s for data in all (%.1f%% of %.1f s)\n", t.prefetch.waited_s,
           total > 0 ? 100 * t.prefetch.waited_s / total : 0, total);
    run_summary_print(&t.summary, t.state.iteration - first_step + 1, total, c->save);
    profile_print(&profile);
    comm_free(&world);
    trainer_free(&t);
    return 0;
}
