#include "core/device.h"
#include "train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/timer.h"
#include "ops/gemm.h"
#include "train/metrics_tensorboard.h"

// Whether one line of the log (without its newline) is a record of a step after `iteration`.
static int record_after(const char *line, size_t len, long iteration) {
    JsonValue *v = json_parse(line, len, NULL, 0);
    int64_t step;
    int after = v && v->type == JSON_OBJECT && json_get_int64(v, "step", &step) && step > iteration;
    json_free(v);
    return after;
}

// A resumed run logs the steps after `iteration` again: drop their old records (train and
// eval) and an unterminated last line (a record cut by a crash), rewriting the file
// crash-safely, so that the log holds one record per step. Other lines stay as they are.
static void drop_records_after(const char *path, long iteration) {
    char err[256];
    size_t len;
    uint8_t *text = read_file_all(path, INFILE_LOG, &len, err, sizeof(err));
    if (!text) return;  // no log yet
    char *kept = mt_malloc(len + 1);
    size_t kept_len = 0, dropped = 0;
    for (size_t at = 0; at < len;) {
        const char *line = (const char *)text + at, *end = memchr(line, '\n', len - at);
        size_t n = end ? (size_t)(end - line) : len - at;
        if (!end || record_after(line, n, iteration)) {
            dropped++;
        } else {
            memcpy(kept + kept_len, line, n + 1);
            kept_len += n + 1;
        }
        at += n + 1;
    }
    if (dropped) {
        if (write_file_atomic(path, kept, kept_len, err, sizeof(err)))
            mt_die("--log-jsonl %s: cannot rewrite it without the records after iteration %ld: %s", path, iteration,
                   err);
        printf("note: --log-jsonl %s: dropped %zu records after iteration %ld (those steps run again)\n", path,
               dropped, iteration);
    }
    free(kept);
    free(text);
}

// --wandb-*: Megatron scripts pass them; nothing is sent, and the run says so once.
static void note_wandb(const Config *c) {
    const char *given = c->wandb_project[0] ? "--wandb-project" : c->wandb_exp_name[0] ? "--wandb-exp-name"
                        : c->wandb_save_dir[0] ? "--wandb-save-dir" : c->wandb_entity[0] ? "--wandb-entity" : NULL;
    if (given)
        printf("note: %s: moetron does not log to Weights & Biases; the same values are in --tensorboard-dir and "
               "--log-jsonl\n", given);
}

void metrics_open(Metrics *mt, const Config *c, long resumed_iteration, int writes_tensorboard) {
    memset(mt, 0, sizeof(*mt));
    mt->jsonl_fd = -1;
    mt->tb.fd = -1;
    mt->cfg = c;
    note_wandb(c);
    if (c->tensorboard_dir[0] && writes_tensorboard) tb_open(&mt->tb, c->tensorboard_dir);
    if (!c->log_jsonl[0]) return;
    mt->jsonl_path = c->log_jsonl;
    if (c->load[0]) drop_records_after(c->log_jsonl, resumed_iteration);
    mt->jsonl_fd = open(c->log_jsonl, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (mt->jsonl_fd < 0) mt_die("--log-jsonl %s: cannot open for appending: %s", c->log_jsonl, strerror(errno));
}

int metrics_console_due(const Metrics *mt, long step, int notable) {
    return step % mt->cfg->log_interval == 0 || step == mt->cfg->train_iters || notable;
}

// From the flags alone (not whether this process writes): every process takes the same steps.
static int tensorboard_due(const Metrics *mt, long step) {
    return mt->cfg->tensorboard_dir[0] && step % mt->cfg->tensorboard_log_interval == 0;
}

int metrics_step_due(const Metrics *mt, long step, int notable) {
    return metrics_console_due(mt, step, notable) || tensorboard_due(mt, step);
}

// Appends one record (its line in plain writes, nothing buffered). A record that cannot be
// written whole (a full disk) stops the run: its partial line is cut off again, so the log
// keeps whole records of the steps before.
static void write_jsonl(Metrics *mt, JsonWriter *w, long step) {
    size_t len = jw_len(w);
    char *line = mt_malloc(len + 1);
    memcpy(line, jw_text(w), len);
    line[len] = '\n';
    int partial_left, errnum = append_whole(mt->jsonl_fd, line, len + 1, &partial_left);
    free(line);
    jw_free(w);
    if (!errnum) return;
    mt_die("--log-jsonl %s: cannot write the record of step %ld: %s%s; the run stops here (the checkpoints saved "
           "so far are intact): free space or log elsewhere, then resume with --load",
           mt->jsonl_path, step, strerror(errnum), partial_left ? " (a partial line is left at its end)" : "");
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

// With --moe-per-layer-logging, one console line per MoE layer under the step's line:
// "  layer 1: imbalance 1.32 | dropped 0.000 | max expert 7 (18%)" (the busiest expert and
// its share of the layer's kept tokens).
static void print_layer_summaries(const StepRecord *r) {
    for (int l = 0; l < r->n_layers; l++) {
        const int64_t *counts = r->tokens_per_expert + (size_t)l * r->num_experts;
        int64_t kept = 0;
        int busiest = 0;
        for (int e = 0; e < r->num_experts; e++) {
            kept += counts[e];
            if (counts[e] > counts[busiest]) busiest = e;
        }
        printf("  layer %d: imbalance %.2f | dropped %.3f | max expert %d (%.0f%%)\n", r->layers[l].layer,
               r->layers[l].load_imbalance, r->layers[l].dropped_frac, busiest,
               kept > 0 ? 100.0 * counts[busiest] / kept : 0.0);
    }
}

static void log_step_console_and_jsonl(Metrics *mt, const StepRecord *r);

void metrics_log_step(Metrics *mt, const StepRecord *r) {
    if (metrics_console_due(mt, r->step, r->skipped || r->loss_spike)) log_step_console_and_jsonl(mt, r);
    if (tensorboard_due(mt, r->step)) tensorboard_log_step(&mt->tb, mt->cfg, r);
}

static void log_step_console_and_jsonl(Metrics *mt, const StepRecord *r) {
    char eta[32];
    format_duration(eta, sizeof(eta), r->eta_s);
    printf("step %5ld/%d | loss %.4f | lm %.4f", r->step, mt->cfg->train_iters, r->loss, r->lm_loss);
    for (int k = 0; k < r->mtp_depths; k++) printf(" | mtp_%d %.4f", k + 1, r->mtp_loss[k]);
    print_router_losses(r);
    printf(" | grad %.3f", r->grad_norm);
    if (r->has_num_zeros) printf(" | zeros %lld", r->num_zeros);
    printf(" | lr %.3e | %7.0f tok/s | %.3f TFLOP/s | imbalance %.2f", r->lr, r->tokens_per_s, r->tflops,
           r->router.load_imbalance);
    if (r->router.dropped_frac > 0) printf(" | dropped %.3f", r->router.dropped_frac);
    if (r->pipeline) printf(" | bubble %.0f%% (ideal %.0f%%)", 100 * r->pp_bubble, 100 * r->pp_bubble_ideal);
    if (r->data_wait_s > 0.01 * r->step_s) printf(" | waited %.0f ms for data", 1e3 * r->data_wait_s);
    if (r->loss_scaling) printf(" | loss scale %g", r->loss_scale);
    if (r->skipped) printf(r->overflow ? " | skipped (gradient overflow)" : " | skipped");
    if (r->loss_spike) printf(" | loss spike");
    if (r->has_params_norm) printf(" | params norm %.3f", r->params_norm);
    printf(" | ETA %s\n", eta);
    print_layer_summaries(r);
    mt_flush_stdout();
    if (mt->jsonl_fd < 0) return;
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
    jw_kv_double(&w, "expert_comm_hidden_s", r->expert_comm_hidden_s);
    if (r->pipeline) {
        jw_kv_double(&w, "pp_bubble_s", r->pp_bubble_s);
        jw_kv_double(&w, "pp_bubble", r->pp_bubble);
        jw_kv_double(&w, "pp_bubble_ideal", r->pp_bubble_ideal);
    }
    jw_kv_int(&w, "tp_bytes", (int64_t)r->tp_bytes);
    jw_kv_int(&w, "expert_bytes", (int64_t)r->expert_bytes);
    jw_kv_int(&w, "cp_bytes", (int64_t)r->cp_bytes);
    jw_kv_int(&w, "dp_bytes", (int64_t)r->dp_bytes);
    jw_kv_int(&w, "pp_bytes", (int64_t)r->pp_bytes);
    jw_kv_int(&w, "threads", r->threads);
    if (r->loss_scaling) jw_kv_double(&w, "loss_scale", r->loss_scale);
    if (r->has_params_norm) jw_kv_double(&w, "params_norm", r->params_norm);
    if (r->has_num_zeros) jw_kv_int(&w, "num_zeros", (int64_t)r->num_zeros);
    if (r->skipped) jw_kv_bool(&w, "skipped", 1);
    if (r->overflow) jw_kv_bool(&w, "overflow", 1);
    if (r->loss_spike) jw_kv_bool(&w, "loss_spike", 1);
    for (int t = 1; t < 3; t++)
        if (r->balance_coeff[t] > 0) jw_kv_double(&w, BALANCE_KEYS[t], r->router.balance[t]);
    for (int k = 0; k < r->mtp_depths; k++) {
        char key[32];
        snprintf(key, sizeof(key), "mtp_%d_loss", k + 1);
        jw_kv_double(&w, key, r->mtp_loss[k]);
    }
    for (int l = 0; l < r->n_layers; l++)
        write_layer_stats(&w, r, &r->layers[l], r->tokens_per_expert + (size_t)l * r->num_experts);
    jw_end_object(&w);
    write_jsonl(mt, &w, r->step);
}

void metrics_log_eval(Metrics *mt, long step, int64_t consumed_samples, double loss) {
    double ppl = exp(loss);
    printf("eval at step %ld | held-out loss %.4f | perplexity %.3f\n", step, loss, ppl);
    mt_flush_stdout();
    tensorboard_log_eval(&mt->tb, mt->cfg, step, consumed_samples, loss, ppl);
    if (mt->jsonl_fd < 0) return;
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "step", step);
    jw_kv_double(&w, "eval_loss", loss);
    jw_kv_double(&w, "eval_ppl", ppl);
    jw_end_object(&w);
    write_jsonl(mt, &w, step);
}

void metrics_close(Metrics *mt) {
    if (mt->jsonl_fd >= 0) close(mt->jsonl_fd);
    mt->jsonl_fd = -1;
    tb_close(&mt->tb);
}

double peak_memory_mb(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The best rate of `repeats` timed size x size x size GEMMs (after one warm-up) in the
// precision the model's GEMMs use, on the active device.
static double best_square_gemm_flops(size_t size, int repeats) {
    real *a = device_calloc(size * size, sizeof(real));
    real *b = device_calloc(size * size, sizeof(real));
    real *c = device_calloc(size * size, sizeof(real));
    real *values = mt_malloc(size * size * sizeof(real));
    for (size_t i = 0; i < size * size; i++) values[i] = (real)((i % 7) * 0.1);
    device_upload(a, values, size * size * sizeof(real));
    device_upload(b, values, size * size * sizeof(real));
    free(values);
    int n = (int)size;
    mt_gemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n);  // warm up
    double best = INFINITY;
    for (int r = 0; r < repeats; r++) {
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

// The GEMM ceiling: on a GPU an 8192-wide square GEMM (large enough to reach its tensor-core
// peak); on the cpu the best of 512-wide ones, and with 16-bit inputs also of 1024-wide ones
// (AMX and AVX-512 BF16 reach their rate only there: 512 reads up to ~2x low on AMX).
double measure_gemm_ceiling_flops(void) {
    enum { REPEATS = 12, WIDE_REPEATS = 4 };
    if (device_active() == DEVICE_CUDA) return best_square_gemm_flops(8192, REPEATS);
    double best = best_square_gemm_flops(512, REPEATS);
    if (mt_gemm_inputs() != GEMM_INPUTS_FP32) best = fmax(best, best_square_gemm_flops(1024, WIDE_REPEATS));
    return best;
}
