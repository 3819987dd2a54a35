// load_model.h — build a model from a checkpoint for inference (generate, forward).
#pragma once
#include "model/model.h"

// Resolve --load, restore the config from the checkpoint and load the weights.
void load_model_for_inference(Model *m, Config *c);
