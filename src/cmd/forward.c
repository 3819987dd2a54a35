// forward.c — `moetron forward`: run one batch through a checkpoint and dump logits,
// loss, routing (and with --grads every parameter gradient) to safetensors, so that
// any other implementation can be checked against moetron. See docs/forward-dump.md.
// The dumped tensors come from tensor memory through one download each (stw_add_*download).
#include <stdio.h>
#include <string.h>

#include "cmd/commands.h"
#include "cmd/load_model.h"
#include "core/safetensors.h"
#include "ops/ops.h"

typedef struct {
    int B, T;
    int32_t *tokens, *targets;  // (B·T)
    real *loss_mask;            // (B·T)
} ForwardInput;

// Read an integer tensor [B,T] (I32 or I64) as int32.
static int32_t *read_token_tensor(const StFile *f, const StTensor *t, const char *path, const char *name, int *B,
                                  int *T) {
    if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0)
        mt_die("%s: %s must have shape [B,T] with B, T > 0", path, name);
    if (t->dtype != ST_I32 && t->dtype != ST_I64) mt_die("%s: %s must be I32 or I64, not %s", path, name, st_dtype_name(t->dtype));
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    size_t n = (size_t)*B * *T;
    int32_t *out = mt_malloc(n * sizeof(int32_t));
    const void *data = st_data(f, t);
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (t->dtype == ST_I32) {
            int32_t x;
            memcpy(&x, (const char *)data + 4 * i, 4);
            v = x;
        } else {
            memcpy(&v, (const char *)data + 8 * i, 8);
        }
        if (v < -2147483647LL || v > 2147483647LL) mt_die("%s: %s value %lld out of range", path, name, (long long)v);
        out[i] = (int32_t)v;
    }
    return out;
}

// A `moetron data --dump` file: tokens [B, T+1], Megatron samples; the inputs are
// sample[:-1] and the labels sample[1:], as in training.
static void split_samples(ForwardInput *in, const StFile *f, const StTensor *t, const char *path) {
    int B, W;
    int32_t *samples = read_token_tensor(f, t, path, "tokens", &B, &W);
    if (W < 2) mt_die("--input %s: tokens [%d, %d] needs at least 2 tokens per sample (inputs and labels)", path, B, W);
    in->B = B, in->T = W - 1;
    size_t n = (size_t)B * in->T;
    in->tokens = mt_malloc(n * sizeof(int32_t));
    in->targets = mt_malloc(n * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        for (int pos = 0; pos < in->T; pos++) {
            in->tokens[(size_t)b * in->T + pos] = samples[(size_t)b * W + pos];
            in->targets[(size_t)b * in->T + pos] = samples[(size_t)b * W + pos + 1];
        }
    free(samples);
}

// input_ids [B,T] with optional labels (next tokens without them; the last position has none).
static void read_ids_and_labels(ForwardInput *in, const StFile *f, const StTensor *ids, const char *path) {
    in->tokens = read_token_tensor(f, ids, path, "input_ids", &in->B, &in->T);
    size_t n = (size_t)in->B * in->T;
    const StTensor *labels = st_find(f, "labels");
    if (labels) {
        int B, T;
        in->targets = read_token_tensor(f, labels, path, "labels", &B, &T);
        if (B != in->B || T != in->T) mt_die("--input %s: labels must have the shape of input_ids", path);
    } else {
        in->targets = mt_malloc(n * sizeof(int32_t));
        for (size_t i = 0; i < n; i++) in->targets[i] = (i + 1) % in->T ? in->tokens[i + 1] : -100;
    }
}

static void read_forward_input(ForwardInput *in, const char *path, const Config *c) {
    StFile f;
    char err[512];
    if (st_open(&f, path, err, sizeof(err))) mt_die("--input %s: %s", path, err);
    const StTensor *ids = st_find(&f, "input_ids"), *samples = st_find(&f, "tokens");
    if (ids) read_ids_and_labels(in, &f, ids, path);
    else if (samples) split_samples(in, &f, samples, path);
    else
        mt_die("--input %s has neither input_ids (I32 [B,T], optional labels) nor tokens (a `moetron data --dump` "
               "file, I32 [B,T+1])", path);
    size_t n = (size_t)in->B * in->T;
    if (in->T > c->max_positions) mt_die("--input %s: T = %d exceeds the model's %d positions", path, in->T, c->max_positions);
    for (size_t i = 0; i < n; i++)
        if (in->tokens[i] < 0 || in->tokens[i] >= c->padded_vocab_size)
            mt_die("--input %s: input_ids holds %d, outside the vocabulary [0, %d)", path, in->tokens[i], c->padded_vocab_size);
    in->loss_mask = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) {
        if (in->targets[i] >= c->padded_vocab_size)
            mt_die("--input %s: labels holds %d, outside the vocabulary", path, in->targets[i]);
        in->loss_mask[i] = in->targets[i] >= 0;  // negative label: no loss here (HF uses -100)
        if (in->targets[i] < 0) in->targets[i] = 0;
    }
    st_close(&f);
}

static void add_moe_layer_outputs(StWriter *w, const Model *m, const ModelActs *a, int l) {
    const MoeActs *ma = &a->layers[l].moe;
    const Config *c = &m->cfg;
    char name[MT_NAME_MAX];
    int64_t rows_e[2] = {a->N, c->num_experts}, rows_k[2] = {a->N, c->moe_router_topk}, experts[1] = {c->num_experts};
    snprintf(name, sizeof(name), "layers.%d.router_logits", l);
    stw_add_real_download(w, name, 2, rows_e, ma->logits);
    snprintf(name, sizeof(name), "layers.%d.router_topk_idx", l);
    stw_add_download(w, name, ST_I32, 2, rows_k, ma->route.topk_idx);
    snprintf(name, sizeof(name), "layers.%d.router_probs", l);
    stw_add_real_download(w, name, 2, rows_k, ma->route.topk_probs);
    snprintf(name, sizeof(name), "layers.%d.tokens_per_expert", l);
    stw_add_download(w, name, ST_I32, 1, experts, ma->route.tokens_per_expert);
    for (int t = 0; t < BALANCE_TYPES; t++) {  // L / coeff of every balance loss, whether enabled or not
        real value = (real)ma->route.balance_loss[t];
        snprintf(name, sizeof(name), "layers.%d.%s", l, BALANCE_TYPE_NAMES[t]);
        stw_add_real(w, name, 0, NULL, &value);  // copied on add
    }
    real z = (real)ma->route.z_loss;
    snprintf(name, sizeof(name), "layers.%d.z_loss", l);
    stw_add_real(w, name, 0, NULL, &z);
    if (m->layers[l].expert_bias >= 0) {
        snprintf(name, sizeof(name), "layers.%d.expert_bias", l);
        stw_add_real_download(w, name, 1, experts, tt_param(&m->tt, m->layers[l].expert_bias));
    }
}

// Each multi-token-prediction depth's logits and loss (with targets).
static void add_mtp_outputs(StWriter *w, const ModelActs *a, const int64_t *logits_shape) {
    for (int k = 0; k < a->mtp_depths && a->input.targets; k++) {
        char name[64];
        snprintf(name, sizeof(name), "mtp.%d.logits", k);
        stw_add_real_download(w, name, 3, logits_shape, a->mtp[k].logits);
        real loss = (real)a->mtp_loss[k];
        snprintf(name, sizeof(name), "mtp.%d.loss", k);
        stw_add_real(w, name, 0, NULL, &loss);
    }
}

int forward_main(Config *c) {
    if (!c->input[0] || !c->dump[0]) mt_die("moetron forward needs --input IN.safetensors and --dump OUT.safetensors");
    Model m;
    load_model_for_inference(&m, c);
    ForwardInput in;
    read_forward_input(&in, c->input, c);
    ModelActs a;
    acts_alloc(&a, &m, in.B, in.T);
    Batch batch = {.B = in.B, .T = in.T, .tokens = in.tokens, .targets = in.targets, .loss_mask = in.loss_mask};
    model_forward(&m, &a, &batch, NULL, 0);
    StWriter w;
    stw_init(&w);
    int64_t logits_shape[3] = {in.B, in.T, c->padded_vocab_size};
    stw_add_real_download(&w, "logits", 3, logits_shape, a.logits);
    real loss = (real)a.lm_loss;
    stw_add_real(&w, "loss", 0, NULL, &loss);
    for (int l = 0; l < config_all_layers(c); l++)
        if (m.layers[l].is_moe) add_moe_layer_outputs(&w, &m, &a, l);
    add_mtp_outputs(&w, &a, logits_shape);
    if (c->grads) {  // gradient of the training objective: lm_loss + Σ coeff·aux + MTP's share
        vec_zero(m.tt.grads, m.tt.total);
        model_backward(&m, &a, &batch, 1.0);
        char name[MT_NAME_MAX + 8];
        for (int i = 0; i < m.tt.count; i++) {
            const TensorDesc *d = &m.tt.descs[i];
            snprintf(name, sizeof(name), "grad.%s", d->name);
            stw_add_real_download(&w, name, d->ndim, d->shape, tt_grad(&m.tt, i));
        }
    }
    char err[512];
    if (stw_finish(&w, c->dump, err, sizeof(err))) mt_die("--dump %s: %s", c->dump, err);
    printf("wrote %s (B=%d, T=%d, loss %.6f)\n", c->dump, in.B, in.T, a.lm_loss);
    acts_free(&a);
    free(in.tokens);
    free(in.targets);
    free(in.loss_mask);
    model_free(&m);
    return 0;
}
