// pipeline_layout.h — which decoder layers each pipeline stage runs (Megatron-Core's
// placement rules), from the flags alone.
//
// The model is cut into pp·v virtual stages, v the virtual stages of each rank (1 without
// interleaving). Virtual stage s runs layers [first_layer[s], first_layer[s] + layers[s]);
// stage 0 also runs the embedding, stage pp·v − 1 the final norm, LM head and loss. Rank r
// holds virtual stages r, r + pp, r + 2pp, ... (its chunks 0, 1, 2, ...). The placement:
//   --pipeline-model-parallel-layout  Megatron's string: "E|(tt|)*3,tL" — E embedding,
//                                     t decoder layer, m multi-token-prediction layer (in
//                                     the stage of L), L loss, | between stages, (..)*n and
//                                     x*n repeat, commas ignored; pp·v stages
//   --decoder-first/last-pipeline-num-layers  those counts on the first / last rank, the rest
//                                     even over the middle ranks
//   otherwise                         even over the ranks, the embedding and loss counting as
//                                     a layer with --account-for-embedding/loss-in-pipeline-split
// and each rank's layers even over its v chunks (--num-layers-per-virtual-pipeline-stage or
// --num-virtual-stages-per-pipeline-rank).
#pragma once
#include <stddef.h>

#include "core/config.h"

#define PP_MAX_STAGES 512

typedef struct {
    int pp, vp, stages;                 // ranks, virtual stages per rank, pp·vp
    int first_layer[PP_MAX_STAGES];     // by virtual stage
    int layers[PP_MAX_STAGES];
} PipelineLayout;

// The placement of c's flags; 0, or 1 with a one-line reason in err naming the flags.
int pipeline_layout_make(PipelineLayout *pl, const Config *c, char *err, size_t err_size);

// Virtual stage of chunk `chunk` of pipeline rank `rank`.
static inline int pipeline_virtual_stage(const PipelineLayout *pl, int rank, int chunk) {
    return chunk * pl->pp + rank;
}
