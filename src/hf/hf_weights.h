// hf_weights.h — load a model's weights by name from a moetron checkpoint or a Hugging
// Face directory (single file or shards; per-expert or fused experts; F32/BF16/F16/FP8).
#pragma once
#include "model/model.h"

// Fill every parameter of m from DIR; fatal with one line naming the file and tensor when
// one is missing, has the wrong shape or dtype, or when a file holds a tensor m lacks.
void hf_weights_load(const char *dir, Model *m);
