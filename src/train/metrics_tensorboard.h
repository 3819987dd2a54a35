// metrics_tensorboard.h — a logged step's and an evaluation's values as TensorBoard scalars
// under Megatron-LM's tags (docs/metrics.md, "TensorBoard"): the values of the StepRecord
// the console and the JSONL show, nothing computed again.
#pragma once
#include "train/metrics.h"

// The step's scalars, written at once (tb_flush).
void tensorboard_log_step(TbWriter *tb, const Config *c, const StepRecord *r);
// An evaluation's: "lm loss validation" (and its ppl with --log-validation-ppl-to-tensorboard).
void tensorboard_log_eval(TbWriter *tb, const Config *c, long step, int64_t consumed_samples, double loss, double ppl);
