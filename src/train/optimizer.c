#include "core/device.h"
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "ops/adamw_math.h"
#include "ops/backend.h"

// The scales of a fragment no step has touched (or of no fragment): decode as stored.
static const MomentScales UNIT_SCALES = {{1, 1}, {0, 0}};

// The fragments of the ranges: each trained tensor's part of each range, in flat order.
static void find_fragments(Optimizer *o, const TensorTable *tt) {
    o->fragments = mt_malloc((size_t)MT_MAX(tt->count * o->n_ranges, 1) * sizeof(OptFragment));
    o->n_fragments = 0;
    for (int r = 0; r < o->n_ranges; r++)
        for (int i = 0; i < tt->count; i++) {
            const TensorDesc *d = &tt->descs[i];
            if (d->flags & TENSOR_NOT_TRAINED) continue;  // e.g. the router expert bias
            int64_t from = MT_MAX((int64_t)d->offset, o->ranges[r].begin);
            int64_t to = MT_MIN((int64_t)(d->offset + d->numel), o->ranges[r].end);
            if (from >= to) continue;
            o->fragments[o->n_fragments++] = (OptFragment){from, to, r, (d->flags & TENSOR_DECAY) != 0};
        }
}

static int any_narrow(const Optimizer *o) { return o->dtype[0] != MOMENT_FP32 || o->dtype[1] != MOMENT_FP32; }

// Where flat element `flat` of range r sits in the moment buffers (an element index).
static size_t moment_index(const Optimizer *o, int r, int64_t flat) {
    return optimizer_moment_base(o, r) + (size_t)(flat - o->ranges[r].begin);
}

// --optimizer-cpu-offload: the first fragments, in order, until `fraction` of the fragments'
// elements is reached (Megatron's hybrid optimizer's split), go to the host.
static void choose_offloaded(Optimizer *o, double fraction) {
    double total = 0, offloaded = 0;
    for (int f = 0; f < o->n_fragments; f++) total += (double)(o->fragments[f].end - o->fragments[f].begin);
    while (o->offloaded < o->n_fragments && offloaded < fraction * total) {
        const OptFragment *fr = &o->fragments[o->offloaded++];
        offloaded += (double)(fr->end - fr->begin);
        o->offload_elements = moment_index(o, fr->range, fr->end - 1) + 1;
    }
    for (int k = 0; k < ADAMW_MOMENTS && o->offloaded; k++)
        o->host_moment[k] = device_host_calloc(o->offload_elements, moment_bytes(o->dtype[k]));
    if (o->offloaded) {
        o->host_params = device_host_calloc(o->offload_elements, sizeof(real));
        o->host_grads = device_host_calloc(o->offload_elements, sizeof(real));
    }
    o->host_params_stale = 1;
}

OptimizerOptions optimizer_options(const Config *c) {
    return (OptimizerOptions){.dtype = {(MomentDtype)c->moment_dtype[0], (MomentDtype)c->moment_dtype[1]},
                              .offload_fraction = c->optimizer_cpu_offload ? c->optimizer_offload_fraction : 0};
}

// Tensor memory for n elements of a moment stored as d, zeroed by writing it (vec_zero over whole
// reals): AdamW reads a moment before it writes it, and on the cpu a page calloc left untouched
// would be mapped to the shared zero page by that read and copied by the write, each copy a TLB
// shootdown across the threads (~1 s per GiB on 2 cores of a VM).
static void *moment_alloc(size_t n, MomentDtype d) {
    size_t reals = (n * moment_bytes(d) + sizeof(real) - 1) / sizeof(real);
    real *p = device_calloc(reals, sizeof(real));
    vec_zero(p, reals);
    return p;
}

void optimizer_init_ranges(Optimizer *o, const TensorTable *tt, const FlatRange *ranges, int n_ranges,
                           const OptimizerOptions *options) {
    MT_ASSERT(n_ranges >= 1 && n_ranges <= OPT_MAX_RANGES);
    memset(o, 0, sizeof(*o));
    size_t elements = 0;
    for (int r = 0; r < n_ranges; r++) {
        o->ranges[r] = ranges[r];
        elements += (size_t)(ranges[r].end - ranges[r].begin);
    }
    o->n_ranges = n_ranges;
    find_fragments(o, tt);
    for (int k = 0; k < ADAMW_MOMENTS; k++) o->dtype[k] = options ? options->dtype[k] : MOMENT_FP32;
    choose_offloaded(o, options ? options->offload_fraction : 0);
    for (int k = 0; k < ADAMW_MOMENTS; k++) o->moment[k] = moment_alloc(MT_MAX(elements - o->offload_elements, 1), o->dtype[k]);
    o->host_scales = mt_malloc((size_t)MT_MAX(o->n_fragments, 1) * sizeof(MomentScales));
    for (int f = 0; f < o->n_fragments; f++) o->host_scales[f] = UNIT_SCALES;
    o->scales = device_calloc((size_t)MT_MAX(o->n_fragments, 1), sizeof(MomentScales));
    device_upload(o->scales, o->host_scales, (size_t)o->n_fragments * sizeof(MomentScales));
}

void optimizer_init(Optimizer *o, const TensorTable *tt) {
    FlatRange all = {0, (int64_t)tt->total};
    optimizer_init_ranges(o, tt, &all, 1, NULL);
}

void optimizer_free(Optimizer *o) {
    for (int k = 0; k < ADAMW_MOMENTS; k++) {
        device_free(o->moment[k]);
        device_host_free(o->host_moment[k]);
    }
    device_host_free(o->host_params);
    device_host_free(o->host_grads);
    device_free(o->scales);
    free(o->fragments);
    free(o->host_scales);
    free(o->scale_loaded);
    memset(o, 0, sizeof(*o));
}

size_t optimizer_moment_base(const Optimizer *o, int r) {
    size_t base = 0;
    for (int i = 0; i < r; i++) base += (size_t)(o->ranges[i].end - o->ranges[i].begin);
    return base;
}

double optimizer_state_bytes(const MomentDtype dtype[ADAMW_MOMENTS], double elements, double fragments) {
    double bytes = elements * (double)(moment_bytes(dtype[0]) + moment_bytes(dtype[1]));
    return bytes + fragments * (double)sizeof(MomentScales);
}

// Moment k from element index `index` on: host memory for the offloaded ones, else tensor memory.
static void *moment_at(const Optimizer *o, int k, size_t index) {
    size_t bytes = moment_bytes(o->dtype[k]);
    if (index < o->offload_elements) return (char *)o->host_moment[k] + index * bytes;
    return (char *)o->moment[k] + (index - o->offload_elements) * bytes;
}

// Copies of moment state from element index `index` on, host memory or tensor memory alike.
static void state_read(const Optimizer *o, int k, size_t index, void *host, size_t bytes) {
    if (index < o->offload_elements) memcpy(host, moment_at(o, k, index), bytes);
    else device_download(host, moment_at(o, k, index), bytes);
}

static void state_write(Optimizer *o, int k, size_t index, const void *host, size_t bytes) {
    if (index < o->offload_elements) memcpy(moment_at(o, k, index), host, bytes);
    else device_upload(moment_at(o, k, index), host, bytes);
}

// AdamW on one fragment: the backend's op on tensor memory, or for an offloaded fragment
// the cpu backend's on its host state (the gradients fetched, the new weights sent back).
static void step_fragment(Optimizer *o, int f, TensorTable *tt, const AdamWStep *h) {
    const OptFragment *fr = &o->fragments[f];
    size_t at = moment_index(o, fr->range, fr->begin), n = (size_t)(fr->end - fr->begin);
    void *m = moment_at(o, 0, at), *v = moment_at(o, 1, at);
    if (f >= o->offloaded) {
        real *p = tt->params + fr->begin;
        const real *g = tt->grads + fr->begin;
        if (!any_narrow(o)) adamw_update(p, g, m, v, n, fr->decay, h);
        else adamw_update_scaled(p, g, m, v, &o->scales[f], n, fr->decay, h, o->dtype);
        return;
    }
    real *p = o->host_params + at, *g = o->host_grads + at;
    device_download(g, tt->grads + fr->begin, n * sizeof(real));
    if (!any_narrow(o)) ops_cpu_backend.adamw_update(p, g, m, v, n, fr->decay, h);
    else ops_cpu_backend.adamw_update_scaled(p, g, m, v, &o->host_scales[f], n, fr->decay, h, o->dtype);
    device_upload(tt->params + fr->begin, p, n * sizeof(real));
}

// The offloaded fragments' host parameters from the device's (after the initial values or a load).
static void fetch_offloaded_params(Optimizer *o, const TensorTable *tt) {
    for (int f = 0; f < o->offloaded; f++) {
        const OptFragment *fr = &o->fragments[f];
        size_t at = moment_index(o, fr->range, fr->begin);
        device_download(o->host_params + at, tt->params + fr->begin, (size_t)(fr->end - fr->begin) * sizeof(real));
    }
    o->host_params_stale = 0;
}

double optimizer_clip_coeff(const Config *c, double grad_norm) {
    double clip = c->clip_grad > 0 ? c->clip_grad / (grad_norm + 1e-6) : 1;
    return clip < 1.0 ? clip : 1.0;
}

void optimizer_scale_grads(const Optimizer *o, TensorTable *tt, double coeff) {
    PROF_SCOPE(PROF_OPTIMIZER);
    if (coeff == 1.0) return;
    for (int r = 0; r < o->n_ranges; r++)
        vec_scale(tt->grads + o->ranges[r].begin, (real)coeff, (size_t)(o->ranges[r].end - o->ranges[r].begin));
}

void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_scale) {
    PROF_SCOPE(PROF_OPTIMIZER);
    o->step++;
    AdamWStep h = {.lr = lr, .beta1 = c->adam_beta1, .beta2 = c->adam_beta2, .eps = c->adam_eps,
                   .weight_decay = c->weight_decay, .step = o->step, .grad_scale = grad_scale};
    if (o->host_params_stale) fetch_offloaded_params(o, tt);
    for (int f = 0; f < o->n_fragments; f++) step_fragment(o, f, tt, &h);
}

// ---- checkpoints ------------------------------------------------------------------------------

// The range holding flat element `flat`.
static int range_of(const Optimizer *o, int64_t flat) {
    for (int r = 0; r < o->n_ranges; r++)
        if (flat >= o->ranges[r].begin && flat < o->ranges[r].end) return r;
    mt_die("internal error: flat element %lld is outside the optimizer's ranges (please report)", (long long)flat);
}

// The fragment holding [flat, flat + count), or -1 (an untrained tensor's elements).
static int fragment_of(const Optimizer *o, int64_t flat, size_t count) {
    int lo = 0, hi = o->n_fragments - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const OptFragment *fr = &o->fragments[mid];
        if (flat < fr->begin) hi = mid - 1;
        else if (flat >= fr->end) lo = mid + 1;
        else {
            if (flat + (int64_t)count > fr->end)
                mt_die("internal error: a checkpoint piece runs past its optimizer fragment (please report)");
            return mid;
        }
    }
    return -1;
}

static MomentScales fragment_scales(const Optimizer *o, int f) {
    MomentScales s = UNIT_SCALES;
    if (f >= 0 && f < o->offloaded) s = o->host_scales[f];
    else if (f >= 0) device_download(&s, &o->scales[f], sizeof(s));
    return s;
}

void optimizer_read(const Optimizer *o, int k, MomentPart part, int64_t flat, size_t count, real *host) {
    float scale = 1;  // fp32 moments are stored as their values: no scale to fetch
    if (part == MOMENT_SCALES || o->dtype[k] != MOMENT_FP32)
        scale = fragment_scales(o, fragment_of(o, flat, count)).scale[k];
    if (part == MOMENT_SCALES) {
        for (size_t i = 0; i < count; i++) host[i] = (real)scale;
        return;
    }
    size_t at = moment_index(o, range_of(o, flat), flat), bytes = count * moment_bytes(o->dtype[k]);
    if (o->dtype[k] == MOMENT_FP32) {
        state_read(o, k, at, host, bytes);
        return;
    }
    void *stored = mt_malloc(MT_MAX(bytes, 1));
    state_read(o, k, at, stored, bytes);
    MomentFactors factors = moment_factors(o->dtype[k], scale);
    for (size_t i = 0; i < count; i++) host[i] = moment_load(stored, i, o->dtype[k], factors);
    free(stored);
}

void optimizer_load_begin(Optimizer *o) {
    for (int f = 0; f < o->n_fragments; f++) o->host_scales[f] = UNIT_SCALES;
    free(o->scale_loaded);
    o->scale_loaded = mt_calloc((size_t)MT_MAX(o->n_fragments, 1) * ADAMW_MOMENTS, 1);
}

void optimizer_load_scales(Optimizer *o, int k, int64_t flat, size_t count, const real *host) {
    int f = fragment_of(o, flat, count);
    if (f < 0 || count == 0 || !moment_scaled(o->dtype[k])) return;
    for (size_t i = 1; i < count; i++)
        if (host[i] != host[0]) return;  // saved by another layout: several scales
    o->host_scales[f].scale[k] = (float)host[0];
    o->scale_loaded[f * ADAMW_MOMENTS + k] = 1;
}

void optimizer_load_values(Optimizer *o, int k, int64_t flat, size_t count, const real *host) {
    size_t at = moment_index(o, range_of(o, flat), flat), bytes = count * moment_bytes(o->dtype[k]);
    if (o->dtype[k] == MOMENT_FP32) {
        state_write(o, k, at, host, bytes);
        return;
    }
    int f = fragment_of(o, flat, count);
    float scale = 1;  // an untrained tensor's moments (no fragment, no scale): stored and read unscaled
    if (f >= 0 && o->scale_loaded[f * ADAMW_MOMENTS + k]) {
        scale = o->host_scales[f].scale[k];
    } else if (f >= 0) {
        float absmax = 0;
        for (size_t i = 0; i < count; i++) absmax = fmaxf(absmax, fabsf((float)host[i]));
        scale = o->host_scales[f].scale[k] = moment_scale(o->dtype[k], absmax);
    }
    void *stored = mt_malloc(MT_MAX(bytes, 1));
    MomentFactors factors = moment_factors(o->dtype[k], scale);
    for (size_t i = 0; i < count; i++) moment_store(stored, i, o->dtype[k], factors, host[i]);
    state_write(o, k, at, stored, bytes);
    free(stored);
}

void optimizer_load_end(Optimizer *o) {
    device_upload(o->scales, o->host_scales, (size_t)o->n_fragments * sizeof(MomentScales));
    o->host_params_stale = 1;  // the load set the device's parameters too
    free(o->scale_loaded);
    o->scale_loaded = NULL;
}
