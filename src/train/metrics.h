// metrics.h — what a training run reports: a console line per logged step and one JSON
// object per logged step in --log-jsonl (keys in docs/metrics.md).
#pragma once
#include <stdio.h>

#include "core/config.h"

typedef struct {
    long step;
    double loss, lm_loss, aux_loss, z_loss, grad_norm, lr;
    double tokens_per_s, tflops, mfu, load_imbalance, dropped_frac, mem_peak_mb, elapsed_s, eta_s;
} StepRecord;

typedef struct {
    FILE *jsonl;
    int train_iters;
} Metrics;

void metrics_open(Metrics *mt, const Config *c);
void metrics_log_step(Metrics *mt, const StepRecord *r);
void metrics_log_eval(Metrics *mt, long step, double loss);
void metrics_close(Metrics *mt);

// Peak resident memory of this process in MiB.
double peak_memory_mb(void);
// This machine's fp32 GEMM ceiling in FLOP/s (a short measurement with mt_gemm), used
// as the peak for MFU unless --peak-tflops is given.
double measure_gemm_ceiling_flops(void);
