// expert_shards.h — checkpoints stay global under expert parallelism: a model whose
// experts are split over the expert-parallel group is gathered into the model one process
// would hold (every expert, its moments) for saving. Loading needs no counterpart: each
// rank reads its own experts by their global names (hf_weights.c skips the others).
#pragma once
#include "model/model.h"
#include "train/optimizer.h"

// Collective over local->ep.comm. local_opt holds the moments of every element of local's
// table (offsets as the parameters), or is NULL. Builds *global (all experts) and, with
// local_opt, *global_opt; free them with model_free and optimizer_free.
void expert_shards_gather(const Model *local, const Optimizer *local_opt, Model *global, Optimizer *global_opt);
