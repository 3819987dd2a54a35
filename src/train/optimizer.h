// optimizer.h — AdamW over the tensor table with global-norm gradient clipping.
// Weight decay applies to tensors flagged TENSOR_DECAY (matrices), never to norms.
// With --use-precision-aware-optimizer the two moments may be stored narrower
// (--exp-avg-dtype, --exp-avg-sq-dtype: bf16, or fp16 / fp8 with a scale per fragment),
// with Transformer Engine FusedAdam's semantics (ops/adamw_math.h), and part of the state
// may live and step on the host (--optimizer-cpu-offload, as Megatron's hybrid optimizer).
#pragma once
#include "core/config.h"
#include "core/tensor_table.h"
#include "ops/ops.h"

// Element ranges [begin, end) of the flat parameters.
typedef struct {
    int64_t begin, end;
} FlatRange;

enum { OPT_MAX_RANGES = 2 };

// A trained tensor's part of one range: what FusedAdam sees as one parameter (the shard
// of a tensor with the distributed optimizer), so what a narrow moment's scale covers.
typedef struct {
    int64_t begin, end;  // flat elements
    int range;           // which of the optimizer's ranges holds it
    int decay;           // the tensor is weight-decayed
} OptFragment;

// The optimizer updates some element ranges of the flat parameters: all of them, or with
// --use-distributed-optimizer this rank's shard of the dense region and of the expert
// region. Moments exist for those elements only, range after range.
typedef struct {
    FlatRange ranges[OPT_MAX_RANGES];
    int n_ranges;
    MomentDtype dtype[ADAMW_MOMENTS];  // exp_avg, exp_avg_sq
    void *moment[ADAMW_MOMENTS];       // (elements of the ranges) each in its dtype (tensor memory)
    OptFragment *fragments;            // (n_fragments) in flat order
    int n_fragments;
    MomentScales *scales;              // (n_fragments) tensor memory; all 1 for fp32 / bf16
    MomentScales *host_scales;         // (n_fragments) the offloaded fragments' scales; the others'
                                       // host copy while a checkpoint loads
    uint8_t *scale_loaded;             // (n_fragments × 2) while loading: the checkpoint gave that scale
    long step;                         // optimizer steps taken
    // --optimizer-cpu-offload: fragments [0, offloaded) keep their state in host memory
    // (device_host_calloc) and step on the cpu backend: their moments are moment indices
    // [0, offload_elements) (the device buffers hold the rest), beside a host copy of their
    // parameters (the optimizer's; the device's are copied from it after each step) and
    // a host buffer their gradients come to.
    int offloaded;
    size_t offload_elements;
    void *host_moment[ADAMW_MOMENTS];
    real *host_params, *host_grads;
    int host_params_stale;             // the device's parameters changed (init, a load): fetch them
} Optimizer;

typedef struct {
    MomentDtype dtype[ADAMW_MOMENTS];  // how the moments are stored
    double offload_fraction;           // of the elements whose state is offloaded (0: none)
} OptimizerOptions;

// Every element of tt: one range, fp32 moments.
void optimizer_init(Optimizer *o, const TensorTable *tt);
// The options --exp-avg-dtype, --exp-avg-sq-dtype and --optimizer-cpu-offload /
// --optimizer-offload-fraction ask for.
OptimizerOptions optimizer_options(const Config *c);
// options NULL: fp32 moments, nothing offloaded.
void optimizer_init_ranges(Optimizer *o, const TensorTable *tt, const FlatRange *ranges, int n_ranges,
                           const OptimizerOptions *options);
void optimizer_free(Optimizer *o);
// Where range r's moments start (in elements) in each moment buffer.
size_t optimizer_moment_base(const Optimizer *o, int r);
// Bytes of moment state for `elements` elements of the ranges and `fragments` fragments.
double optimizer_state_bytes(const MomentDtype dtype[ADAMW_MOMENTS], double elements, double fragments);
// Gradient clipping to c->clip_grad: the coefficient the gradients are multiplied by
// (Megatron: clip/(norm + 1e-6) when that is < 1), else 1.
double optimizer_clip_coeff(const Config *c, double grad_norm);
// The gradients of the optimizer's ranges multiplied by coeff in place (nothing when it is 1).
void optimizer_scale_grads(const Optimizer *o, TensorTable *tt, double coeff);
// Step the optimizer's ranges with the gradients times grad_scale (optimizer_clip_coeff's:
// the bits of optimizer_scale_grads before the step, without a pass over the gradients).
void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_scale);

// ---- checkpoints: moments as real values, layout-free --------------------------------------
// What a checkpoint stores of moment k: its values (decoded), or with a scaled dtype (fp16,
// fp8) each element's scale (its fragment's), from which a resume on the same layout
// restores the stored bits exactly.
typedef enum { MOMENT_VALUES, MOMENT_SCALES } MomentPart;
// count elements from flat element `flat` (inside one range, within one fragment or none)
// of moment k's part into host memory.
void optimizer_read(const Optimizer *o, int k, MomentPart part, int64_t flat, size_t count, real *host);
// Loading: optimizer_load_begin, then the scales of each piece (optional), then the values
// (stored with the loaded scale when its piece had one scale throughout, else with a scale
// from the values' largest magnitude, as FusedAdam's load does), then optimizer_load_end.
void optimizer_load_begin(Optimizer *o);
void optimizer_load_scales(Optimizer *o, int k, int64_t flat, size_t count, const real *host);
void optimizer_load_values(Optimizer *o, int k, int64_t flat, size_t count, const real *host);
void optimizer_load_end(Optimizer *o);
