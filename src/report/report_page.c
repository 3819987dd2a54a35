// report_page.c — see report_page.h. The page is written top to bottom; every chart names
// the series it draws, and only those series go into the page's data.
#include "report/report_page.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/json.h"
#include "report/page_assets.h"

#define LINE_CHART_WIDTH 540
#define LINE_CHART_HEIGHT 280
#define HEATMAP_WIDTH 1140   // the heatmap's script sets its height from the experts
#define SIGNIFICANT_DIGITS 6 // of the numbers in the page's data: plenty for a plot, a third of the bytes
#define MAX_CHART_SERIES 64  // lines in one chart at most

typedef struct {
    TextBuffer *out;
    const RunLog *log;
    const LogSeries **used;  // the series the charts draw, each once
    int used_count;
} Page;

static void use_series(Page *p, const LogSeries *s) {
    for (int i = 0; i < p->used_count; i++)
        if (p->used[i] == s) return;
    p->used[p->used_count++] = s;
}

// "mtp_3_loss" → 3; 0 for any other key.
static int mtp_depth(const char *key) {
    int depth, end = 0;
    return sscanf(key, "mtp_%d_loss%n", &depth, &end) == 1 && key[end] == 0 && depth > 0 ? depth : 0;
}

// "moe/layer_7/load_imbalance" → 7 with *rest = "load_imbalance"; -1 for any other key.
static int layer_of(const char *key, const char **rest) {
    int layer, end = 0;
    if (sscanf(key, "moe/layer_%d/%n", &layer, &end) != 1 || end == 0) return -1;
    *rest = key + end;
    return layer;
}

static const LogSeries *layer_series(const RunLog *log, int layer, const char *name) {
    char key[128];
    snprintf(key, sizeof(key), "moe/layer_%d/%s", layer, name);
    return run_log_find(log, key);
}

// ---- the summary table --------------------------------------------------------------------

static void summary_row(Page *p, const char *label, const char *value_html) {
    tb_append(p->out, "<tr><th>");
    tb_append_html(p->out, label);
    tb_printf(p->out, "</th><td>%s</td></tr>\n", value_html);
}

// A row "<label> | <last value> (step S)" for a scalar series, when the log has it.
static void final_value_row(Page *p, const char *label, const char *key) {
    const LogSeries *s = run_log_find(p->log, key);
    if (!s || s->is_array || !s->finite) return;
    char value[96];
    snprintf(value, sizeof(value), "%.4f (step %.0f)", s->last, s->last_step);
    summary_row(p, label, value);
}

// Mean tokens/s over the logged steps after the first (the first holds the warm-up).
static void throughput_row(Page *p) {
    const LogSeries *s = run_log_find(p->log, "tokens_per_s");
    if (!s || s->is_array || !s->finite) return;
    char value[96];
    if (s->finite > 1)
        snprintf(value, sizeof(value), "%.0f tokens/s (mean of %ld logged steps after the first)",
                 (s->sum - s->first) / (double)(s->finite - 1), s->finite - 1);
    else
        snprintf(value, sizeof(value), "%.0f tokens/s (one logged step)", s->sum);
    summary_row(p, "Throughput", value);
}

// The largest load imbalance: per layer when the log has the layers', else the model's mean.
static void imbalance_row(Page *p) {
    const LogSeries *worst = NULL;
    int worst_layer = -1;
    for (int i = 0; i < p->log->count; i++) {
        const LogSeries *s = &p->log->series[i];
        const char *rest;
        int layer = layer_of(s->key, &rest);
        if (layer < 0 || strcmp(rest, "load_imbalance") || !s->finite) continue;
        if (!worst || s->max > worst->max) worst = s, worst_layer = layer;
    }
    char value[128];
    if (worst) {
        snprintf(value, sizeof(value), "%.3f (MoE layer %d, step %.0f)", worst->max, worst_layer, worst->max_step);
    } else {
        worst = run_log_find(p->log, "load_imbalance");
        if (!worst || worst->is_array || !(worst->max > 0)) return;
        snprintf(value, sizeof(value), "%.3f (mean over the MoE layers, step %.0f)", worst->max, worst->max_step);
    }
    summary_row(p, "Worst load imbalance", value);
}

static void dropped_row(Page *p) {
    const LogSeries *s = run_log_find(p->log, "dropped_frac");
    if (!s || s->is_array || !s->finite) return;
    char value[96];
    if (s->max > 0) snprintf(value, sizeof(value), "%.4f of the routed choices at most (step %.0f)", s->max, s->max_step);
    else snprintf(value, sizeof(value), "none");
    summary_row(p, "Dropped tokens", value);
}

static void summary_table(Page *p) {
    const RunLog *log = p->log;
    char value[160];
    tb_append(p->out, "<table class=\"summary\">\n");
    if (log->step_records)
        snprintf(value, sizeof(value), "%ld logged (steps %ld to %ld)", log->step_records, log->first_step,
                 log->last_step);
    else
        snprintf(value, sizeof(value), "none logged yet");
    summary_row(p, "Steps", value);
    final_value_row(p, "Final loss", "loss");
    final_value_row(p, "Final lm loss", "lm_loss");
    for (int i = 0; i < log->count; i++) {
        int depth = mtp_depth(log->series[i].key);
        char label[64];
        snprintf(label, sizeof(label), "Final MTP %d loss", depth);
        if (depth) final_value_row(p, label, log->series[i].key);
    }
    final_value_row(p, "Final eval loss", "eval_loss");
    throughput_row(p);
    imbalance_row(p);
    dropped_row(p);
    tb_append(p->out, "</table>\n");
}

// ---- charts -------------------------------------------------------------------------------

// A line chart of the scalar series among `series` (NULL entries skipped); nothing when none.
static void line_chart(Page *p, const char *title, const LogSeries *const *series, int count) {
    int drawn = 0;
    for (int i = 0; i < count; i++) drawn += series[i] && !series[i]->is_array;
    if (!drawn) return;
    tb_append(p->out, "<figure><figcaption>");
    tb_append_html(p->out, title);
    tb_printf(p->out, "</figcaption><canvas width=\"%d\" height=\"%d\" data-series=\"", LINE_CHART_WIDTH,
              LINE_CHART_HEIGHT);
    int first = 1;
    for (int i = 0; i < count; i++) {
        if (!series[i] || series[i]->is_array) continue;
        if (!first) tb_append(p->out, " ");
        tb_append_html(p->out, series[i]->key);
        use_series(p, series[i]);
        first = 0;
    }
    tb_append(p->out, "\"></canvas></figure>\n");
}

static void chart_of(Page *p, const char *title, const char *key) {
    const LogSeries *s = run_log_find(p->log, key);
    line_chart(p, title, &s, 1);
}

static void loss_chart(Page *p) {
    const LogSeries *series[MAX_CHART_SERIES];
    int n = 0;
    series[n++] = run_log_find(p->log, "loss");
    series[n++] = run_log_find(p->log, "lm_loss");
    for (int i = 0; i < p->log->count && n < MAX_CHART_SERIES - 1; i++)
        if (mtp_depth(p->log->series[i].key)) series[n++] = &p->log->series[i];
    series[n++] = run_log_find(p->log, "eval_loss");
    line_chart(p, "Loss", series, n);
}

static void training_section(Page *p) {
    tb_append(p->out, "<h2>Training</h2>\n<div class=\"charts\">\n");
    loss_chart(p);
    chart_of(p, "Throughput (tokens/s)", "tokens_per_s");
    chart_of(p, "Gradient norm (before clipping)", "grad_norm");
    chart_of(p, "Learning rate", "lr");
    tb_append(p->out, "</div>\n");
}

static void heatmap(Page *p, const LogSeries *s, int layer) {
    tb_printf(p->out, "<figure><figcaption>MoE layer %d: tokens per expert</figcaption><canvas width=\"%d\" "
                      "height=\"%d\" data-heatmap=\"", layer, HEATMAP_WIDTH, LINE_CHART_HEIGHT);
    tb_append_html(p->out, s->key);
    tb_append(p->out, "\"></canvas></figure>\n");
    use_series(p, s);
}

static void layer_section(Page *p, int layer) {
    tb_printf(p->out, "<h3>MoE layer %d</h3>\n<div class=\"charts\">\n", layer);
    const LogSeries *tokens = layer_series(p->log, layer, "tokens_per_expert");
    if (tokens && tokens->is_array) heatmap(p, tokens, layer);
    char title[96];
    snprintf(title, sizeof(title), "MoE layer %d: load imbalance (max / mean expert load)", layer);
    const LogSeries *imbalance = layer_series(p->log, layer, "load_imbalance");
    line_chart(p, title, &imbalance, 1);
    snprintf(title, sizeof(title), "MoE layer %d: dropped tokens", layer);
    const LogSeries *dropped = layer_series(p->log, layer, "dropped_tokens");
    line_chart(p, title, &dropped, 1);
    tb_append(p->out, "</div>\n");
}

// The MoE layers that have per-layer keys, in the order they first appear; returns how many.
static int logged_layers(const RunLog *log, int *layers, int cap) {
    int n = 0;
    for (int i = 0; i < log->count; i++) {
        const char *rest;
        int layer = layer_of(log->series[i].key, &rest), known = 0;
        for (int j = 0; j < n; j++) known |= layers[j] == layer;
        if (layer >= 0 && !known && n < cap) layers[n++] = layer;
    }
    return n;
}

static void experts_section(Page *p) {
    tb_append(p->out, "<h2>Experts</h2>\n");
    const LogSeries *imbalance = run_log_find(p->log, "load_imbalance");
    if (p->log->step_records && (!imbalance || !(imbalance->max > 0))) {
        tb_append(p->out, "<p class=\"note\">No MoE layers in this run (its load_imbalance is 0).</p>\n");
        return;
    }
    tb_append(p->out, "<div class=\"charts\">\n");
    chart_of(p, "Load imbalance (mean over MoE layers)", "load_imbalance");
    chart_of(p, "Dropped fraction of the routed choices", "dropped_frac");
    tb_append(p->out, "</div>\n");
    int *layers = mt_malloc(((size_t)p->log->count + 1) * sizeof(int));
    int count = logged_layers(p->log, layers, p->log->count);
    if (!count)
        tb_append(p->out, "<p class=\"note\">No per-layer data in this log: tokens per expert, imbalance and dropped "
                          "tokens of each MoE layer are logged when the run has --moe-per-layer-logging.</p>\n");
    for (int i = 0; i < count; i++) layer_section(p, layers[i]);
    free(layers);
}

// ---- the data -----------------------------------------------------------------------------

// v rounded to SIGNIFICANT_DIGITS digits, so that the writer's shortest form is short.
static double rounded(double v) {
    char text[40];
    snprintf(text, sizeof(text), "%.*g", SIGNIFICANT_DIGITS, v);
    return strtod(text, NULL);
}

static void write_number_or_null(JsonWriter *w, double v) {
    if (isfinite(v)) jw_double(w, rounded(v));
    else jw_null(w);
}

static void write_series(JsonWriter *w, const LogSeries *s) {
    const BinnedSeries *b = &s->bins;
    jw_key(w, s->key);
    jw_begin_object(w);
    jw_key(w, s->is_array ? "step_first" : "step");  // a line's point sits in the middle of its column
    jw_begin_array(w);
    for (int c = 0; c < b->columns; c++)
        write_number_or_null(w, s->is_array ? b->step_first[c] : (b->step_first[c] + b->step_last[c]) / 2);
    jw_end_array(w);
    if (s->is_array) {
        jw_kv_int(w, "rows", b->dims);
        jw_key(w, "step_last");
        jw_begin_array(w);
        for (int c = 0; c < b->columns; c++) write_number_or_null(w, b->step_last[c]);
        jw_end_array(w);
    }
    jw_key(w, "value");
    jw_begin_array(w);
    for (int c = 0; c < b->columns; c++) {
        if (s->is_array) jw_begin_array(w);
        for (int d = 0; d < b->dims; d++) write_number_or_null(w, binned_mean(b, c, d));
        if (s->is_array) jw_end_array(w);
    }
    jw_end_array(w);
    jw_end_object(w);
}

// The used series as {"series": {KEY: ...}} in a script element; every '<' escaped so that
// nothing in a key can end the element.
static void data_script(Page *p) {
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_key(&w, "series");
    jw_begin_object(&w);
    for (int i = 0; i < p->used_count; i++) write_series(&w, p->used[i]);
    jw_end_object(&w);
    jw_end_object(&w);
    tb_append(p->out, "<script type=\"application/json\" id=\"report-data\">");
    for (const char *c = jw_text(&w); *c; c++) {
        if (*c == '<') tb_append(p->out, "\\u003c");
        else tb_append_n(p->out, c, 1);
    }
    tb_append(p->out, "</script>\n");
    jw_free(&w);
}

// ---- the page -----------------------------------------------------------------------------

static void header(Page *p, const char *run_name) {
    tb_append(p->out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>");
    tb_append_html(p->out, run_name);
    tb_printf(p->out, " - moetron report</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>", REPORT_STYLE);
    tb_append_html(p->out, run_name);
    tb_append(p->out, "</h1>\n<p class=\"source\">moetron report of ");
    tb_append_html(p->out, p->log->path);
    tb_printf(p->out, ": %ld step records, %ld evaluations%s</p>\n", p->log->step_records, p->log->eval_records,
              p->log->cut_short ? "; its last line, which the run was still writing, left out" : "");
}

void report_page(TextBuffer *out, const RunLog *log, const char *run_name) {
    Page p = {.out = out, .log = log};
    p.used = mt_calloc((size_t)log->count + 1, sizeof(*p.used));
    header(&p, run_name);
    summary_table(&p);
    training_section(&p);
    experts_section(&p);
    data_script(&p);
    tb_printf(out, "<script>\n%s</script>\n</body>\n</html>\n", REPORT_SCRIPT);
    free(p.used);
}
