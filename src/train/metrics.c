#include "core/device.h"
#include "train/metrics.h"

#include <math.h>
#include <string.h>
#include <sys/resource.h>

#include "core/common.h"
#include "core/json.h"
#include "core/timer.h"
#include "ops/gemm.h"

void metrics_open(Metrics *mt, const Config *c) {
    memset(mt, 0, sizeof(*mt));
    mt->train_iters = c->train_iters;
    if (c->log_jsonl[0]) {
        mt->jsonl = fopen(c->log_jsonl, "a");
        if (!mt->jsonl) mt_die("--log-jsonl %s: cannot open for appending", c->log_jsonl);
    }
}

static void format_duration(char *out, size_t cap, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, cap, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
    else snprintf(out, cap, "%lds", s);
}

static void write_jsonl(FILE *f, JsonWriter *w) {
    fprintf(f, "%s\n", jw_text(w));
    fflush(f);
    jw_free(w);
}

static const char *const BALANCE_KEYS[3] = {"aux_loss", "seq_aux_loss", "global_aux_loss"};

// Console fields of the enabled router losses: "aux 1.0012 | seq_aux 1.03 | z 2.3".
static void print_router_losses(const StepRecord *r) {
    static const char *const short_names[3] = {"aux", "seq_aux", "global_aux"};
    int any = 0;
    for (int t = 0; t < 3; t++)
        if (r->balance_coeff[t] > 0) {
            printf(" | %s %.4f", short_names[t], r->router.balance[t]);
            any = 1;
        }
    if (!any) printf(" | aux %.4f", r->router.balance[0]);
    if (r->z_loss_coeff > 0) printf(" | z %.3f", r->router.z_loss);
}

static void write_layer_stats(JsonWriter *w, const StepRecord *r, const RouterStats *s, const int64_t *counts) {
    char key[96];
    snprintf(key, sizeof(key), "moe/layer_%d/tokens_per_expert", s->layer);
    jw_key(w, key);
    jw_begin_array(w);
    for (int e = 0; e < r->num_experts; e++) jw_int(w, counts[e]);
    jw_end_array(w);
    snprintf(key, sizeof(key), "moe/layer_%d/dropped_tokens", s->layer);
    jw_kv_int(w, key, s->dropped_tokens);
    snprintf(key, sizeof(key), "moe/layer_%d/load_imbalance", s->layer);
    jw_kv_double(w, key, s->load_imbalance);
    snprintf(key, sizeof(key), "moe/layer_%d/dropped_frac", s->layer);
    jw_kv_double(w, key, s->dropped_frac);
    for (int t = 0; t < 3; t++)
        if (r->balance_coeff[t] > 0) {
            snprintf(key, sizeof(key), "moe/layer_%d/%s", s->layer, BALANCE_KEYS[t]);
            jw_kv_double(w, key, s->balance[t]);
        }
    snprintf(key, sizeof(key), "moe/layer_%d/z_loss", s->layer);
    jw_kv_double(w, key, s->z_loss);
}

void metrics_log_step(Metrics *mt, const StepRecord *r) {
    char eta[32];
    format_duration(eta, sizeof(eta), r->eta_s);
    printf("step %5ld/%d | loss %.4f | lm %.4f", r->step, mt->train_iters, r->loss, r->lm_loss);
    print_router_losses(r);
    printf(" | grad %.3f | lr %.3e | %7.0f tok/s | %.3f TFLOP/s | imbalance %.2f", r->grad_norm, r->lr,
           r->tokens_per_s, r->tflops, r->router.load_imbalance);
    if (r->router.dropped_frac > 0) printf(" | dropped %.3f", r->router.dropped_frac);
    if (r->data_wait_s > 0.01 * r->step_s) printf(" | waited %.0f ms for data", 1e3 * r->data_wait_s);
    if (r->skipped) printf(" | skipped");
    if (r->loss_spike) printf(" | loss spike");
    printf(" | ETA %s\n", eta);
    fflush(stdout);
    if (!mt->jsonl) return;
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "step", r->step);
    jw_kv_double(&w, "loss", r->loss);
    jw_kv_double(&w, "lm_loss", r->lm_loss);
    jw_kv_double(&w, "aux_loss", r->router.balance[0]);
    jw_kv_double(&w, "z_loss", r->router.z_loss);
    jw_kv_double(&w, "grad_norm", r->grad_norm);
    jw_kv_double(&w, "lr", r->lr);
    jw_kv_double(&w, "tokens_per_s", r->tokens_per_s);
    jw_kv_double(&w, "tflops", r->tflops);
    jw_kv_double(&w, "mfu", r->mfu);
    jw_kv_double(&w, "load_imbalance", r->router.load_imbalance);
    jw_kv_double(&w, "dropped_frac", r->router.dropped_frac);
    jw_kv_double(&w, "mem_peak_mb", r->mem_peak_mb);
    jw_kv_double(&w, "elapsed_s", r->elapsed_s);
    jw_kv_double(&w, "data_wait_s", r->data_wait_s);
    jw_kv_double(&w, "grad_comm_s", r->grad_comm_s);
    jw_kv_double(&w, "grad_comm_hidden_s", r->grad_comm_hidden_s);
    jw_kv_double(&w, "expert_comm_s", r->expert_comm_s);
    if (r->skipped) jw_kv_bool(&w, "skipped", 1);
    if (r->loss_spike) jw_kv_bool(&w, "loss_spike", 1);
    for (int t = 1; t < 3; t++)
        if (r->balance_coeff[t] > 0) jw_kv_double(&w, BALANCE_KEYS[t], r->router.balance[t]);
    for (int l = 0; l < r->n_layers; l++)
        write_layer_stats(&w, r, &r->layers[l], r->tokens_per_expert + (size_t)l * r->num_experts);
    jw_end_object(&w);
    write_jsonl(mt->jsonl, &w);
}

void metrics_log_eval(Metrics *mt, long step, double loss) {
    printf("eval at step %ld | held-out loss %.4f | perplexity %.3f\n", step, loss, exp(loss));
    fflush(stdout);
    if (!mt->jsonl) return;
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "step", step);
    jw_kv_double(&w, "eval_loss", loss);
    jw_kv_double(&w, "eval_ppl", exp(loss));
    jw_end_object(&w);
    write_jsonl(mt->jsonl, &w);
}

void metrics_close(Metrics *mt) {
    if (mt->jsonl) fclose(mt->jsonl);
    mt->jsonl = NULL;
}

double peak_memory_mb(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The best rate of a square GEMM in the precision the model's GEMMs use: 512 wide on the
// cpu, 8192 on a GPU (large enough to reach its tensor-core peak).
double measure_gemm_ceiling_flops(void) {
    enum { REPEATS = 12 };
    const size_t size = device_active() == DEVICE_CUDA ? 8192 : 512;
    real *a = device_calloc(size * size, sizeof(real));
    real *b = device_calloc(size * size, sizeof(real));
    real *c = device_calloc(size * size, sizeof(real));
    for (size_t i = 0; i < size * size; i++) a[i] = b[i] = (real)((i % 7) * 0.1);
    int n = (int)size;
    mt_gemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n);  // warm up
    double best = INFINITY;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now_seconds();
        mt_gemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n);  // complete on return (ops/dispatch.c)
        double t = now_seconds() - t0;
        if (t < best) best = t;
    }
    device_free(a);
    device_free(b);
    device_free(c);
    return 2.0 * (double)size * size * size / best;
}
