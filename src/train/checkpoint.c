#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "hf/hf_config.h"
#include "hf/hf_weights.h"

#define CKPT_PATH_MAX (MT_PATH_MAX + 64)

static void make_dirs(const char *dir) {
    char path[CKPT_PATH_MAX];
    snprintf(path, sizeof(path), "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) && errno != EEXIST) mt_die("--save %s: cannot create %s: %s", dir, path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) && errno != EEXIST) mt_die("--save %s: cannot create it: %s", dir, strerror(errno));
}

static int file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

// The files of a checkpoint directory besides the model shards; the Hugging Face files
// copied from beside --tokenizer-model when they are there.
static const char *const fixed_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                                          "optimizer.safetensors", "trainer_state.json", "tokenizer.json",
                                          "checksums.json"};
static const char *const tokenizer_companions[] = {"tokenizer_config.json", "special_tokens_map.json",
                                                    "generation_config.json"};
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
           in_list(base, tokenizer_companions, COUNT(tokenizer_companions)) || is_shard_name(base);
}

static void remove_tree(const char *dir) {
    // Only ever called on a checkpoint directory moetron wrote: a flat set of files. Anything
    // else found there is left alone (and then the directory stays too).
    DIR *d = opendir(dir);
    if (!d) return;
    char path[CKPT_PATH_MAX + 320];
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_checkpoint_file(e->d_name)) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
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

static void finish_safetensors(StWriter *w, const char *path) {
    char err[512];
    if (stw_finish(w, path, err, sizeof(err))) mt_die("writing %s: %s", path, err);
}

// ---- model weights: model.safetensors or Hugging Face shards ---------------------------

// BF16 with --ckpt-dtype bf16, except the routers and the expert biases: they stay F32, as
// Megatron-Core computes routing and transformers keeps mlp.gate.* (DeepSeek-V3).
static StDtype stored_dtype(const Model *m, const TensorDesc *d) {
    return m->cfg.ckpt_bf16 && !(d->flags & (TENSOR_NOT_TRAINED | TENSOR_ROUTER)) ? ST_BF16 : ST_F32;
}

static uint64_t tensor_numel(const TensorDesc *d) {
    uint64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= (uint64_t)d->shape[i];
    return n;
}

static uint64_t stored_bytes(const Model *m, const TensorDesc *d) {
    return tensor_numel(d) * st_dtype_size(stored_dtype(m, d));
}

// Assigns every tensor to a shard as huggingface_hub's split_torch_state_dict_into_shards
// (used by transformers' save_pretrained) does: in tensor order, a tensor joins the shard
// being filled unless that would take it past max_bytes, which closes the shard first; a
// tensor larger than max_bytes alone becomes a shard of its own at once. Shards are numbered
// in the order they are closed. Returns the number of shards.
static int plan_shards(const Model *m, int64_t max_bytes, int *shard_of) {
    uint64_t max = max_bytes > 0 ? (uint64_t)max_bytes : UINT64_MAX, filled = 0;
    int n_shards = 0, open_from = 0;  // the shard being filled holds the unassigned tensors from open_from on
    for (int i = 0; i < m->tt.count; i++) {
        uint64_t bytes = stored_bytes(m, &m->tt.descs[i]);
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
    for (int k = open_from; k < m->tt.count; k++)
        if (shard_of[k] < 0) shard_of[k] = n_shards, open = 1;
    return n_shards + open;
}

static void shard_file_name(char *out, size_t len, int shard, int n_shards) {
    if (n_shards == 1) snprintf(out, len, "model.safetensors");
    else snprintf(out, len, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

static int compare_names(const void *a, const void *b) {
    return strcmp((*(const TensorDesc *const *)a)->name, (*(const TensorDesc *const *)b)->name);
}

// model.safetensors.index.json as transformers writes it: sorted keys, total_size the bytes of
// tensor data in all shards.
static void write_shard_index(const char *dir, const Model *m, const int *shard_of, int n_shards) {
    const TensorDesc **sorted = mt_malloc((size_t)m->tt.count * sizeof(*sorted));
    uint64_t total_size = 0, total_parameters = 0;
    for (int i = 0; i < m->tt.count; i++) {
        sorted[i] = &m->tt.descs[i];
        total_size += stored_bytes(m, sorted[i]);
        total_parameters += tensor_numel(sorted[i]);
    }
    qsort(sorted, (size_t)m->tt.count, sizeof(*sorted), compare_names);
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
    for (int i = 0; i < m->tt.count; i++) {
        shard_file_name(file, sizeof(file), shard_of[sorted[i] - m->tt.descs], n_shards);
        jw_kv_string(&w, sorted[i]->name, file);
    }
    jw_end_object(&w);
    jw_end_object(&w);
    free(sorted);
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    write_json_file(path, &w);
}

// One shard at a time; the writer reads the parameters in place (no copy of the model).
static void write_model_files(const char *dir, const Model *m) {
    int *shard_of = mt_malloc((size_t)m->tt.count * sizeof(*shard_of));
    int n_shards = plan_shards(m, m->cfg.max_shard_bytes, shard_of);
    char file[64], path[CKPT_PATH_MAX + 128];
    for (int s = 0; s < n_shards; s++) {
        StWriter w;
        stw_init(&w);
        for (int i = 0; i < m->tt.count; i++) {
            const TensorDesc *d = &m->tt.descs[i];
            if (shard_of[i] == s)
                stw_add_real_view(&w, d->name, stored_dtype(m, d), d->ndim, d->shape, tt_param(&m->tt, i));
        }
        shard_file_name(file, sizeof(file), s, n_shards);
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        finish_safetensors(&w, path);
    }
    if (n_shards > 1) write_shard_index(dir, m, shard_of, n_shards);
    free(shard_of);
}

// ---- optimizer state, trainer state, tokenizer ------------------------------------------

// The tensor groups of optimizer.safetensors: the AdamW moments, and with BF16 model weights
// the F32 master weights (what training resumes from).
enum { OPT_GROUPS = 3 };
static int optimizer_groups(const Model *m, const Optimizer *opt, HfTensorGroup *g) {
    g[0] = (HfTensorGroup){.prefix = "exp_avg.", .dest = opt->exp_avg};
    g[1] = (HfTensorGroup){.prefix = "exp_avg_sq.", .dest = opt->exp_avg_sq};
    g[2] = (HfTensorGroup){.prefix = "master.", .dest = m->tt.params, .optional = 1};
    return m->cfg.ckpt_bf16 ? 3 : 2;
}

static void write_optimizer_file(const char *path, const Model *m, const Optimizer *opt) {
    HfTensorGroup groups[OPT_GROUPS];
    int n_groups = optimizer_groups(m, opt, groups);
    StWriter w;
    stw_init(&w);
    char name[MT_NAME_MAX + 16];
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        for (int g = 0; g < n_groups; g++) {
            snprintf(name, sizeof(name), "%s%s", groups[g].prefix, d->name);
            stw_add_real_view(&w, name, ST_F32, d->ndim, d->shape, groups[g].dest + d->offset);
        }
    }
    finish_safetensors(&w, path);
}

static void write_trainer_state(const char *path, const TrainerState *st, const Optimizer *opt) {
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "iteration", st->iteration);
    jw_kv_int(&w, "consumed_train_samples", st->consumed_train_samples);
    jw_kv_int(&w, "optimizer_step", opt->step);
    jw_kv_int(&w, "world_size", 1);
    jw_end_object(&w);
    write_json_file(path, &w);
}

static void copy_file(const char *from, const char *to) {
    char err[512];
    size_t len;
    uint8_t *bytes = read_file_all(from, INFILE_CONFIG, &len, err, sizeof(err));
    if (!bytes) mt_die("--tokenizer-model: %s: %s", from, err);
    if (write_file_atomic(to, bytes, len, err, sizeof(err))) mt_die("writing %s: %s", to, err);
    free(bytes);
}

// --tokenizer-model FILE becomes tokenizer.json; the Hugging Face files that go with it are
// copied when they are in FILE's directory.
static void copy_tokenizer_files(const char *tokenizer_model, const char *dir) {
    char from[CKPT_PATH_MAX + 64], to[CKPT_PATH_MAX + 64];
    snprintf(to, sizeof(to), "%s/tokenizer.json", dir);
    copy_file(tokenizer_model, to);
    const char *slash = strrchr(tokenizer_model, '/');
    int dir_len = slash ? (int)(slash - tokenizer_model) : 1;
    const char *src_dir = slash ? tokenizer_model : ".";
    for (size_t i = 0; i < COUNT(tokenizer_companions); i++) {
        snprintf(from, sizeof(from), "%.*s/%s", dir_len, src_dir, tokenizer_companions[i]);
        if (!file_exists(from)) continue;
        snprintf(to, sizeof(to), "%s/%s", dir, tokenizer_companions[i]);
        copy_file(from, to);
    }
}

void checkpoint_check_save_inputs(const Config *c) {
    if (!c->tokenizer_model[0]) return;
    char err[512];
    uint64_t size;
    int fd = open_input_file(c->tokenizer_model, INFILE_CONFIG, &size, err, sizeof(err));
    if (fd < 0) mt_die("--tokenizer-model %s: %s; give its tokenizer.json file", c->tokenizer_model, err);
    close(fd);
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
        long it;
        int end = 0;
        if (sscanf(e->d_name, "iter_%7ld%n", &it, &end) != 1 || end != 12 || e->d_name[end]) continue;
        iters = mt_realloc(iters, (n + 1) * sizeof(*iters));
        iters[n++] = it;
    }
    closedir(d);
    qsort(iters, n, sizeof(*iters), compare_longs);
    char path[CKPT_PATH_MAX + 32];
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        if (iters[i] == current) continue;
        snprintf(path, sizeof(path), "%s/iter_%07ld", dir, iters[i]);
        remove_tree(path);
    }
    free(iters);
}

void checkpoint_save(const char *dir, const Model *m, const Optimizer *opt, const TrainerState *st) {
    char final_dir[CKPT_PATH_MAX], tmp_dir[CKPT_PATH_MAX + 32], old_dir[CKPT_PATH_MAX + 32];
    char path[CKPT_PATH_MAX + 64];
    checkpoint_check_save_inputs(&m->cfg);
    make_dirs(dir);
    snprintf(final_dir, sizeof(final_dir), "%s/iter_%07ld", dir, st->iteration);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp.%d", final_dir, (int)getpid());
    remove_tree(tmp_dir);
    if (mkdir(tmp_dir, 0755)) mt_die("--save %s: cannot create %s: %s", dir, tmp_dir, strerror(errno));

    JsonWriter w;
    jw_init(&w);
    hf_config_write(&w, &m->cfg, m->family);
    snprintf(path, sizeof(path), "%s/config.json", tmp_dir);
    write_json_file(path, &w);
    write_model_files(tmp_dir, m);
    if (opt) {
        snprintf(path, sizeof(path), "%s/optimizer.safetensors", tmp_dir);
        write_optimizer_file(path, m, opt);
        snprintf(path, sizeof(path), "%s/trainer_state.json", tmp_dir);
        write_trainer_state(path, st, opt);
    }
    if (m->cfg.tokenizer_model[0]) copy_tokenizer_files(m->cfg.tokenizer_model, tmp_dir);
    write_checksums(tmp_dir);
    // A directory of the same iteration is replaced only by the complete new one: swapped
    // atomically where the filesystem can, else moved aside just before the rename.
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        remove_tree(tmp_dir);  // now holds the previous directory
    } else {
        snprintf(old_dir, sizeof(old_dir), "%s.old.%d", final_dir, (int)getpid());
        int had_old = rename(final_dir, old_dir) == 0;
        if (rename(tmp_dir, final_dir)) mt_die("--save %s: cannot rename %s: %s", dir, tmp_dir, strerror(errno));
        if (had_old) remove_tree(old_dir);
    }
    fsync_dir_of(final_dir);

    char latest[32], err[512];
    int len = snprintf(latest, sizeof(latest), "%ld\n", st->iteration);
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    if (write_file_atomic(path, latest, len, err, sizeof(err))) mt_die("writing %s: %s", path, err);
    prune_checkpoints(dir, m->cfg.keep_checkpoints, st->iteration);
}

// ---- loading ------------------------------------------------------------------------------

void checkpoint_resolve(char *out, const char *dir) {
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

// The moments, and the F32 master weights when the checkpoint has them: training resumes
// from those, not from the (possibly BF16) model file.
static void load_optimizer(const char *dir, Model *m, Optimizer *opt) {
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
    HfTensorGroup groups[OPT_GROUPS];
    optimizer_groups(m, opt, groups);
    hf_load_tensor_groups(path, m, groups, OPT_GROUPS);
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
    json_free(root);
}

void checkpoint_load(const char *dir, Model *m, Optimizer *opt, TrainerState *st) {
    checkpoint_verify_checksums(dir);
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
