// checkpoint.h — save and load training checkpoints (see docs/checkpoints.md).
//
//   DIR/iter_0000010/config.json           HF config + "moetron" section (every flag)
//   DIR/iter_0000010/model.safetensors     global fp32 tensors under their HF names
//   DIR/iter_0000010/optimizer.safetensors exp_avg.<name>, exp_avg_sq.<name>
//   DIR/iter_0000010/trainer_state.json    iteration, consumed samples, optimizer step
//   DIR/latest_checkpointed_iteration.txt  "10"
// The iteration directory is written under a temporary name and renamed into place,
// then latest_checkpointed_iteration.txt is replaced atomically: a crash at any point
// leaves the previous checkpoint intact and pointed to.
#pragma once
#include "model/model.h"
#include "train/optimizer.h"

typedef struct {
    long iteration;                // optimizer steps completed
    int64_t consumed_train_samples;
} TrainerState;

void checkpoint_save(const char *dir, const Model *m, const Optimizer *opt, const TrainerState *st);

// The directory holding config.json for --load DIR: DIR/iter_N from
// latest_checkpointed_iteration.txt, else DIR itself (an HF model directory).
// Fatal with a clear message when neither exists. out has MT_PATH_MAX + 32 bytes.
void checkpoint_resolve(char *out, const char *dir);

// Load weights (and, when opt/st are non-NULL and the checkpoint has them, optimizer
// moments and trainer state) into an already built model. Every tensor is checked for
// presence, shape and dtype; unexpected tensors are an error.
void checkpoint_load(const char *resolved_dir, Model *m, Optimizer *opt, TrainerState *st);
