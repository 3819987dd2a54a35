// hf_weights.c — reading the model's weights from a checkpoint or Hugging Face
// directory: model.safetensors, or the shards named by model.safetensors.index.json;
// per-expert or fused 3-D expert tensors; any floating dtype, FP8 with 128×128 block
// scales. Every tensor the files hold must be used. The same checks serve the tensor groups
// of optimizer.safetensors (hf_load_tensor_groups).
#include "hf/hf_weights.h"

#include <stdio.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "core/device.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "hf/hf_fp8.h"

#define WEIGHTS_PATH_MAX (MT_PATH_MAX + 64)

static int file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

static void open_safetensors(StFile *f, const char *path) {
    char err[512];
    if (st_open(f, path, err, sizeof(err))) mt_die("%s: %s", path, err);
}

// A WeightSource is the set of safetensors files holding the model: model.safetensors alone,
// or the shards named by model.safetensors.index.json. Tensors are looked up by name (through
// the index's weight_map when sharded) and marked as used when read; whatever is left unused
// at the end is an unexpected tensor.

typedef struct {
    const char *name;   // tensor name (owned by the parsed index)
    int file;           // index into WeightSource.files
} MapEntry;

typedef struct {
    int n_files;
    StFile *files;
    char **paths;
    unsigned char **used;      // [n_files][n_tensors of that file]
    int n_map;                 // sharded only: weight_map entries sorted by name
    MapEntry *map;
    JsonValue *index;          // sharded only: the parsed index (owns the names)
    char where[WEIGHTS_PATH_MAX + 64];  // the file named in errors: model.safetensors or the index
    real *staging;             // host memory a tensor is read into before it is uploaded (ws_stage)
} WeightSource;

// Open one more file of the source (st_open validates it; a bad file is fatal).
static int ws_add_file(WeightSource *ws, const char *path) {
    ws->files = mt_realloc(ws->files, (size_t)(ws->n_files + 1) * sizeof(*ws->files));
    ws->paths = mt_realloc(ws->paths, (size_t)(ws->n_files + 1) * sizeof(*ws->paths));
    ws->used = mt_realloc(ws->used, (size_t)(ws->n_files + 1) * sizeof(*ws->used));
    StFile *f = &ws->files[ws->n_files];
    open_safetensors(f, path);
    ws->paths[ws->n_files] = mt_strdup(path);
    ws->used[ws->n_files] = mt_calloc((size_t)f->n_tensors + 1, 1);
    return ws->n_files++;
}

static int map_entry_cmp(const void *a, const void *b) {
    return strcmp(((const MapEntry *)a)->name, ((const MapEntry *)b)->name);
}

// A shard name from the index must be a plain file name next to the index.
static int shard_name_ok(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

// The file index of shard `shard`, opening it on first use (each shard is opened once).
static int ws_shard(WeightSource *ws, const char *dir, const char *shard) {
    char path[WEIGHTS_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, shard);
    for (int i = 0; i < ws->n_files; i++)
        if (strcmp(ws->paths[i], path) == 0) return i;
    if (!file_exists(path))
        mt_die("%s: weight_map names shard %s, which is missing (%s); the checkpoint is incomplete (every "
               "shard the index lists must be there)", ws->where, shard, path);
    return ws_add_file(ws, path);
}

// Parse model.safetensors.index.json, open its shards and check that every mapped tensor
// is in its shard.
static void ws_open_sharded(WeightSource *ws, const char *dir) {
    char err[512];
    ws->index = json_parse_file(ws->where, err, sizeof(err));
    if (!ws->index) mt_die("%s: %s; the index is damaged (re-download it)", ws->where, err);
    const JsonValue *wm = json_get(ws->index, "weight_map");
    if (!wm || wm->type != JSON_OBJECT)
        mt_die("%s: needs a \"weight_map\" object {tensor name: shard file}; the index is damaged", ws->where);
    ws->n_map = (int)wm->count;
    ws->map = mt_calloc((size_t)ws->n_map + 1, sizeof(*ws->map));
    for (int i = 0; i < ws->n_map; i++) {
        const JsonValue *v = &wm->items[i];
        if (v->type != JSON_STRING || !shard_name_ok(v->string))
            mt_die("%s: weight_map entry %s must be the file name of a shard in the same directory",
                   ws->where, wm->keys[i]);
        int file = ws_shard(ws, dir, v->string);
        if (!st_find(&ws->files[file], wm->keys[i]))
            mt_die("%s: weight_map puts tensor %s in %s, but that shard does not hold it; the index and "
                   "the shards do not match (re-download them)", ws->where, wm->keys[i], v->string);
        ws->map[i] = (MapEntry){wm->keys[i], file};
    }
    qsort(ws->map, (size_t)ws->n_map, sizeof(*ws->map), map_entry_cmp);
    for (int i = 1; i < ws->n_map; i++)
        if (strcmp(ws->map[i - 1].name, ws->map[i].name) == 0)
            mt_die("%s: weight_map lists tensor %s twice; the index is damaged", ws->where, ws->map[i].name);
}

// model.safetensors when present, else the shards of model.safetensors.index.json.
static void ws_open(WeightSource *ws, const char *dir) {
    memset(ws, 0, sizeof(*ws));
    snprintf(ws->where, sizeof(ws->where), "%s/model.safetensors", dir);
    if (file_exists(ws->where)) {
        ws_add_file(ws, ws->where);
        return;
    }
    snprintf(ws->where, sizeof(ws->where), "%s/model.safetensors.index.json", dir);
    if (!file_exists(ws->where))
        mt_die("--load: %s/model.safetensors is missing (and there is no model.safetensors.index.json with "
               "shards); the checkpoint is incomplete", dir);
    ws_open_sharded(ws, dir);
}

static void ws_close(WeightSource *ws) {
    for (int i = 0; i < ws->n_files; i++) {
        st_close(&ws->files[i]);
        free(ws->paths[i]);
        free(ws->used[i]);
    }
    free(ws->files);
    free(ws->paths);
    free(ws->used);
    free(ws->map);
    json_free(ws->index);
    free(ws->staging);
}

// The staging buffer for m's tensors: the largest piece m holds (tensors are read from the
// files into host memory, then copied into tensor memory with one upload each).
static void ws_stage(WeightSource *ws, const Model *m) {
    ws->staging = mt_malloc(hf_largest_tensor(&m->tt) * sizeof(real));
}

size_t hf_largest_tensor(const TensorTable *tt) {
    size_t largest = 1;
    for (int i = 0; i < tt->count; i++) largest = MT_MAX(largest, tt->descs[i].numel);
    return largest;
}

// Look a tensor up (through the weight_map when sharded); NULL when absent. *file is set
// to the file that holds it.
static const StTensor *ws_find(const WeightSource *ws, const char *name, int *file) {
    if (!ws->map) {
        *file = 0;
        return st_find(&ws->files[0], name);
    }
    MapEntry key = {name, 0};
    const MapEntry *e = bsearch(&key, ws->map, (size_t)ws->n_map, sizeof(*ws->map), map_entry_cmp);
    if (!e) return NULL;
    *file = e->file;
    return st_find(&ws->files[e->file], name);
}

static void ws_mark_used(WeightSource *ws, int file, const StTensor *t) {
    ws->used[file][t - ws->files[file].tensors] = 1;
}

static void format_shape(char *out, size_t len, int ndim, const int64_t *shape) {
    out[0] = 0;
    for (int i = 0; i < ndim; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s%lld", i ? "," : "", (long long)shape[i]);
}

static void check_shape(const WeightSource *ws, const char *name, const StTensor *t, int ndim,
                        const int64_t *shape) {
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) return;
    char want[96], got[96];
    format_shape(want, sizeof(want), ndim, shape);
    format_shape(got, sizeof(got), t->ndim, t->shape);
    mt_die("%s: tensor %s has shape [%s] but the model needs [%s]", ws->where, name, got, want);
}

static void convert_real(const WeightSource *ws, int file, const char *name, const StTensor *t, real *out) {
    if (st_read_real(&ws->files[file], t, out))
        mt_die("%s: tensor %s has dtype %s; expected a floating-point dtype", ws->where, name,
               st_dtype_name(t->dtype));
}

// Elements [first, first + count) of t, as a tensor of its own (1-D).
static StTensor element_slice(const StTensor *t, int64_t first, int64_t count) {
    StTensor slice = *t;
    slice.ndim = 1;
    slice.shape[0] = count;
    slice.begin = t->begin + (uint64_t)first * st_dtype_size(t->dtype);
    slice.end = slice.begin + (uint64_t)count * st_dtype_size(t->dtype);
    return slice;
}

// Elements [lo, hi) of the piece of model tensor d this rank holds (d->shard), into out:
// the global tensor's values start at element `base` of t (0, or an expert's slice of a
// fused tensor). A piece of rows is one byte range of the file, a piece of columns one
// range per row; nothing else is read.
static void read_piece_range(const WeightSource *ws, int file, const char *name, const StTensor *t, int64_t base,
                             const TensorDesc *d, int64_t lo, int64_t hi, real *out) {
    TensorPieceRuns pr = tensor_piece_runs(d->ndim, d->shape, d->shard.axis, d->shard.parts, d->shard.index);
    for (int64_t e = lo; e < hi;) {
        int64_t run = e / pr.chunk, within = e % pr.chunk, n = MT_MIN(pr.chunk - within, hi - e);
        StTensor part = element_slice(t, base + pr.first + run * pr.stride + within, n);
        convert_real(ws, file, name, &part, out + (e - lo));
        e += n;
    }
}

// Read this rank's piece of tensor `name` into out, checking the file's (global) shape
// against the model tensor d; NULL when the source does not hold it.
static const StTensor *ws_read_named(WeightSource *ws, const char *name, const TensorDesc *d, real *out) {
    int file;
    const StTensor *t = ws_find(ws, name, &file);
    if (!t) return NULL;
    check_shape(ws, name, t, d->ndim, d->shape);
    read_piece_range(ws, file, name, t, 0, d, 0, (int64_t)d->numel, out);
    ws_mark_used(ws, file, t);
    return t;
}

// DeepSeek-style FP8: an F8_E4M3 matrix NAME with a companion NAME_scale_inv holding one
// factor per 128x128 block ([ceil(rows/128), ceil(cols/128)]). Multiplies out (the piece of
// the model tensor d this rank holds) in place.
static void apply_block_scales(WeightSource *ws, const char *name, const StTensor *t, const TensorDesc *d, real *out) {
    enum { BLOCK = HF_FP8_BLOCK };
    if (t->dtype != ST_F8_E4M3 || t->ndim != 2) return;
    char sname[MT_NAME_MAX + sizeof(HF_FP8_SCALE_SUFFIX)];
    snprintf(sname, sizeof(sname), "%s" HF_FP8_SCALE_SUFFIX, name);
    int file;
    const StTensor *s = ws_find(ws, sname, &file);
    if (!s) return;
    int64_t want[2];
    hf_fp8_scale_shape(t->shape, want);
    check_shape(ws, sname, s, 2, want);
    real *scale = mt_malloc((size_t)st_numel(s) * sizeof(real));
    convert_real(ws, file, sname, s, scale);
    // the piece: local_shape rows and columns from (row0, col0) of the matrix
    int64_t piece_rows = d->local_shape[0], piece_cols = d->local_shape[1];
    int64_t row0 = d->shard.axis == 0 ? d->shard.index * piece_rows : 0;
    int64_t col0 = d->shard.axis == 1 ? d->shard.index * piece_cols : 0;
    for (int64_t r = 0; r < piece_rows; r++)
        for (int64_t c = 0; c < piece_cols; c++)
            out[r * piece_cols + c] *= scale[((row0 + r) / BLOCK) * want[1] + (col0 + c) / BLOCK];
    free(scale);
    ws_mark_used(ws, file, s);
}

// Which part of an expert's MLP a per-expert name is: 0 gate, 1 up, 2 down, -1 none.
static int expert_part(const char *name) {
    static const char *const suffixes[3][2] = {
        {".gate_proj.weight", ".w1.weight"}, {".up_proj.weight", ".w3.weight"}, {".down_proj.weight", ".w2.weight"}};
    size_t len = strlen(name);
    for (int part = 0; part < 3; part++)
        for (int k = 0; k < 2; k++) {
            size_t sl = strlen(suffixes[part][k]);
            if (len > sl && strcmp(name + len - sl, suffixes[part][k]) == 0) return part;
        }
    return -1;
}

// transformers v5 fuses a layer's experts: mlp.experts.gate_up_proj [E, 2I, H] (gate rows
// first) and mlp.experts.down_proj [E, H, I]. Reads expert d->expert's slice of the part
// d names; returns 0 when the fused tensor is absent. fused_name receives the name tried.
static int read_fused_expert(WeightSource *ws, const Model *m, const TensorDesc *d, real *out, char *fused_name) {
    int part = expert_part(d->name);
    if (part < 0 || d->ndim != 2 || d->layer < 0 || d->expert < 0) return 0;
    const char *which = part == 2 ? "down_proj" : "gate_up_proj";
    int file = 0;
    // transformers v5 uses mlp.experts for both families; older conversions of Mixtral may
    // keep block_sparse_moe. Errors name the transformers v5 spelling.
    snprintf(fused_name, MT_NAME_MAX + 32, "model.layers.%d.block_sparse_moe.experts.%s", d->layer, which);
    const StTensor *t = ws_find(ws, fused_name, &file);
    if (!t) {
        snprintf(fused_name, MT_NAME_MAX + 32, "model.layers.%d.mlp.experts.%s", d->layer, which);
        t = ws_find(ws, fused_name, &file);
    }
    if (!t) return 0;
    int64_t rows = d->shape[0], cols = d->shape[1];
    int64_t want[3] = {m->cfg.num_experts, part == 2 ? rows : 2 * rows, cols};
    check_shape(ws, fused_name, t, 3, want);
    // The expert's tensor is contiguous: expert e, rows [part*rows, (part+1)*rows) of the
    // middle axis; this rank reads its piece of it.
    int64_t first = (int64_t)d->expert * want[1] * cols + (part == 1 ? rows * cols : 0);
    read_piece_range(ws, file, fused_name, t, first, d, 0, (int64_t)d->numel, out);
    ws_mark_used(ws, file, t);
    return 1;
}

// ---- upcycling (--moe-use-upcycling) ---------------------------------------------------------

// Megatron-Core's scale of an upcycled expert's SwiGLU matrices: the cube root of the
// activation scale, G (the granularity), or E·G/k with pre-softmax routing; 1 for plain
// upcycling, whose first forward is then the dense model's.
static double upcycling_scale(const Config *c) {
    int G = c->moe_upcycling_granularity;
    double activation = c->moe_router_pre_softmax ? (double)c->num_experts * G / c->moe_router_topk : G;
    return cbrt(activation);
}

// This rank's piece of an upcycled expert's part (gate, up or down) d: expert e takes slice
// e mod G of its layer's dense MLP (rows of gate and up, columns of down: I of the dense F),
// times upcycling_scale. Returns 0 when d is no routed expert's part or not upcycling.
static int read_upcycled_expert(WeightSource *ws, const Model *m, const TensorDesc *d, real *out) {
    static const LayerPart dense_parts[3] = {PART_MLP_GATE, PART_MLP_UP, PART_MLP_DOWN};
    const Config *c = &m->cfg;
    int part = expert_part(d->name);
    if (!c->moe_use_upcycling || part < 0 || d->ndim != 2 || d->layer < 0 || d->expert < 0) return 0;
    char name[MT_NAME_MAX];
    hf_layer_tensor_name(name, m->family, d->layer, dense_parts[part], -1);
    int file;
    const StTensor *t = ws_find(ws, name, &file);
    if (!t)
        mt_die("%s: --moe-use-upcycling: tensor %s (layer %d's dense MLP) is missing; --load must name a dense "
               "checkpoint", ws->where, name, d->layer);
    int64_t rows = d->shape[0], cols = d->shape[1], I = c->moe_ffn, F = I * c->moe_upcycling_granularity;
    int down = part == 2, slice = d->expert % c->moe_upcycling_granularity;
    int64_t dense_shape[2] = {down ? rows : F, down ? F : cols};
    check_shape(ws, name, t, 2, dense_shape);
    real *whole = mt_malloc((size_t)(rows * cols) * sizeof(real));  // the expert's global tensor
    for (int64_t r = 0; r < rows; r++) {
        StTensor run = element_slice(t, down ? r * F + slice * I : (slice * I + r) * cols, cols);
        convert_real(ws, file, name, &run, whole + r * cols);
    }
    TensorPieceRuns pr = tensor_piece_runs(d->ndim, d->shape, d->shard.axis, d->shard.parts, d->shard.index);
    real scale = (real)upcycling_scale(c);
    for (int64_t e = 0; e < (int64_t)d->numel; e++)
        out[e] = whole[pr.first + e / pr.chunk * pr.stride + e % pr.chunk] * scale;
    free(whole);
    ws_mark_used(ws, file, t);
    return 1;
}

// Upcycling: the dense MLPs of the layers other pipeline stages hold are theirs to read.
static void ws_skip_other_stages_dense_mlps(WeightSource *ws, const Model *m) {
    static const LayerPart parts[3] = {PART_MLP_GATE, PART_MLP_UP, PART_MLP_DOWN};
    if (!m->cfg.moe_use_upcycling) return;
    for (int l = 0; l < config_all_layers(&m->cfg); l++) {
        if (plan_holds_layer(&m->plan, l)) continue;
        for (int p = 0; p < 3; p++) {
            char name[MT_NAME_MAX];
            hf_layer_tensor_name(name, m->family, l, parts[p], -1);
            int file;
            const StTensor *t = ws_find(ws, name, &file);
            if (t) ws_mark_used(ws, file, t);
        }
    }
}

// Upcycling: what the dense checkpoint cannot hold keeps its initial values (the router,
// its biases, the shared experts).
static int upcycling_keeps_init(const Model *m, const TensorDesc *d) {
    return m->cfg.moe_use_upcycling && ((d->flags & TENSOR_ROUTER) || strstr(d->name, "shared_expert"));
}

// Read the model tensor d: under its own name, else as a slice of a fused expert tensor (or,
// upcycling, of its layer's dense MLP). Returns 0 when d keeps its initial values.
static int ws_read_param(WeightSource *ws, const Model *m, const TensorDesc *d, real *out) {
    if (read_upcycled_expert(ws, m, d, out)) return 1;
    const StTensor *t = ws_read_named(ws, d->name, d, out);
    if (t) {
        apply_block_scales(ws, d->name, t, d, out);
        return 1;
    }
    if (upcycling_keeps_init(m, d)) return 0;
    char fused[MT_NAME_MAX + 32] = "";
    if (read_fused_expert(ws, m, d, out, fused)) return 1;
    if (fused[0])
        mt_die("%s: tensor %s is missing (and so is the fused %s); the checkpoint does not match its "
               "config.json", ws->where, d->name, fused);
    mt_die("%s: tensor %s is missing; the checkpoint does not match its config.json", ws->where, d->name);
}

// Every tensor of every file must have been read (or used as a fused tensor / block scale).
static void ws_reject_unused(const WeightSource *ws) {
    for (int i = 0; i < ws->n_files; i++)
        for (int k = 0; k < ws->files[i].n_tensors; k++)
            if (!ws->used[i][k])
                mt_die("%s: unexpected tensor %s; the checkpoint does not match its config.json", ws->paths[i],
                       ws->files[i].tensors[k].name);
}

// Whether `name` is one of the copies of the embedding and LM head a DeepSeek-V3
// multi-token-prediction layer carries (moetron's depths use the model's own).
static int is_mtp_copy(const char *name, HfFamily family, int layer) {
    char copy[MT_NAME_MAX];
    hf_layer_tensor_name(copy, family, layer, PART_MTP_EMBED, -1);
    if (!strcmp(name, copy)) return 1;
    hf_layer_tensor_name(copy, family, layer, PART_MTP_HEAD, -1);
    return !strcmp(name, copy);
}

// DeepSeek-V3's multi-token-prediction layers (model.layers.L.* for L from num_layers): the
// copies of the embedding and head each carries are skipped, and so are the depths beyond
// --mtp-num-layers (with a note).
static void ws_skip_mtp_layers(WeightSource *ws, const Model *m) {
    const Config *c = &m->cfg;
    int L = c->num_layers, trained = L + c->mtp_num_layers, present = L + c->hf_mtp_layers;
    long skipped = 0;
    for (int i = 0; i < ws->n_files; i++)
        for (int k = 0; k < ws->files[i].n_tensors; k++) {
            const char *name = ws->files[i].tensors[k].name;
            int layer, end = 0;
            if (sscanf(name, "model.layers.%d.%n", &layer, &end) != 1 || end == 0) continue;
            if (layer < L || ws->used[i][k] || layer >= MT_MAX(trained, present)) continue;
            if (layer < trained && !is_mtp_copy(name, m->family, layer)) continue;  // read by name, or reported
            ws->used[i][k] = 1;
            skipped += layer >= trained;
        }
    if (skipped)
        fprintf(stderr, "note: skipped %ld tensors of %d multi-token-prediction layer(s) (num_nextn_predict_layers) "
                "beyond --mtp-num-layers %d (give the flag to train them)\n", skipped, present - trained,
                c->mtp_num_layers);
}

// With expert parallelism the file also holds the experts of the other ranks (and their
// FP8 scales): this rank does not read them.
static void ws_skip_remote_experts(WeightSource *ws, const Model *m, const char *prefix) {
    char name[2 * MT_NAME_MAX + 32];
    for (int i = 0; i < m->n_remote; i++)
        for (int scales = 0; scales < 2; scales++) {
            snprintf(name, sizeof(name), "%s%s%s", prefix, m->remote_names[i], scales ? HF_FP8_SCALE_SUFFIX : "");
            int file;
            const StTensor *t = ws_find(ws, name, &file);
            if (t) ws_mark_used(ws, file, t);
        }
}

// The part of tensor `name` (the model tensor d) that lies inside g's windows: each
// window's intersection with the elements of d's piece, read from the file on its own.
static const StTensor *ws_read_windows(WeightSource *ws, const char *name, const TensorDesc *d,
                                       const HfTensorGroup *g) {
    int file;
    const StTensor *t = ws_find(ws, name, &file);
    if (!t) return NULL;
    check_shape(ws, name, t, d->ndim, d->shape);
    int64_t begin = (int64_t)d->offset, end = begin + (int64_t)d->numel;
    for (int w = 0; w < g->n_windows; w++) {
        const HfWindow *win = &g->windows[w];
        int64_t from = MT_MAX(begin, win->begin), to = MT_MIN(end, win->end);
        if (to <= from) continue;
        read_piece_range(ws, file, name, t, 0, d, from - begin, to - begin, ws->staging);
        if (g->store) g->store(g->store_ctx, from, ws->staging, (size_t)(to - from));
        else device_upload(win->dest + (from - win->begin), ws->staging, (size_t)(to - from) * sizeof(real));
    }
    ws_mark_used(ws, file, t);
    return t;
}

static void ws_read_group(WeightSource *ws, const Model *m, HfTensorGroup *g) {
    char name[MT_NAME_MAX + 32];
    int first_found = -1, first_missing = -1;
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        snprintf(name, sizeof(name), "%s%s", g->prefix, d->name);
        int found = (g->n_windows ? ws_read_windows(ws, name, d, g) : ws_read_named(ws, name, d, ws->staging)) != NULL;
        if (found && !g->n_windows) device_upload(g->dest + d->offset, ws->staging, d->numel * sizeof(real));
        if (!found && !g->optional)
            mt_die("%s: tensor %s is missing; the checkpoint does not match its config.json", ws->where, name);
        if (found && first_found < 0) first_found = i;
        if (!found && first_missing < 0) first_missing = i;
    }
    g->present = first_found >= 0;
    if (g->present && first_missing >= 0)
        mt_die("%s: holds %s%s but not %s%s; the %s* tensors must be there for every parameter or for none "
               "(the file is damaged)", ws->where, g->prefix, m->tt.descs[first_found].name, g->prefix,
               m->tt.descs[first_missing].name, g->prefix);
}

void hf_load_tensor_groups(const char *path, const Model *m, HfTensorGroup *groups, int n_groups) {
    WeightSource ws;
    memset(&ws, 0, sizeof(ws));
    snprintf(ws.where, sizeof(ws.where), "%s", path);
    ws_add_file(&ws, path);
    ws_stage(&ws, m);
    for (int g = 0; g < n_groups; g++) {
        ws_read_group(&ws, m, &groups[g]);
        ws_skip_remote_experts(&ws, m, groups[g].prefix);
    }
    ws_reject_unused(&ws);
    ws_close(&ws);
}

void hf_weights_load(const char *dir, Model *m) {
    WeightSource ws;
    ws_open(&ws, dir);
    ws_stage(&ws, m);
    Progress pg;
    progress_begin(&pg, "loading", "MB", BYTES_PER_MB, (double)m->tt.total * sizeof(real), PROGRESS_WHEN_SLOW);
    double loaded = 0;
    for (int i = 0; i < m->tt.count; i++) {
        if (ws_read_param(&ws, m, &m->tt.descs[i], ws.staging))
            device_upload(tt_param(&m->tt, i), ws.staging, m->tt.descs[i].numel * sizeof(real));
        loaded += (double)m->tt.descs[i].numel * sizeof(real);
        progress_update(&pg, loaded);
    }
    progress_end(&pg);
    ws_skip_mtp_layers(&ws, m);
    ws_skip_remote_experts(&ws, m, "");
    ws_skip_other_stages_dense_mlps(&ws, m);
    ws_reject_unused(&ws);
    ws_close(&ws);
}

