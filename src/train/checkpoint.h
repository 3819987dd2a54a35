// checkpoint.h — save and load training checkpoints (see docs/checkpoints.md).
//
//   DIR/iter_0000010/config.json           HF config + "moetron" section (every flag)
//   DIR/iter_0000010/model.safetensors     global tensors under their HF names (F32, or BF16
//                                          with --ckpt-dtype bf16, or with fp8 the linear
//                                          layers F8_E4M3 + <name>_scale_inv, hf/hf_fp8.h);
//                                          above --max-shard-size
//                                          model-00001-of-0000N.safetensors ... instead, plus
//                                          model.safetensors.index.json
//   DIR/iter_0000010/optimizer.safetensors exp_avg.<name>, exp_avg_sq.<name> (+ master.<name>,
//                                          the F32 weights, with --ckpt-dtype bf16 or fp8)
//   DIR/iter_0000010/trainer_state.json    iteration, consumed samples, optimizer step
//   DIR/iter_0000010/tokenizer.json ...    the run's tokenizer as read at start-up (run_tokenizer.h),
//                                          its companion files; generation_config.json and
//                                          tokenizer_config.json made from it when it had none
//   DIR/latest_checkpointed_iteration.txt  "10"
//   DIR/moetron.lock                       flock'ed by the run saving into DIR
// The iteration directory is written under a temporary name and renamed into place,
// then latest_checkpointed_iteration.txt is replaced atomically: a crash at any point
// leaves the previous checkpoint intact and pointed to.
#pragma once
#include "model/model.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"

typedef struct {
    long iteration;                // optimizer steps completed
    int64_t consumed_train_samples;
    int loss_scaling;              // the run scales its loss: the two below are saved (and were found, on load)
    LossScalerState loss_scaler;
    long overflow_skips;           // steps skipped for a gradient overflow: the LR schedule is behind by these
    long lr_schedule_start;        // the iteration the LR schedule (re)started at (--no-load-optim), else 0
    int64_t rng_start_sample;      // the sample the random streams count from (--no-load-rng), else 0
    // The FP8 / FP4 quantizers' state (amax histories, scales, stochastic rounding's Rng) of
    // every rank, each rank's floats as their bits: [quant_ranks][quant_floats], or NULL; a
    // rank's row holds quant_lengths[rank] floats, padding after them (NULL in a checkpoint
    // written before the lengths were: its state cannot be matched to the quantizers).
    size_t quant_ranks, quant_floats;
    uint32_t *quant_bits;
    int64_t *quant_lengths;
} TrainerState;

// Start-up of a run that saves, on the writing rank only: creates --save DIR when missing
// and proves files can be created in it; takes DIR/moetron.lock (flock) for the life of the
// process, so a second run on DIR stops at once; then removes the iter_N.tmp.<pid> and
// iter_N.old.<pid> directories that killed runs left. Each failure is one fatal line naming
// --save DIR.
void checkpoint_claim_save_dir(const char *dir);

// Write DIR/iter_N (N = st->iteration) as above; opt NULL writes the model and config only.
// opt holds the moments of every element of m's table.
void checkpoint_save(const char *dir, const Model *m, const Optimizer *opt, const TrainerState *st);

// The per-tensor buffers a checkpoint stores: the parameters (model files, master.*), the
// two AdamW moments, and with fp16 / fp8 moments their per-element scales.
enum { CKPT_PARAMS, CKPT_EXP_AVG, CKPT_EXP_AVG_SQ, CKPT_EXP_AVG_SCALE, CKPT_EXP_AVG_SQ_SCALE, CKPT_BUFFERS };

// count elements from flat element `flat` of buffer `buffer` into host memory: tt's
// parameters, or a moment buffer (CKPT_EXP_AVG ..) of opt (one piece: a tensor's part of one
// of opt's ranges).
void ckpt_read_piece(const TensorTable *tt, const Optimizer *opt, int buffer, int64_t flat, size_t count,
                     real *host);

// Where a save gets the values of its tensors when no process holds them all (expert
// parallelism, the distributed optimizer): values(ctx, i, buffer) is called on every
// process in the same order, once per tensor i of the saved table and buffer, in the
// order the files store them; on the writer it returns the tensor's values (valid until
// the next call), elsewhere it is where the process hands over its part (returns NULL).
typedef struct {
    const real *(*values)(void *ctx, int tensor, int buffer);
    void *ctx;
    int writer;            // this process writes the files
    long optimizer_step;   // < 0: no optimizer state (model and config only)
} CkptSource;

// checkpoint_save with the values from src; collective when src is. m describes the whole
// model (its table need not be allocated): names, shapes, the file layout.
void checkpoint_save_from(const char *dir, const Model *m, const CkptSource *src, const TrainerState *st);

// The directory holding config.json for --load DIR: DIR/iter_N from
// latest_checkpointed_iteration.txt, else DIR itself (an HF model directory), with its
// checksums verified (checkpoint_verify_checksums) before anything in it is read.
// Fatal with a clear message when neither exists. out has MT_PATH_MAX + 32 bytes.
void checkpoint_resolve(char *out, const char *dir);

// Whether DIR already holds checkpoints (its latest_checkpointed_iteration.txt).
int checkpoint_dir_has_checkpoints(const char *dir);

// Megatron-LM's scripts give --load and --save the same directory from the first run on:
// while it holds no checkpoint (nor a Hugging Face model), a training run starts from
// scratch, as Megatron-LM's does, with a note; --load is then cleared. A --load elsewhere
// that holds nothing stays an error (checkpoint_resolve): a mistyped path is not a new run.
void checkpoint_load_nothing_yet(Config *c);

// DIR/checksums.json, when there is one: every file it lists must have the size and CRC-32
// it records; fatal with one line naming the file when one differs, is missing or when the
// manifest itself is damaged. Without the file (Hugging Face directories, older moetron
// checkpoints) nothing is checked. checkpoint_resolve calls it.
void checkpoint_verify_checksums(const char *dir);

// DIR/trainer_state.json: iteration, consumed samples and the optimizer step; fatal with one
// line when it is unreadable or lacks any of them.
void checkpoint_read_trainer_state(const char *dir, TrainerState *st, long *optimizer_step);

// Load weights (and, when opt/st are non-NULL and the checkpoint has them, optimizer
// moments, trainer state and the F32 master weights, which then replace the model file's
// possibly BF16 weights) into an already built model. Every tensor is checked for
// presence, shape and dtype; unexpected tensors are an error. The moments are read for
// opt's ranges only (a distributed optimizer's shards): each process reads the bytes of
// its own tensors and shards, never whole files into memory. resolved_dir comes from
// checkpoint_resolve, which verified its checksums.
void checkpoint_load(const char *resolved_dir, Model *m, Optimizer *opt, TrainerState *st);
