// report_page.h — the self-contained HTML page of a run's log (`moetron report`,
// docs/metrics.md): title, summary table, line charts of the losses, throughput, gradient
// norm and learning rate, and per MoE layer a heatmap of tokens per expert over steps with
// the layer's imbalance and dropped tokens. The data travels as JSON inside the page and an
// inline script draws it (page_assets.h): nothing is fetched from anywhere.
#pragma once
#include "report/run_log.h"
#include "report/text_buffer.h"

// Appends the page of log to out; run_name titles it.
void report_page(TextBuffer *out, const RunLog *log, const char *run_name);
