// metrics_tensorboard.c — the tags of Megatron-LM's training_log (training.py), of its MoE
// metrics tracker (moe/moe_logging.py: the aggregates and moe/<name>_layer_<l>) and of its
// MTP logging ("mtp_<k> loss"), plus moetron's per-layer expert load under moe/layer_<l>/.
#include "train/metrics_tensorboard.h"

#include <stdio.h>

#include "core/tb_event.h"

enum { BYTES_PER_MIB = 1 << 20 };

// The tag at step, and "<tag> vs samples" at the consumed samples (Megatron writes both).
static void scalar_and_vs_samples(TbWriter *tb, const char *tag, double value, long step, int64_t samples) {
    char vs[TB_TAG_MAX];
    tb_scalar(tb, tag, value, step);
    snprintf(vs, sizeof(vs), "%s vs samples", tag);
    tb_scalar(tb, vs, value, samples);
}

// Megatron's names of the load-balancing losses (aux_loss, seq_aux_loss, global_aux_loss).
static const char *const BALANCE_TAGS[3] = {"load_balancing_loss", "seq_load_balancing_loss",
                                            "global_load_balancing_loss"};

// load_balancing_loss always (the JSONL's aux_loss), the other types when on.
static int balance_logged(const StepRecord *r, int type) { return type == 0 || r->balance_coeff[type] > 0; }

// One MoE layer: Megatron's moe/<loss>_layer_<l>, and its expert load under moe/layer_<l>/.
static void layer_scalars(TbWriter *tb, const StepRecord *r, const RouterStats *s, const int64_t *counts) {
    char tag[TB_TAG_MAX];
    for (int t = 0; t < 3; t++)
        if (balance_logged(r, t)) {
            snprintf(tag, sizeof(tag), "moe/%s_layer_%d", BALANCE_TAGS[t], s->layer);
            tb_scalar(tb, tag, s->balance[t], r->step);
        }
    snprintf(tag, sizeof(tag), "moe/z_loss_layer_%d", s->layer);
    tb_scalar(tb, tag, s->z_loss, r->step);
    snprintf(tag, sizeof(tag), "moe/layer_%d/load_imbalance", s->layer);
    tb_scalar(tb, tag, s->load_imbalance, r->step);
    snprintf(tag, sizeof(tag), "moe/layer_%d/dropped_frac", s->layer);
    tb_scalar(tb, tag, s->dropped_frac, r->step);
    snprintf(tag, sizeof(tag), "moe/layer_%d/dropped_tokens", s->layer);
    tb_scalar(tb, tag, (double)s->dropped_tokens, r->step);
    for (int e = 0; e < r->num_experts; e++) {
        snprintf(tag, sizeof(tag), "moe/layer_%d/tokens_per_expert/expert_%d", s->layer, e);
        tb_scalar(tb, tag, (double)counts[e], r->step);
    }
}

static void moe_scalars(TbWriter *tb, const StepRecord *r) {
    if (r->num_experts == 0) return;
    for (int t = 0; t < 3; t++)
        if (balance_logged(r, t)) tb_scalar(tb, BALANCE_TAGS[t], r->router.balance[t], r->step);
    tb_scalar(tb, "z_loss", r->router.z_loss, r->step);
    tb_scalar(tb, "moe/load_imbalance", r->router.load_imbalance, r->step);
    tb_scalar(tb, "moe/dropped_frac", r->router.dropped_frac, r->step);
    for (int l = 0; l < r->n_layers; l++)
        layer_scalars(tb, r, &r->layers[l], r->tokens_per_expert + (size_t)l * r->num_experts);
}

void tensorboard_log_step(TbWriter *tb, const Config *c, const StepRecord *r) {
    long step = r->step;
    int64_t samples = r->consumed_samples;
    scalar_and_vs_samples(tb, "lm loss", r->lm_loss, step, samples);
    for (int k = 0; k < r->mtp_depths; k++) {
        char tag[TB_TAG_MAX];
        snprintf(tag, sizeof(tag), "mtp_%d loss", k + 1);
        tb_scalar(tb, tag, r->mtp_loss[k], step);
    }
    scalar_and_vs_samples(tb, "learning-rate", r->lr, step, samples);
    scalar_and_vs_samples(tb, "batch-size", r->batch_size, step, samples);
    if (c->log_loss_scale_to_tensorboard)
        scalar_and_vs_samples(tb, "loss-scale", r->loss_scaling ? r->loss_scale : 1.0, step, samples);
    if (c->log_world_size_to_tensorboard) scalar_and_vs_samples(tb, "world-size", r->world_size, step, samples);
    scalar_and_vs_samples(tb, "grad-norm", r->grad_norm, step, samples);
    if (r->has_params_norm) scalar_and_vs_samples(tb, "params-norm", r->params_norm, step, samples);
    if (r->has_num_zeros) scalar_and_vs_samples(tb, "num-zeros", (double)r->num_zeros, step, samples);
    if (c->log_memory_to_tensorboard) tb_scalar(tb, "mem-peak-resident-bytes", r->mem_peak_mb * BYTES_PER_MIB, step);
    if (c->log_timers_to_tensorboard) {
        tb_scalar(tb, "iteration-time", r->step_s, step);
        if (c->log_throughput) tb_scalar(tb, "throughput", r->tflops / r->world_size, step);
    }
    moe_scalars(tb, r);
    tb_flush(tb);
}

void tensorboard_log_eval(TbWriter *tb, const Config *c, long step, int64_t consumed_samples, double loss, double ppl) {
    scalar_and_vs_samples(tb, "lm loss validation", loss, step, consumed_samples);
    if (c->log_validation_ppl_to_tensorboard)
        scalar_and_vs_samples(tb, "lm loss validation ppl", ppl, step, consumed_samples);
    tb_flush(tb);
}
