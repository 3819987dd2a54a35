// hf_config.h — config.json: the Hugging Face config of the model's family plus a
// "moetron" section holding every flag, so a checkpoint is both an HF model directory
// and a complete record of the run.
#pragma once
#include "core/config.h"
#include "core/json.h"
#include "hf/hf_family.h"

// Write config.json text for cfg (validated) into w.
void hf_config_write(JsonWriter *w, const Config *cfg, HfFamily family);

// Fill c from DIR/config.json. A moetron checkpoint restores every flag that was not
// given on the command line (architecture flags given with another value are an error);
// a plain Hugging Face qwen3_moe / mixtral config fills the model shape. Then validates.
void config_from_checkpoint(Config *c, const char *ckpt_dir);
