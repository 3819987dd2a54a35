// router_probe.c — run moetron's router on given logits and write everything it computes,
// for tests/conformance/megatron_router.py (comparison against Megatron-Core).
//
// usage: router_probe IN.safetensors OUT.safetensors [moetron train flags...]
//
// IN:  logits                (N,E)  F64 or F32, rows in moetron's token order b·T+t
//      expert_bias           (E)    optional; needs --moe-router-enable-expert-bias
//                                   (the flag without the tensor means a zero bias)
//      dprobs                (N,k)  optional; when present router_backward runs (loss scale 1)
//      qb_bias               (E)    optional; quantile balancing's bias (default 0)
//      global_counts_before  (E)    optional; global_aux_loss counts of the earlier
//                                   micro-batches, with global_batches_before (metadata entry
//                                   or a scalar tensor; default 1)
// The router runs as in training (Sinkhorn routing balances). The router flags are
// moetron's own (--num-experts, --moe-router-topk, ...); --seq-length is
// the tokens per sequence for seq_aux_loss and must divide N.
// OUT: topk_idx, kept (I32 N,k), topk_probs (F32 N,k), scores, aux_scores (F32 N,E),
//      tokens_per_expert, aux_counts (I32 E), seq_counts (I32 N/T,E), global_counts (F64 E),
//      aux_loss, seq_aux_loss, global_aux_loss (F64 scalars: L/coeff), z_loss (F64, L/coeff),
//      objective (F64: router_objective), capacity, dropped (I32 scalars),
//      dlogits (F32 N,E; only with dprobs); qb_quantile (F32 E; quantile balancing);
//      with --moe-router-padding-for-quantization (and its --fp8-* / --fp4-* recipe) the
//      aligned dispatch plan of the kept choices: aligned_offsets (I32 E+1),
//      aligned_token_of_row (I32 rows), aligned_row_of_choice (I32 N,k).
#include <string.h>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "moe/dispatcher.h"
#include "ops/quantized_linear.h"

// The tensor `name` (NULL when absent), checked to be F64/F32 of shape (d0) or (d0,d1).
static const StTensor *find_float(const StFile *f, const char *name, int ndim, int64_t d0, int64_t d1) {
    const StTensor *t = st_find(f, name);
    if (!t) return NULL;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        if (ndim == 1) mt_die("router_probe: %s must have shape (%lld)", name, (long long)d0);
        mt_die("router_probe: %s must have shape (%lld,%lld)", name, (long long)d0, (long long)d1);
    }
    if (t->dtype != ST_F64 && t->dtype != ST_F32) mt_die("router_probe: %s must be F64 or F32", name);
    return t;
}

static double scalar_value(const StFile *f, const StTensor *t) {
    const uint8_t *p = st_data(f, t);
    if (st_numel(t) != 1) mt_die("router_probe: %s must be a scalar", t->name);
    switch (t->dtype) {
    case ST_F64: { double v; memcpy(&v, p, 8); return v; }
    case ST_F32: { float v; memcpy(&v, p, 4); return v; }
    case ST_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case ST_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: mt_die("router_probe: %s has an unsupported dtype %s", t->name, st_dtype_name(t->dtype));
    }
}

static void add_f64_scalar(StWriter *w, const char *name, const double *value) {
    stw_add(w, name, ST_F64, 0, NULL, value);
}

// The dispatch plan --moe-router-padding-for-quantization makes of the routing, copied into w.
static void add_aligned_plan(StWriter *w, const RouterOutput *out, const Config *cfg, int N, int k, int E) {
    int align = quant_router_padding_multiple((QuantRecipe)cfg->quant_recipe);
    size_t max_rows = dispatch_max_rows(N, k, E, 0, 0, align);
    DispatchPlan plan = {.N = N, .k = k, .E = E, .align = align,
                         .rows_per_expert = mt_malloc((size_t)E * sizeof(int32_t)),
                         .expert_offsets = mt_malloc((size_t)(E + 1) * sizeof(int32_t)),
                         .row_of_choice = mt_malloc((size_t)N * k * sizeof(int32_t)),
                         .token_of_row = mt_malloc(MT_MAX(max_rows, 1) * sizeof(int32_t))};
    dispatch_plan(&plan, out->topk_idx, out->kept, 0);
    int64_t offsets_shape[1] = {E + 1}, rows_shape[1] = {plan.rows}, nk[2] = {N, k};
    stw_add_download(w, "aligned_offsets", ST_I32, 1, offsets_shape, plan.expert_offsets);
    stw_add_download(w, "aligned_token_of_row", ST_I32, 1, rows_shape, plan.token_of_row);
    stw_add_download(w, "aligned_row_of_choice", ST_I32, 2, nk, plan.row_of_choice);
    dispatch_plan_free(&plan);
    free(plan.rows_per_expert), free(plan.expert_offsets), free(plan.row_of_choice), free(plan.token_of_row);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s IN.safetensors OUT.safetensors [moetron train flags...]\n", argv[0]);
        return 2;
    }
    Config cfg;
    config_defaults(&cfg);
    config_parse_args(&cfg, CMD_TRAIN, argc - 3, argv + 3);
    config_validate(&cfg);
    if (cfg.num_experts <= 0) mt_die("router_probe: --num-experts must be positive");
    RouterConfig rc = model_router_config(&cfg);
    int E = rc.E, k = rc.k;

    StFile in;
    char err[512];
    if (st_open(&in, argv[1], err, sizeof err)) mt_die("%s: %s", argv[1], err);
    const StTensor *tl = st_find(&in, "logits");
    if (!tl || tl->ndim != 2) mt_die("router_probe: %s needs a 2-d tensor 'logits'", argv[1]);
    int N = (int)tl->shape[0];
    if (tl->shape[1] != E)
        mt_die("router_probe: logits have %lld experts, --num-experts is %d", (long long)tl->shape[1], E);
    if (N <= 0 || N % cfg.seq_length)
        mt_die("router_probe: --seq-length %d must divide the %d tokens", cfg.seq_length, N);
    find_float(&in, "logits", 2, N, E);
    int sequences = N / cfg.seq_length;

    real *logits = mt_malloc((size_t)N * E * sizeof(real));
    st_read_real(&in, tl, logits);

    real *bias = NULL;
    const StTensor *tb = find_float(&in, "expert_bias", 1, E, 0);
    if (tb && !cfg.moe_router_enable_expert_bias)
        mt_die("router_probe: expert_bias given without --moe-router-enable-expert-bias");
    if (cfg.moe_router_enable_expert_bias) {
        bias = mt_calloc(E, sizeof(real));
        if (tb) st_read_real(&in, tb, bias);
    }

    real *qb_bias = NULL, *qb_quantile = NULL;  // quantile balancing: its bias (default 0), its quantiles
    const StTensor *tq = find_float(&in, "qb_bias", 1, E, 0);
    if (tq && !cfg.quantile_balancing)
        mt_die("router_probe: qb_bias given without --moe-router-load-balancing-type quantile_balancing");
    if (cfg.quantile_balancing) {
        qb_bias = mt_calloc(E, sizeof(real));
        qb_quantile = mt_calloc(E, sizeof(real));
        if (tq) st_read_real(&in, tq, qb_bias);
    }

    real *dprobs = NULL;
    const StTensor *td = find_float(&in, "dprobs", 2, N, k);
    if (td) {
        dprobs = mt_malloc((size_t)N * k * sizeof(real));
        st_read_real(&in, td, dprobs);
    }

    double *before = NULL;
    int batches_before = 0;
    const StTensor *tg = find_float(&in, "global_counts_before", 1, E, 0);
    if (tg) {
        before = mt_malloc(E * sizeof(double));
        const uint8_t *p = st_data(&in, tg);
        for (int e = 0; e < E; e++) {
            if (tg->dtype == ST_F64) memcpy(&before[e], p + 8 * e, 8);
            else { float v; memcpy(&v, p + 4 * e, 4); before[e] = v; }
        }
        batches_before = 1;
        const char *meta = st_meta(&in, "global_batches_before");
        const StTensor *ts = st_find(&in, "global_batches_before");
        if (meta) batches_before = atoi(meta);
        else if (ts) batches_before = (int)scalar_value(&in, ts);
        if (batches_before < 1) mt_die("router_probe: global_batches_before must be >= 1");
    }

    RouterOutput out = {
        .scores = mt_malloc((size_t)N * E * sizeof(real)),
        .aux_scores = mt_malloc((size_t)N * E * sizeof(real)),
        .topk_idx = mt_malloc((size_t)N * k * sizeof(int32_t)),
        .topk_probs = mt_malloc((size_t)N * k * sizeof(real)),
        .kept = mt_malloc((size_t)N * k * sizeof(int32_t)),
        .tokens_per_expert = mt_malloc(E * sizeof(int32_t)),
        .aux_counts = mt_malloc(E * sizeof(int32_t)),
        .seq_counts = mt_malloc((size_t)sequences * E * sizeof(int32_t)),
        .global_counts = mt_malloc(E * sizeof(double)),
        .group_counts = mt_malloc(E * sizeof(double)),
    };
    RouterCall call = {.N = N, .seq_length = cfg.seq_length, .expert_bias = bias,
                       .global_counts_before = before, .global_batches_before = batches_before, .training = 1,
                       .qb_bias = qb_bias, .qb_quantile = qb_quantile};
    router_forward(&out, logits, &rc, &call);
    double objective = router_objective(&out, &rc);

    real *dlogits = NULL;
    if (dprobs) {
        dlogits = mt_malloc((size_t)N * E * sizeof(real));
        router_backward(dlogits, dprobs, logits, &out, &rc, &call, 1.0);
    }

    StWriter w;
    stw_init(&w);
    int64_t nk[2] = {N, k}, ne[2] = {N, E}, se[2] = {sequences, E}, e1[1] = {E};
    int32_t capacity = out.capacity, dropped = out.dropped;
    stw_add(&w, "topk_idx", ST_I32, 2, nk, out.topk_idx);
    stw_add_real(&w, "topk_probs", 2, nk, out.topk_probs);
    stw_add(&w, "kept", ST_I32, 2, nk, out.kept);
    stw_add_real(&w, "scores", 2, ne, out.scores);
    stw_add_real(&w, "aux_scores", 2, ne, out.aux_scores);
    stw_add(&w, "tokens_per_expert", ST_I32, 1, e1, out.tokens_per_expert);
    stw_add(&w, "aux_counts", ST_I32, 1, e1, out.aux_counts);
    stw_add(&w, "seq_counts", ST_I32, 2, se, out.seq_counts);
    stw_add(&w, "global_counts", ST_F64, 1, e1, out.global_counts);
    for (int t = 0; t < BALANCE_TYPES; t++) add_f64_scalar(&w, BALANCE_TYPE_NAMES[t], &out.balance_loss[t]);
    add_f64_scalar(&w, "z_loss", &out.z_loss);
    add_f64_scalar(&w, "objective", &objective);
    stw_add(&w, "capacity", ST_I32, 0, NULL, &capacity);
    stw_add(&w, "dropped", ST_I32, 0, NULL, &dropped);
    if (dlogits) stw_add_real(&w, "dlogits", 2, ne, dlogits);
    if (qb_quantile) stw_add_real(&w, "qb_quantile", 1, e1, qb_quantile);
    if (cfg.moe_router_padding_for_quantization) add_aligned_plan(&w, &out, &cfg, N, k, E);
    if (stw_finish(&w, argv[2], err, sizeof err)) mt_die("%s: %s", argv[2], err);

    st_close(&in);
    free(logits);
    free(bias);
    free(qb_bias);
    free(qb_quantile);
    free(dprobs);
    free(before);
    free(dlogits);
    free(out.scores);
    free(out.aux_scores);
    free(out.topk_idx);
    free(out.topk_probs);
    free(out.kept);
    free(out.tokens_per_expert);
    free(out.aux_counts);
    free(out.seq_counts);
    free(out.global_counts);
    free(out.group_counts);
    free(out.report);  // host memory router_forward allocated
    return 0;
}
