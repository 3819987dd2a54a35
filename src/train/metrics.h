// metrics.h — what a training run reports: a console line per logged step, one JSON
// object per logged step in --log-jsonl, and TensorBoard scalars in --tensorboard-dir (keys
// and tags in docs/metrics.md).
#pragma once
#include <stdio.h>

#include "core/config.h"
#include "train/tensorboard.h"

// Router statistics of one MoE layer (or of all of them), averaged over micro-batches.
typedef struct {
    int layer;
    double load_imbalance;  // max / mean kept tokens per expert
    double dropped_frac;    // dropped choices / all choices
    long dropped_tokens;    // dropped choices, summed over micro-batches
    double balance[3];      // L / coeff per load-balancing type (aux, seq_aux, global_aux)
    double z_loss;          // L_z / coeff
} RouterStats;

typedef struct {
    long step;
    int64_t consumed_samples;      // training samples consumed after this step
    int batch_size;                // global batch size of the step (samples)
    int world_size;                // processes of the run
    double loss, lm_loss, grad_norm, lr;
    int has_params_norm;           // --log-params-norm: params_norm is set
    double params_norm;            // L2 norm of all parameters after the step
    int has_num_zeros;             // --log-num-zeros-in-grad and the step applied: num_zeros is set
    long long num_zeros;           // gradient elements exactly zero after clipping (grad_sync_count_zeros)
    const double *mtp_loss;        // (mtp_depths) each multi-token-prediction depth's loss
    int mtp_depths;
    RouterStats router;            // over all MoE layers
    const double *balance_coeff;   // (3) which load-balancing losses are on (> 0)
    double z_loss_coeff;           // the console shows z only when the z-loss is on
    const RouterStats *layers;     // per MoE layer, or NULL (--moe-per-layer-logging)
    const int64_t *tokens_per_expert;  // (n_layers, num_experts) kept tokens summed over micro-batches
    int n_layers, num_experts;
    double tokens_per_s, tflops, mfu, mem_peak_mb, elapsed_s, eta_s;
    double step_s, data_wait_s;    // this step's time, and the part spent waiting for data
    int threads;                   // OpenMP threads the step computed with (train/thread_governor.h)
    double grad_comm_s;            // ... and in the data-parallel gradient / parameter collectives
    double grad_comm_hidden_s;     // gradient sums in flight while backward computed (not in grad_comm_s)
    double expert_comm_s;          // ... and exchanging tokens with the expert-parallel ranks (exposed)
    double expert_comm_hidden_s;   // token exchanges in flight while other work computed (not in expert_comm_s)
    int pipeline;                  // pipeline parallelism: the bubble below is reported
    double pp_bubble_s;            // seconds a pipeline rank waited for its neighbours (mean over stages)
    double pp_bubble, pp_bubble_ideal;  // that share of the schedule's time, and (p−1)/(v·m+p−1)
    uint64_t tp_bytes;             // bytes this rank sent to its tensor-parallel ranks (parallel/comm.h)
    uint64_t expert_bytes;         // ... to its expert-parallel and expert-tensor-parallel ranks
    uint64_t cp_bytes, dp_bytes, pp_bytes;  // ... to its context-, data-parallel and pipeline ranks
    int skipped;                   // the update was skipped (non-finite loss or gradient)
    int overflow;                  // ... because the scaled gradients overflowed (loss scaling)
    int loss_scaling;              // loss scaling is on: loss_scale is logged
    double loss_scale;             // the scale this step's backward used
    int loss_spike;                // the loss spiked against the recent mean
} StepRecord;

typedef struct {
    int jsonl_fd;            // --log-jsonl, open for appending; -1 without it
    const char *jsonl_path;
    const Config *cfg;       // the run's flags (intervals, what TensorBoard gets)
    TbWriter tb;             // --tensorboard-dir, open on the process that writes it
} Metrics;

// Opens --log-jsonl, and --tensorboard-dir when writes_tensorboard (one process writes it).
// With --load, first drops the JSONL records of the steps after resumed_iteration (they run
// again), so the log holds one record per step. Notes that --wandb-* flags send nothing.
void metrics_open(Metrics *mt, const Config *c, long resumed_iteration, int writes_tensorboard);
// Whether step is logged anywhere: the console and JSONL every --log-interval steps, the
// last step and notable ones (skipped, loss spike); TensorBoard every
// --tensorboard-log-interval steps. The same answer on every process.
int metrics_step_due(const Metrics *mt, long step, int notable);
// Whether the console (and the JSONL) show that step.
int metrics_console_due(const Metrics *mt, long step, int notable);
void metrics_log_step(Metrics *mt, const StepRecord *r);
void metrics_log_eval(Metrics *mt, long step, int64_t consumed_samples, double loss);
void metrics_close(Metrics *mt);

// Peak resident memory of this process in MiB.
double peak_memory_mb(void);
// This machine's fp32 GEMM ceiling in FLOP/s (a short measurement with mt_gemm), used
// as the peak for MFU unless --peak-tflops is given.
double measure_gemm_ceiling_flops(void);
