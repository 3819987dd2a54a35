// run_summary.h — the one-screen summary a training run prints at its end: steps and time,
// the losses from the first logged step to the last and the held-out ones, throughput and
// MFU, memory, what the experts did, skipped steps and checkpoints. Fed with what the run
// already logs (train/metrics.h's records); nothing is measured again.
#pragma once
#include "train/metrics.h"

typedef struct {
    long first_step, last_step;       // logged steps seen (0: none)
    int logged;
    double first_loss, last_loss, last_lm_loss;
    double tokens_per_s_sum, tflops_sum, mfu_sum;  // over logged steps after the first (warm-up)
    int rate_steps;
    double mem_peak_mb;
    double worst_imbalance, dropped_frac_sum;  // over MoE layers, per logged step
    int moe;                           // the run has MoE layers
    int skipped, loss_spikes;
    int evals;
    double last_eval_loss, best_eval_loss;
    long best_eval_step;
    int saves;
    long last_save_step;
} RunSummary;

void run_summary_step(RunSummary *s, const StepRecord *r);
void run_summary_eval(RunSummary *s, long step, double loss);
void run_summary_saved(RunSummary *s, long step);
// The summary's lines on stdout; steps_run of this process in wall_s seconds, checkpoints in save_dir ("" none).
void run_summary_print(const RunSummary *s, long steps_run, double wall_s, const char *save_dir);
