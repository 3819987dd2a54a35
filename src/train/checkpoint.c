#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <limits.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/device.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "hf/hf_config.h"
#include "hf/hf_fp8.h"
#include "hf/hf_weights.h"
#include "ops/adamw_math.h"
#include "tokenizer/run_tokenizer.h"

#define CKPT_PATH_MAX (MT_PATH_MAX + 64)

static void make_dirs(const char *dir) {
    if (make_directories(dir))
        mt_die("--save %s: cannot create it: %s; give a directory that can be created", dir, strerror(errno));
}

static int file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

// The files of a checkpoint directory besides the model shards; the Hugging Face files
// that go with tokenizer.json (tokenizer_companion_files) come with it.
static const char *const fixed_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                                          "optimizer.safetensors", "trainer_state.json", "tokenizer.json",
                                          "tokenizer.model", "checksums.json"};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int in_list(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(name, list[i]) == 0) return 1;
    return 0;
}

// "model-00001-of-00003.safetensors" (Hugging Face's shard names).
static int is_shard_name(const char *name) {
    static const char digits[] = "0123456789";
    return strlen(name) == 32 && strncmp(name, "model-", 6) == 0 && strspn(name + 6, digits) == 5 &&
           strncmp(name + 11, "-of-", 4) == 0 && strspn(name + 15, digits) == 5 &&
           strcmp(name + 20, ".safetensors") == 0;
}

// A file moetron writes into a checkpoint directory, or the temporary file of one
// ("<name>.tmp.<pid>", left behind only by a crash).
static int is_checkpoint_file(const char *name) {
    char base[64];
    const char *tmp = strstr(name, ".tmp.");
    size_t len = tmp ? (size_t)(tmp - name) : strlen(name);
    if (len >= sizeof(base) || (tmp && (!tmp[5] || strspn(tmp + 5, "0123456789") != strlen(tmp + 5)))) return 0;
    memcpy(base, name, len);
    base[len] = 0;
    return in_list(base, fixed_files, COUNT(fixed_files)) ||
           in_list(base, tokenizer_companion_files, TOKENIZER_COMPANION_COUNT) || is_shard_name(base);
}

// Removes a checkpoint directory moetron wrote (iter_*, or a temporary or replaced one)
// without following links: a symlink at path is unlinked as a link, its target untouched;
// the directory is opened with O_NOFOLLOW and only the file names moetron writes are
// unlinked in it (unlinkat never follows a link either). Anything else found there is left
// alone, and then the directory stays too. Returns 1 when nothing is left at path.
static int remove_checkpoint_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        struct stat s;
        return lstat(path, &s) == 0 && S_ISLNK(s.st_mode) && unlink(path) == 0;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    for (struct dirent *e; (e = readdir(d));)
        if (is_checkpoint_file(e->d_name)) unlinkat(fd, e->d_name, 0);
    closedir(d);
    return rmdir(path) == 0;
}

// The JSON text and a final newline (as Python's json.dump + "\n" in transformers).
static void write_json_file(const char *path, JsonWriter *w) {
    char err[512];
    AtomicFile af;
    if (atomic_open(&af, path, err, sizeof(err))) mt_die("writing %s: %s", path, err);
    atomic_write(&af, jw_text(w), jw_len(w), err, sizeof(err));
    atomic_write(&af, "\n", 1, err, sizeof(err));
    if (atomic_commit(&af, err, sizeof(err))) mt_die("writing %s: %s", path, err);
    jw_free(w);
}

// ---- model weights: model.safetensors or Hugging Face shards ---------------------------

// With --ckpt-dtype fp8 the linear layers' matrices are F8_E4M3, each followed by its
// <name>_scale_inv block factors (hf_fp8.h), as DeepSeek-V3's checkpoint stores them.
static int stored_fp8(const Model *m, const TensorDesc *d) { return m->cfg.ckpt_fp8 && hf_fp8_quantized(d); }

// BF16 with --ckpt-dtype bf16 (and for the tensors fp8 does not quantize), except the
// routers and the expert biases: they stay F32, as Megatron-Core computes routing and
// transformers keeps mlp.gate.* (DeepSeek-V3).
static StDtype stored_dtype(const Model *m, const TensorDesc *d) {
    if (stored_fp8(m, d)) return ST_F8_E4M3;
    return m->cfg.ckpt_bf16 && !(d->flags & (TENSOR_NOT_TRAINED | TENSOR_ROUTER)) ? ST_BF16 : ST_F32;
}

static uint64_t tensor_numel(const TensorDesc *d) {
    uint64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= (uint64_t)d->shape[i];
    return n;
}

// The elements of d's <name>_scale_inv companion (its shape in grid), 0 when it has none.
static uint64_t scale_numel(const Model *m, const TensorDesc *d, int64_t grid[2]) {
    return stored_fp8(m, d) ? (uint64_t)hf_fp8_scale_shape(d->shape, grid) : 0;
}

// The bytes of d in the model files, its block scales included (a weight and its scales
// always share a shard: the split counts them as one tensor).
static uint64_t stored_bytes(const Model *m, const TensorDesc *d) {
    int64_t grid[2];
    return tensor_numel(d) * st_dtype_size(stored_dtype(m, d)) + scale_numel(m, d, grid) * sizeof(float);
}

// What the model files hold: every tensor of the table under its name, then the copies
// DeepSeek-V3's files carry (each multi-token-prediction layer holds the embedding and the
// LM head again; moetron's depths use the model's own, and reading skips the copies).
typedef struct {
    char name[MT_NAME_MAX];
    int tensor;  // the table's tensor whose values it holds
} SavedTensor;

static int saved_tensors(const Model *m, SavedTensor **out) {
    const Config *c = &m->cfg;
    int copies = m->family == HF_DEEPSEEK_V3 ? c->mtp_num_layers : 0, n = 0;
    SavedTensor *s = *out = mt_malloc(((size_t)m->tt.count + 2 * (size_t)copies) * sizeof(*s));
    for (int i = 0; i < m->tt.count; i++, n++) {
        snprintf(s[n].name, sizeof(s[n].name), "%s", m->tt.descs[i].name);
        s[n].tensor = i;
    }
    for (int k = 0; k < copies; k++) {
        hf_layer_tensor_name(s[n].name, m->family, c->num_layers + k, PART_MTP_EMBED, -1);
        s[n++].tensor = m->embed;
        hf_layer_tensor_name(s[n].name, m->family, c->num_layers + k, PART_MTP_HEAD, -1);
        s[n++].tensor = m->lm_head;
    }
    return n;
}

// Assigns every tensor to a shard as huggingface_hub's split_torch_state_dict_into_shards
// (used by transformers' save_pretrained) does: in tensor order, a tensor joins the shard
// being filled unless that would take it past max_bytes, which closes the shard first; a
// tensor larger than max_bytes alone becomes a shard of its own at once. Shards are numbered
// in the order they are closed. Returns the number of shards.
static int plan_shards(const Model *m, const SavedTensor *saved, int count, int64_t max_bytes, int *shard_of) {
    uint64_t max = max_bytes > 0 ? (uint64_t)max_bytes : UINT64_MAX, filled = 0;
    int n_shards = 0, open_from = 0;  // the shard being filled holds the unassigned tensors from open_from on
    for (int i = 0; i < count; i++) {
        uint64_t bytes = stored_bytes(m, &m->tt.descs[saved[i].tensor]);
        shard_of[i] = -1;
        if (bytes > max) {
            shard_of[i] = n_shards++;
            continue;
        }
        if (filled + bytes > max) {
            for (int k = open_from; k < i; k++)
                if (shard_of[k] < 0) shard_of[k] = n_shards;
            n_shards++;
            open_from = i;
            filled = 0;
        }
        filled += bytes;
    }
    int open = 0;
    for (int k = open_from; k < count; k++)
        if (shard_of[k] < 0) shard_of[k] = n_shards, open = 1;
    return n_shards + open;
}

static void shard_file_name(char *out, size_t len, int shard, int n_shards) {
    if (n_shards == 1) snprintf(out, len, "model.safetensors");
    else snprintf(out, len, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

// A tensor of the model files: a parameter, or the block scales of one (HF_FP8_SCALE_SUFFIX).
typedef struct {
    char name[MT_NAME_MAX + sizeof(HF_FP8_SCALE_SUFFIX)];
    int shard;
} IndexEntry;

static int compare_entries(const void *a, const void *b) {
    return strcmp(((const IndexEntry *)a)->name, ((const IndexEntry *)b)->name);
}

// model.safetensors.index.json as transformers writes it: sorted keys, total_size the bytes of
// tensor data in all shards, total_parameters their elements (block scales included).
static void write_shard_index(const char *dir, const Model *m, const SavedTensor *saved, int count,
                              const int *shard_of, int n_shards) {
    IndexEntry *sorted = mt_malloc(2 * (size_t)count * sizeof(*sorted));
    uint64_t total_size = 0, total_parameters = 0;
    int n = 0;
    for (int i = 0; i < count; i++) {
        const TensorDesc *d = &m->tt.descs[saved[i].tensor];
        int64_t grid[2];
        uint64_t scales = scale_numel(m, d, grid);
        total_size += stored_bytes(m, d);
        total_parameters += tensor_numel(d) + scales;
        sorted[n].shard = shard_of[i];
        snprintf(sorted[n++].name, sizeof(sorted->name), "%s", saved[i].name);
        if (!scales) continue;
        sorted[n].shard = shard_of[i];
        snprintf(sorted[n++].name, sizeof(sorted->name), "%s" HF_FP8_SCALE_SUFFIX, saved[i].name);
    }
    qsort(sorted, (size_t)n, sizeof(*sorted), compare_entries);
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_key(&w, "metadata");
    jw_begin_object(&w);
    jw_kv_int(&w, "total_parameters", (int64_t)total_parameters);
    jw_kv_int(&w, "total_size", (int64_t)total_size);
    jw_end_object(&w);
    jw_key(&w, "weight_map");
    jw_begin_object(&w);
    char file[64];
    for (int i = 0; i < n; i++) {
        shard_file_name(file, sizeof(file), sorted[i].shard, n_shards);
        jw_kv_string(&w, sorted[i].name, file);
    }
    jw_end_object(&w);
    jw_end_object(&w);
    free(sorted);
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    write_json_file(path, &w);
}

static void stream_open(StWriter *w, const char *path) {
    char err[512];
    if (stw_stream_open(w, path, err, sizeof(err))) mt_die("writing %s: %s", path, err);
}

static void stream_close(StWriter *w, const char *path) {
    char err[512];
    if (stw_stream_close(w, err, sizeof(err))) mt_die("writing %s: %s", path, err);
}

// d (saved as `saved_name`) in the header of its shard: the tensor, and after it its block
// scales when it has them.
static void declare_model_tensor(StWriter *w, const Model *m, const TensorDesc *d, const char *saved_name) {
    stw_declare(w, saved_name, stored_dtype(m, d), d->ndim, d->shape);
    int64_t grid[2];
    if (!scale_numel(m, d, grid)) return;
    char name[MT_NAME_MAX + sizeof(HF_FP8_SCALE_SUFFIX)];
    snprintf(name, sizeof(name), "%s" HF_FP8_SCALE_SUFFIX, saved_name);
    stw_declare(w, name, ST_F32, 2, grid);
}

// The host buffers an FP8 tensor is quantized into before it is written (the largest one's
// codes and block scales; NULL without --ckpt-dtype fp8).
typedef struct {
    uint8_t *codes;
    float *scale_inv;
} Fp8Staging;

static Fp8Staging fp8_staging(const Model *m) {
    Fp8Staging f = {NULL, NULL};
    uint64_t codes = 0, scales = 0;
    for (int i = 0; i < m->tt.count; i++) {
        int64_t grid[2];
        uint64_t n = scale_numel(m, &m->tt.descs[i], grid);
        if (n) codes = MT_MAX(codes, tensor_numel(&m->tt.descs[i])), scales = MT_MAX(scales, n);
    }
    if (!codes) return f;
    f.codes = mt_malloc((size_t)codes);
    f.scale_inv = mt_malloc((size_t)scales * sizeof(float));
    return f;
}

// d's values v into the stream: converted to its dtype, or quantized with its block scales.
static void stream_model_tensor(StWriter *w, const Model *m, const TensorDesc *d, const real *v, Fp8Staging *f) {
    int64_t grid[2];
    uint64_t scales = scale_numel(m, d, grid);
    if (!scales) {
        stw_stream_values(w, v, tensor_numel(d));
        return;
    }
    hf_fp8_quantize(f->codes, f->scale_inv, v, d->shape[0], d->shape[1]);
    stw_stream_raw(w, f->codes, tensor_numel(d));
    stw_stream_raw(w, f->scale_inv, scales);
}

// Once per run: FP8 matrices whose blocks transformers' CPU dequantization would misplace.
static void note_unaligned_fp8(const Model *m) {
    static int noted;
    const TensorDesc *first = NULL;
    int count = 0;
    for (int i = 0; !noted && i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        if (!stored_fp8(m, d) || hf_fp8_sides_aligned(d->shape)) continue;
        if (!count++) first = d;
    }
    noted = 1;
    if (!count) return;
    printf("note: --ckpt-dtype fp8: %s [%lld, %lld] and %d more FP8 matrices have a side above 128 that is not a "
           "multiple of 128: moetron reads their last, short blocks, transformers' dequantizing load (on CPU) "
           "misplaces them\n", first->name, (long long)first->shape[0], (long long)first->shape[1], count - 1);
    fflush(stdout);
}

// One shard at a time, one tensor at a time: the writer holds no more than the tensor the
// source hands it (the parameters themselves in one process), and with fp8 its codes.
static void write_model_files(const char *dir, const Model *m, const CkptSource *src) {
    SavedTensor *saved;
    int count = saved_tensors(m, &saved);
    int *shard_of = mt_malloc((size_t)count * sizeof(*shard_of));
    int n_shards = plan_shards(m, saved, count, m->cfg.max_shard_bytes, shard_of);
    Fp8Staging fp8 = {NULL, NULL};
    if (src->writer) fp8 = fp8_staging(m), note_unaligned_fp8(m);
    char file[64], path[CKPT_PATH_MAX + 128];
    double bytes = 0, written = 0;
    for (int i = 0; i < count; i++) bytes += (double)stored_bytes(m, &m->tt.descs[saved[i].tensor]);
    Progress pg;
    progress_begin(&pg, "saving", "MB", BYTES_PER_MB, bytes, PROGRESS_WHEN_SLOW);
    for (int s = 0; s < n_shards; s++) {
        shard_file_name(file, sizeof(file), s, n_shards);
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        StWriter w;
        stw_init(&w);
        for (int i = 0; src->writer && i < count; i++)
            if (shard_of[i] == s) declare_model_tensor(&w, m, &m->tt.descs[saved[i].tensor], saved[i].name);
        if (src->writer) stream_open(&w, path);
        for (int i = 0; i < count; i++) {
            if (shard_of[i] != s) continue;
            const real *v = src->values(src->ctx, saved[i].tensor, CKPT_PARAMS);
            if (src->writer) stream_model_tensor(&w, m, &m->tt.descs[saved[i].tensor], v, &fp8);
            written += (double)stored_bytes(m, &m->tt.descs[saved[i].tensor]);
            if (src->writer) progress_update(&pg, written);
        }
        if (src->writer) stream_close(&w, path);
    }
    if (src->writer) progress_end(&pg);
    if (n_shards > 1 && src->writer) write_shard_index(dir, m, saved, count, shard_of, n_shards);
    free(fp8.codes);
    free(fp8.scale_inv);
    free(shard_of);
    free(saved);
}

// ---- optimizer state, trainer state, tokenizer ------------------------------------------

// The tensor groups of optimizer.safetensors, in the order each tensor's entries are
// stored: the AdamW moments (decoded to real values, whatever the run stores them as), with
// BF16 model weights the F32 master weights (what training resumes from), and with fp16 /
// fp8 moments each element's scale, in groups named after the dtype (exp_avg_fp8_scale.).
enum { OPT_MAX_GROUPS = 2 + 1 + 2 * ADAMW_MOMENTS };
typedef struct {
    char prefix[32];
    int buffer;
} OptGroup;

static const char *const MOMENT_PREFIX[ADAMW_MOMENTS] = {"exp_avg", "exp_avg_sq"};

static OptGroup scale_group(int k, MomentDtype dtype) {
    OptGroup g = {.buffer = CKPT_EXP_AVG_SCALE + k};
    snprintf(g.prefix, sizeof(g.prefix), "%s_%s_scale.", MOMENT_PREFIX[k], dtype == MOMENT_FP8 ? "fp8" : "fp16");
    return g;
}

// The groups a save of a run with c writes; their number.
static int saved_groups(const Config *c, OptGroup *out) {
    int n = 0;
    out[n++] = (OptGroup){"exp_avg.", CKPT_EXP_AVG};
    out[n++] = (OptGroup){"exp_avg_sq.", CKPT_EXP_AVG_SQ};
    if (c->ckpt_bf16) out[n++] = (OptGroup){"master.", CKPT_PARAMS};
    for (int k = 0; k < ADAMW_MOMENTS; k++)
        if (moment_scaled((MomentDtype)c->moment_dtype[k])) out[n++] = scale_group(k, (MomentDtype)c->moment_dtype[k]);
    return n;
}

void ckpt_read_piece(const TensorTable *tt, const Optimizer *opt, int buffer, int64_t flat, size_t count,
                     real *host) {
    if (buffer == CKPT_PARAMS) {
        device_download(host, tt->params + flat, count * sizeof(real));
        return;
    }
    int scales = buffer >= CKPT_EXP_AVG_SCALE;
    int k = buffer - (scales ? CKPT_EXP_AVG_SCALE : CKPT_EXP_AVG);
    optimizer_read(opt, k, scales ? MOMENT_SCALES : MOMENT_VALUES, flat, count, host);
}

static void write_optimizer_file(const char *path, const Model *m, const CkptSource *src) {
    OptGroup groups[OPT_MAX_GROUPS];
    int n_groups = saved_groups(&m->cfg, groups);
    StWriter w;
    stw_init(&w);
    char name[sizeof(groups) + MT_NAME_MAX];  // more than any prefix and name
    for (int i = 0; src->writer && i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        for (int g = 0; g < n_groups; g++) {
            snprintf(name, sizeof(name), "%s%s", groups[g].prefix, d->name);
            stw_declare(&w, name, ST_F32, d->ndim, d->shape);
        }
    }
    if (src->writer) stream_open(&w, path);
    for (int i = 0; i < m->tt.count; i++)
        for (int g = 0; g < n_groups; g++) {
            const real *v = src->values(src->ctx, i, groups[g].buffer);
            if (src->writer) stw_stream_values(&w, v, tensor_numel(&m->tt.descs[i]));
        }
    if (src->writer) stream_close(&w, path);
}

// "quantizer_state": {"ranks": R, "floats": F, "lengths": [R integers], "bits": [R·F integers]}:
// exact, NaN included; each rank's row of F holds its length of floats, then padding.
static void write_quant_state(JsonWriter *w, const TrainerState *st) {
    jw_key(w, "quantizer_state");
    jw_begin_object(w);
    jw_kv_int(w, "ranks", (int64_t)st->quant_ranks);
    jw_kv_int(w, "floats", (int64_t)st->quant_floats);
    jw_key(w, "lengths");
    jw_begin_array(w);
    for (size_t r = 0; r < st->quant_ranks; r++) jw_int(w, st->quant_lengths[r]);
    jw_end_array(w);
    jw_key(w, "bits");
    jw_begin_array(w);
    for (size_t i = 0; i < st->quant_ranks * st->quant_floats; i++) jw_int(w, st->quant_bits[i]);
    jw_end_array(w);
    jw_end_object(w);
}

static void write_trainer_state(const char *path, const TrainerState *st, long optimizer_step) {
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "iteration", st->iteration);
    jw_kv_int(&w, "consumed_train_samples", st->consumed_train_samples);
    jw_kv_int(&w, "optimizer_step", optimizer_step);
    jw_kv_int(&w, "world_size", 1);
    if (st->quant_bits) write_quant_state(&w, st);
    if (st->lr_schedule_start) jw_kv_int(&w, "lr_schedule_start", st->lr_schedule_start);
    if (st->rng_start_sample) jw_kv_int(&w, "rng_start_sample", st->rng_start_sample);
    if (st->loss_scaling || st->overflow_skips) {
        jw_kv_double(&w, "loss_scale", st->loss_scaler.scale);
        jw_kv_int(&w, "loss_scale_growth_tracker", st->loss_scaler.growth_tracker);
        jw_kv_int(&w, "loss_scale_hysteresis_tracker", st->loss_scaler.hysteresis_tracker);
        jw_kv_int(&w, "overflow_skips", st->overflow_skips);
    }
    jw_end_object(&w);
    write_json_file(path, &w);
}

static void write_bytes(const char *dir, const char *name, const FileBytes *f) {
    char path[CKPT_PATH_MAX + 64], err[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (write_file_atomic(path, f->bytes, f->len, err, sizeof(err))) mt_die("writing %s: %s", path, err);
}

// The ids generation stops at: one, or the list of them (as transformers accepts).
static void write_end_ids(JsonWriter *w, const RunTokenizer *rt) {
    jw_key(w, "eos_token_id");
    if (rt->n_end_ids == 1) {
        jw_int(w, rt->eos_id);
        return;
    }
    jw_begin_array(w);
    for (int i = 0; i < rt->n_end_ids; i++) jw_int(w, rt->end_ids[i]);
    jw_end_array(w);
}

// generation_config.json for a tokenizer that came without one: transformers' generate
// then stops at the tokens moetron generate stops at.
static void write_generation_config(const char *dir, const RunTokenizer *rt) {
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    if (rt->bos_id >= 0) jw_kv_int(&w, "bos_token_id", rt->bos_id);
    if (rt->n_end_ids) {
        write_end_ids(&w, rt);
        jw_kv_int(&w, "pad_token_id", rt->eos_id);
    }
    jw_end_object(&w);
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    write_json_file(path, &w);
}

static void write_token_string(JsonWriter *w, const char *key, const Tokenizer *tok, int32_t id) {
    if (id < 0) return;
    size_t len;
    const char *bytes = tokenizer_token_bytes(tok, id, &len);
    char *text = mt_malloc(len + 1);
    memcpy(text, bytes, len);
    text[len] = 0;
    jw_kv_string(w, key, text);
    free(text);
}

// tokenizer_config.json for a tokenizer.json that came without one, so that AutoTokenizer
// loads the checkpoint with its special tokens.
static void write_tokenizer_config(const char *dir, const RunTokenizer *rt, const Config *c) {
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "tokenizer_class", "PreTrainedTokenizerFast");
    write_token_string(&w, "bos_token", rt->tok, rt->bos_id);
    write_token_string(&w, "eos_token", rt->tok, rt->eos_id);
    jw_kv_int(&w, "model_max_length", c->max_positions);
    jw_kv_bool(&w, "clean_up_tokenization_spaces", 0);
    jw_end_object(&w);
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    write_json_file(path, &w);
}

// tokenizer.json and the companion files as run_tokenizer_open read them at start-up
// (never re-read from their path, which a --keep-checkpoints prune may have removed);
// generation_config.json and tokenizer_config.json from the tokenizer when it had none.
static void copy_tokenizer_files(const RunTokenizer *rt, const Config *c, const char *dir) {
    if (rt->json.bytes) write_bytes(dir, rt->file_name, &rt->json);
    for (int i = 0; i < TOKENIZER_COMPANION_COUNT; i++)
        if (rt->companions[i].bytes) write_bytes(dir, tokenizer_companion_files[i], &rt->companions[i]);
    if (!rt->companions[COMPANION_GENERATION_CONFIG].bytes) write_generation_config(dir, rt);
    if (!rt->companions[COMPANION_TOKENIZER_CONFIG].bytes) write_tokenizer_config(dir, rt, c);
}

// ---- checksums ------------------------------------------------------------------------------

static int compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// checksums.json: the size and CRC-32 of every other file of the (complete) directory,
// written last, before the directory is renamed into place.
static void write_checksums(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) mt_die("--save: cannot list %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_checkpoint_file(e->d_name) || !strcmp(e->d_name, "checksums.json")) continue;
        names = mt_realloc(names, (n + 1) * sizeof(*names));
        names[n] = mt_malloc(strlen(e->d_name) + 1);
        strcpy(names[n++], e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), compare_strings);
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "algorithm", "crc32");
    jw_key(&w, "files");
    jw_begin_object(&w);
    char path[CKPT_PATH_MAX + 320], err[256], hex[16];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        uint32_t crc;
        uint64_t bytes;
        if (crc32_file(path, &crc, &bytes, err, sizeof(err))) mt_die("--save: %s: %s", path, err);
        snprintf(hex, sizeof(hex), "%08x", crc);
        jw_key(&w, names[i]);
        jw_begin_object(&w);
        jw_kv_int(&w, "bytes", (int64_t)bytes);
        jw_kv_string(&w, "crc32", hex);
        jw_end_object(&w);
        free(names[i]);
    }
    free(names);
    jw_end_object(&w);
    jw_end_object(&w);
    snprintf(path, sizeof(path), "%s/checksums.json", dir);
    write_json_file(path, &w);
}

void checkpoint_verify_checksums(const char *dir) {
    char path[CKPT_PATH_MAX + 320], file[CKPT_PATH_MAX + 320], err[512];
    snprintf(path, sizeof(path), "%s/checksums.json", dir);
    if (!file_exists(path)) return;
    JsonValue *root = json_parse_file(path, err, sizeof(err));
    if (!root) mt_die("%s: %s; the checkpoint is damaged: --load an earlier iter_* directory", path, err);
    const JsonValue *files = json_get(root, "files");
    const char *algorithm = json_get_string(root, "algorithm");
    if (!files || files->type != JSON_OBJECT || !algorithm || strcmp(algorithm, "crc32"))
        mt_die("%s: needs \"algorithm\": \"crc32\" and a \"files\" object; the checkpoint is damaged", path);
    for (size_t i = 0; i < files->count; i++) {
        const char *name = files->keys[i], *want_crc = json_get_string(&files->items[i], "crc32");
        int64_t want_bytes;
        if (!want_crc || !json_get_int64(&files->items[i], "bytes", &want_bytes) || strchr(name, '/'))
            mt_die("%s: entry %s needs \"bytes\" and \"crc32\"; the checkpoint is damaged", path, name);
        snprintf(file, sizeof(file), "%s/%s", dir, name);
        uint32_t crc;
        uint64_t bytes;
        char hex[16];
        if (crc32_file(file, &crc, &bytes, err, sizeof(err)))
            mt_die("%s: %s (listed in checksums.json); the checkpoint is damaged: --load an earlier iter_* directory",
                   file, err);
        snprintf(hex, sizeof(hex), "%08x", crc);
        if ((int64_t)bytes != want_bytes || strcmp(hex, want_crc))
            mt_die("%s: %llu bytes with CRC-32 %s, but checksums.json says %lld bytes with %s: the file is damaged; "
                   "--load an earlier iter_* directory", file, (unsigned long long)bytes, hex, (long long)want_bytes,
                   want_crc);
    }
    json_free(root);
}

// ---- keeping the newest checkpoints -----------------------------------------------------------

// The iteration N of a name that starts "iter_N" as checkpoint_save spells it (iter_%07ld:
// seven digits, more only without a leading zero), *rest the remainder; -1 for other names.
static long iteration_of(const char *name, const char **rest) {
    static const char prefix[] = "iter_";
    enum { ITER_DIGITS = 7 };
    if (strncmp(name, prefix, sizeof(prefix) - 1)) return -1;
    const char *digits = name + sizeof(prefix) - 1;
    size_t n = strspn(digits, "0123456789");
    if (n < ITER_DIGITS || (n > ITER_DIGITS && digits[0] == '0')) return -1;
    *rest = digits + n;
    return strtol(digits, NULL, 10);
}

static int compare_longs(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

// --keep-checkpoints N: remove the iteration directories of dir beyond the newest N (never
// `current`, the one just saved).
static void prune_checkpoints(const char *dir, int keep, long current) {
    if (keep <= 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    long *iters = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *rest;
        long it = iteration_of(e->d_name, &rest);
        if (it < 0 || *rest) continue;
        iters = mt_realloc(iters, (n + 1) * sizeof(*iters));
        iters[n++] = it;
    }
    closedir(d);
    qsort(iters, n, sizeof(*iters), compare_longs);
    char path[CKPT_PATH_MAX + 32];
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        if (iters[i] == current) continue;
        snprintf(path, sizeof(path), "%s/iter_%07ld", dir, iters[i]);
        remove_checkpoint_dir(path);
    }
    free(iters);
}

// ---- the --save directory: checked, locked and cleaned at start-up ----------------------------

static const char save_lock_name[] = "moetron.lock";
static const char latest_name[] = "latest_checkpointed_iteration.txt";

// Whether paths a and b name the same directory (the same file when both exist, else the
// same text but for trailing slashes).
static int same_directory(const char *a, const char *b) {
    struct stat sa, sb;
    if (!stat(a, &sa) && !stat(b, &sb)) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    size_t la = strlen(a), lb = strlen(b);
    while (la > 1 && a[la - 1] == '/') la--;
    while (lb > 1 && b[lb - 1] == '/') lb--;
    return la == lb && !strncmp(a, b, la);
}

void checkpoint_load_nothing_yet(Config *c) {
    char hf_config[CKPT_PATH_MAX + 64];
    snprintf(hf_config, sizeof(hf_config), "%s/config.json", c->load);
    if (!c->load[0] || !c->save[0] || !same_directory(c->load, c->save) || checkpoint_dir_has_checkpoints(c->load) ||
        file_exists(hf_config))
        return;
    if (comm_world_rank() == 0)  // before the trainer silences the other ranks
        printf("note: --load %s holds no checkpoint yet (it is the --save directory): training starts from scratch, "
               "as Megatron-LM does\n", c->load);
    c->load[0] = 0;
}

int checkpoint_dir_has_checkpoints(const char *dir) {
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, latest_name);
    return file_exists(path);
}


// Creates dir when missing and proves that files can be created in it (a probe file,
// removed again): a file in its place, a path under a file or a read-only filesystem is
// found before the first step.
static void check_writable_dir(const char *dir) {
    make_dirs(dir);
    struct stat s;
    if (stat(dir, &s)) mt_die("--save %s: cannot open it: %s", dir, strerror(errno));
    if (!S_ISDIR(s.st_mode))
        mt_die("--save %s is not a directory; give a directory (it is created when missing)", dir);
    char probe[CKPT_PATH_MAX + 32];
    snprintf(probe, sizeof(probe), "%s/.write_probe.%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) mt_die("--save %s: cannot write there: %s; give a writable directory", dir, strerror(errno));
    close(fd);
    unlink(probe);
}

// A filesystem mounted without lock support (Lustre without flock, ...).
static int locks_unsupported(int err) { return err == ENOSYS || err == ENOLCK || err == EOPNOTSUPP; }

// Takes the lock DIR/moetron.lock (flock, held until the process ends; the kernel releases
// it when the process is killed) and records the process id in it for the error of a second
// run. Returns 0, with a console note, where the filesystem has no locks.
static int lock_save_dir(const char *dir) {
    static int lock_fd = -1;  // open for the life of the process
    if (lock_fd >= 0) return 1;
    char path[CKPT_PATH_MAX + 32], holder[32] = "";
    snprintf(path, sizeof(path), "%s/%s", dir, save_lock_name);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) mt_die("--save %s: cannot open its lock file %s: %s", dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        if (locks_unsupported(errno)) {
            printf("note: --save %s: the filesystem cannot lock %s (%s): a second run on the directory is not "
                   "detected, and what interrupted runs left there is not removed\n", dir, path, strerror(errno));
            fflush(stdout);
            close(fd);
            return 0;
        }
        if (errno != EWOULDBLOCK) mt_die("--save %s: cannot lock %s: %s", dir, path, strerror(errno));
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        mt_die("--save %s is in use by another moetron run (process %s holds %s); wait for it to end or give "
               "another --save directory", dir, holder[0] ? holder : "?", path);
    }
    int len = snprintf(holder, sizeof(holder), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, holder, len, 0) != len)
        mt_die("--save %s: cannot write %s: %s", dir, path, strerror(errno));
    lock_fd = fd;
    return 1;
}

// What a killed run leaves: iter_N.tmp.<pid> (a save in progress), iter_N.old.<pid> (a
// replaced directory not yet removed) and latest_checkpointed_iteration.txt.tmp.<pid>.
static int has_pid_suffix(const char *rest, const char *kind) {
    size_t k = strlen(kind);
    return strncmp(rest, kind, k) == 0 && rest[k] && strspn(rest + k, "0123456789") == strlen(rest + k);
}

static int is_stale_save_dir(const char *name) {
    const char *rest;
    return iteration_of(name, &rest) >= 0 && (has_pid_suffix(rest, ".tmp.") || has_pid_suffix(rest, ".old."));
}

static int is_stale_latest_file(const char *name) {
    size_t n = strlen(latest_name);
    return strncmp(name, latest_name, n) == 0 && has_pid_suffix(name + n, ".tmp.");
}

// Removes them (the directories with the link-safe remover); only while the lock is held,
// so that no live run's save is touched.
static void remove_stale_saves(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) mt_die("--save %s: cannot list it: %s", dir, strerror(errno));
    char path[CKPT_PATH_MAX + 320];
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (is_stale_save_dir(e->d_name)) removed += remove_checkpoint_dir(path);
        else if (is_stale_latest_file(e->d_name)) unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    if (removed) {
        printf("note: --save %s: removed %d unfinished checkpoint director%s that interrupted runs left\n", dir,
               removed, removed == 1 ? "y" : "ies");
        fflush(stdout);
    }
}

void checkpoint_claim_save_dir(const char *dir) {
    check_writable_dir(dir);
    if (lock_save_dir(dir)) remove_stale_saves(dir);
}

// The source of one process holding everything: each tensor downloaded from its tensor memory
// into one host staging buffer (the largest tensor's size), which the writer streams from.
typedef struct {
    const Model *m;
    const Optimizer *opt;
    real *staging;
} LocalTensors;

static const real *local_values(void *ctx, int tensor, int buffer) {
    const LocalTensors *l = ctx;
    const TensorDesc *d = &l->m->tt.descs[tensor];
    ckpt_read_piece(&l->m->tt, l->opt, buffer, (int64_t)d->offset, d->numel, l->staging);
    return l->staging;
}

void checkpoint_save(const char *dir, const Model *m, const Optimizer *opt, const TrainerState *st) {
    LocalTensors local = {m, opt, mt_malloc(hf_largest_tensor(&m->tt) * sizeof(real))};
    CkptSource src = {.values = local_values, .ctx = &local, .writer = 1, .optimizer_step = opt ? opt->step : -1};
    checkpoint_save_from(dir, m, &src, st);
    free(local.staging);
}

// Moves the complete temporary directory into place as DIR/iter_N, then points
// latest_checkpointed_iteration.txt at it and prunes old iterations.
static void publish_checkpoint(const char *dir, const char *tmp_dir, const char *final_dir, const Config *c,
                               long iteration) {
    char old_dir[CKPT_PATH_MAX + 32], path[CKPT_PATH_MAX + 64];
    // A directory of the same iteration is replaced only by the complete new one: swapped
    // atomically where the filesystem can, else moved aside just before the rename.
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        remove_checkpoint_dir(tmp_dir);  // now holds the previous directory
    } else {
        snprintf(old_dir, sizeof(old_dir), "%s.old.%d", final_dir, (int)getpid());
        int had_old = rename(final_dir, old_dir) == 0;
        if (rename(tmp_dir, final_dir)) mt_die("--save %s: cannot rename %s: %s", dir, tmp_dir, strerror(errno));
        if (had_old) remove_checkpoint_dir(old_dir);
    }
    fsync_dir_of(final_dir);

    char latest[32], err[512];
    int len = snprintf(latest, sizeof(latest), "%ld\n", iteration);
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    if (write_file_atomic(path, latest, len, err, sizeof(err))) mt_die("writing %s: %s", path, err);
    prune_checkpoints(dir, c->keep_checkpoints, iteration);
}

// Only the writer touches the file system; every process runs the tensor loops (where a
// collective source gathers each tensor to the writer).
void checkpoint_save_from(const char *dir, const Model *m, const CkptSource *src, const TrainerState *st) {
    char final_dir[CKPT_PATH_MAX], tmp_dir[CKPT_PATH_MAX + 32];
    char path[CKPT_PATH_MAX + 64];
    snprintf(final_dir, sizeof(final_dir), "%s/iter_%07ld", dir, st->iteration);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp.%d", final_dir, (int)getpid());
    if (src->writer) {
        MT_ASSERT(!m->cfg.tokenizer_model[0] || m->cfg.run_tokenizer);  // run_tokenizer_open read it at start-up
        make_dirs(dir);
        remove_checkpoint_dir(tmp_dir);
        if (mkdir(tmp_dir, 0755)) mt_die("--save %s: cannot create %s: %s", dir, tmp_dir, strerror(errno));
        JsonWriter w;
        jw_init(&w);
        hf_config_write(&w, &m->cfg, m->family);
        snprintf(path, sizeof(path), "%s/config.json", tmp_dir);
        write_json_file(path, &w);
    }
    write_model_files(tmp_dir, m, src);
    if (src->optimizer_step >= 0) {
        snprintf(path, sizeof(path), "%s/optimizer.safetensors", tmp_dir);
        write_optimizer_file(path, m, src);
        snprintf(path, sizeof(path), "%s/trainer_state.json", tmp_dir);
        if (src->writer) write_trainer_state(path, st, src->optimizer_step);
    }
    if (!src->writer) return;
    if (m->cfg.run_tokenizer) copy_tokenizer_files(m->cfg.run_tokenizer, &m->cfg, tmp_dir);
    write_checksums(tmp_dir);
    publish_checkpoint(dir, tmp_dir, final_dir, &m->cfg, st->iteration);
}

// ---- loading ------------------------------------------------------------------------------

// The directory --load DIR names (see checkpoint_resolve), not yet verified.
static void resolve_load_dir(char *out, const char *dir) {
    char path[CKPT_PATH_MAX + 64], err[512];
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    if (file_exists(path)) {
        size_t len;
        char *text = (char *)read_file_all(path, INFILE_NOTE, &len, err, sizeof(err));
        if (!text) mt_die("%s: %s", path, err);
        char *end;
        long iteration = strtol(text, &end, 10);
        while (end < text + len && (*end == '\n' || *end == ' ' || *end == '\r')) end++;
        if (end == text || end != text + len || iteration < 0)
            mt_die("%s must hold one iteration number; the file is damaged", path);
        free(text);
        snprintf(out, MT_PATH_MAX + 32, "%s/iter_%07ld", dir, iteration);
        snprintf(path, sizeof(path), "%s/config.json", out);
        if (!file_exists(path))
            mt_die("--load %s: latest_checkpointed_iteration.txt names iteration %ld but %s is missing",
                   dir, iteration, path);
        return;
    }
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!file_exists(path))
        mt_die("--load %s: no latest_checkpointed_iteration.txt and no config.json there; point --load at a "
               "directory written by --save or at a Hugging Face model directory", dir);
    snprintf(out, MT_PATH_MAX + 32, "%s", dir);
}

// Verified before anything in it is parsed: a damaged config.json is reported as damage,
// not as a misleading shape or memory error.
void checkpoint_resolve(char *out, const char *dir) {
    resolve_load_dir(out, dir);
    checkpoint_verify_checksums(out);
}

// What a group of optimizer.safetensors is loaded into: a moment's values or scales (of
// the dtype this run stores it as; the other dtype's scales are read and dropped).
typedef struct {
    Optimizer *opt;
    int k;
    int use;  // 0: drop
} MomentSink;

static void store_moment_values(void *ctx, int64_t flat, const real *values, size_t count) {
    MomentSink *s = ctx;
    optimizer_load_values(s->opt, s->k, flat, count, values);
}

static void store_moment_scales(void *ctx, int64_t flat, const real *values, size_t count) {
    MomentSink *s = ctx;
    if (s->use) optimizer_load_scales(s->opt, s->k, flat, count, values);
}

// The moments, and the F32 master weights when the checkpoint has them: training resumes
// from those, not from the (possibly BF16) model file. The moments land in opt's ranges
// (its shards), stored as opt stores them; the scales come first (groups are read one
// after the other), so that a moment saved by the same layout gets its bits back.
// A group read in opt's ranges (its shards) and handed to `store` with `sink`.
static HfTensorGroup moment_group(const char *prefix, const Optimizer *opt,
                                  void (*store)(void *, int64_t, const real *, size_t), MomentSink *sink, int optional) {
    HfTensorGroup g = {.prefix = prefix, .n_windows = opt->n_ranges, .store = store, .store_ctx = sink,
                       .optional = optional};
    for (int r = 0; r < opt->n_ranges; r++) g.windows[r] = (HfWindow){opt->ranges[r].begin, opt->ranges[r].end, NULL};
    return g;
}

static void load_optimizer(const char *dir, Model *m, Optimizer *opt) {
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
    HfTensorGroup groups[OPT_MAX_GROUPS + ADAMW_MOMENTS];
    MomentSink sinks[3 * ADAMW_MOMENTS];
    OptGroup scale_groups[2 * ADAMW_MOMENTS];
    int n = 0;
    for (int k = 0; k < ADAMW_MOMENTS; k++)
        for (int fp8 = 0; fp8 <= 1; fp8++) {  // either dtype's scales: only this run's are used
            MomentDtype dtype = fp8 ? MOMENT_FP8 : MOMENT_FP16;
            scale_groups[2 * k + fp8] = scale_group(k, dtype);
            sinks[n] = (MomentSink){opt, k, opt->dtype[k] == dtype};
            groups[n] = moment_group(scale_groups[2 * k + fp8].prefix, opt, store_moment_scales, &sinks[n], 1);
            n++;
        }
    for (int k = 0; k < ADAMW_MOMENTS; k++, n++) {
        sinks[n] = (MomentSink){opt, k, 1};
        groups[n] = moment_group(k ? "exp_avg_sq." : "exp_avg.", opt,
                                 store_moment_values, &sinks[n], 0);
    }
    groups[n++] = (HfTensorGroup){.prefix = "master.", .dest = m->tt.params, .optional = 1};
    optimizer_load_begin(opt);
    hf_load_tensor_groups(path, m, groups, n);
    optimizer_load_end(opt);
}

// The quantizers' state when the checkpoint has one (a run with --fp8-format / --fp4-format).
static void read_quant_state(const JsonValue *root, const char *path, TrainerState *st) {
    const JsonValue *q = json_get(root, "quantizer_state"), *bits = json_get(q, "bits");
    if (!q) return;
    int64_t ranks, floats;
    if (!json_get_int64(q, "ranks", &ranks) || !json_get_int64(q, "floats", &floats) || ranks < 1 || floats < 1 ||
        !bits || bits->type != JSON_ARRAY || bits->count != (size_t)ranks * (size_t)floats)
        mt_die("%s: quantizer_state needs ranks, floats and ranks x floats integer bits", path);
    st->quant_bits = mt_malloc(bits->count * sizeof(uint32_t));
    for (size_t i = 0; i < bits->count; i++) {
        const JsonValue *b = json_at(bits, i);
        if (!b->has_int64 || b->integer < 0 || b->integer > UINT32_MAX)
            mt_die("%s: quantizer_state bits[%zu] is not a 32-bit pattern", path, i);
        st->quant_bits[i] = (uint32_t)b->integer;
    }
    st->quant_ranks = (size_t)ranks, st->quant_floats = (size_t)floats;
    const JsonValue *lengths = json_get(q, "lengths");
    if (!lengths) return;  // written before the lengths: restore_quant_state starts afresh
    if (lengths->type != JSON_ARRAY || lengths->count != (size_t)ranks)
        mt_die("%s: quantizer_state lengths needs one integer per rank (%lld)", path, (long long)ranks);
    st->quant_lengths = mt_malloc((size_t)ranks * sizeof(int64_t));
    for (size_t r = 0; r < (size_t)ranks; r++) {
        const JsonValue *n = json_at(lengths, r);
        if (!n->has_int64 || n->integer < 0 || n->integer > floats)
            mt_die("%s: quantizer_state lengths[%zu] is not a count of floats up to %lld", path, r, (long long)floats);
        st->quant_lengths[r] = n->integer;
    }
}

// The loss scaler's state when the checkpoint has one (a run with loss scaling wrote it).
static void read_loss_scaler_state(const JsonValue *root, const char *path, TrainerState *st) {
    double scale;
    int64_t growth, hysteresis, skips;
    st->loss_scaling = json_get_number(root, "loss_scale", &scale);
    if (!st->loss_scaling) return;
    if (!json_get_int64(root, "loss_scale_growth_tracker", &growth) ||
        !json_get_int64(root, "loss_scale_hysteresis_tracker", &hysteresis) ||
        !json_get_int64(root, "overflow_skips", &skips) || !(scale > 0) || growth < 0 || skips < 0 ||
        hysteresis < INT_MIN || hysteresis > INT_MAX)
        mt_die("%s: loss_scale needs a positive scale and integer loss_scale_growth_tracker, "
               "loss_scale_hysteresis_tracker and overflow_skips beside it", path);
    st->loss_scaler = (LossScalerState){.scale = (float)scale, .growth_tracker = (long)growth,
                                        .hysteresis_tracker = (int)hysteresis};
    st->overflow_skips = (long)skips;
}

void checkpoint_read_trainer_state(const char *dir, TrainerState *st, long *optimizer_step) {
    char path[CKPT_PATH_MAX + 64], err[512];
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    JsonValue *root = json_parse_file(path, err, sizeof(err));
    if (!root) mt_die("%s: %s", path, err);
    int64_t iteration, consumed, step;
    if (!json_get_int64(root, "iteration", &iteration) || !json_get_int64(root, "consumed_train_samples", &consumed) ||
        !json_get_int64(root, "optimizer_step", &step) || iteration < 0 || consumed < 0 || step < 0)
        mt_die("%s: needs non-negative integers iteration, consumed_train_samples and optimizer_step", path);
    st->iteration = (long)iteration;
    st->consumed_train_samples = consumed;
    *optimizer_step = (long)step;
    // where a --no-load-optim / --no-load-rng resume restarted the schedule and the random
    // streams (absent: at the run's start)
    int64_t lr_start = 0, rng_start = 0;
    if ((json_get(root, "lr_schedule_start") && !json_get_int64(root, "lr_schedule_start", &lr_start)) ||
        (json_get(root, "rng_start_sample") && !json_get_int64(root, "rng_start_sample", &rng_start)) ||
        lr_start < 0 || lr_start > iteration || rng_start < 0 || rng_start > consumed)
        mt_die("%s: lr_schedule_start and rng_start_sample must be integers from 0 to iteration and "
               "consumed_train_samples", path);
    st->lr_schedule_start = (long)lr_start;
    st->rng_start_sample = rng_start;
    read_loss_scaler_state(root, path, st);
    read_quant_state(root, path, st);
    json_free(root);
}

void checkpoint_load(const char *dir, Model *m, Optimizer *opt, TrainerState *st) {
    hf_weights_load(dir, m);
    if (!opt) return;
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    if (!file_exists(path)) return;  // a Hugging Face directory: fine-tune from step 0
    snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
    if (!file_exists(path)) mt_die("--load: %s is missing; the checkpoint is incomplete", path);
    load_optimizer(dir, m, opt);
    checkpoint_read_trainer_state(dir, st, &opt->step);
}
