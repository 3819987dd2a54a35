#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static void remove_tree(const char *dir) {
    // Only ever called on a checkpoint directory moetron wrote: a flat set of files.
    static const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    char path[CKPT_PATH_MAX + 96];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void write_json_file(const char *path, JsonWriter *w) {
    char err[512];
    if (write_file_atomic(path, jw_text(w), jw_len(w), err, sizeof(err))) mt_die("writing %s: %s", path, err);
    jw_free(w);
}

static void write_model_file(const char *path, const Model *m) {
    StWriter w;
    stw_init(&w);
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        stw_add_real(&w, d->name, d->ndim, d->shape, tt_param(&m->tt, i));
    }
    char err[512];
    if (stw_finish(&w, path, err, sizeof(err))) mt_die("writing %s: %s", path, err);
}

static void write_optimizer_file(const char *path, const Model *m, const Optimizer *opt) {
    StWriter w;
    stw_init(&w);
    char name[MT_NAME_MAX + 16];
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        snprintf(name, sizeof(name), "exp_avg.%s", d->name);
        stw_add_real(&w, name, d->ndim, d->shape, opt->exp_avg + d->offset);
        snprintf(name, sizeof(name), "exp_avg_sq.%s", d->name);
        stw_add_real(&w, name, d->ndim, d->shape, opt->exp_avg_sq + d->offset);
    }
    char err[512];
    if (stw_finish(&w, path, err, sizeof(err))) mt_die("writing %s: %s", path, err);
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

void checkpoint_save(const char *dir, const Model *m, const Optimizer *opt, const TrainerState *st) {
    char final_dir[CKPT_PATH_MAX], tmp_dir[CKPT_PATH_MAX + 32], old_dir[CKPT_PATH_MAX + 32];
    char path[CKPT_PATH_MAX + 64];
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
    snprintf(path, sizeof(path), "%s/model.safetensors", tmp_dir);
    write_model_file(path, m);
    if (opt) {
        snprintf(path, sizeof(path), "%s/optimizer.safetensors", tmp_dir);
        write_optimizer_file(path, m, opt);
        snprintf(path, sizeof(path), "%s/trainer_state.json", tmp_dir);
        write_trainer_state(path, st, opt);
    }
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
}

// ---- loading ------------------------------------------------------------------------------

static int file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

void checkpoint_resolve(char *out, const char *dir) {
    char path[CKPT_PATH_MAX + 64], err[512];
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    if (file_exists(path)) {
        size_t len;
        char *text = (char *)read_file_all(path, &len, err, sizeof(err));
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

static void open_safetensors(StFile *f, const char *path) {
    char err[512];
    if (st_open(f, path, err, sizeof(err))) mt_die("%s: %s", path, err);
}

// Read tensor `name` of the given global shape into out.
static void read_tensor(const StFile *f, const char *path, const char *name, const TensorDesc *d, real *out) {
    const StTensor *t = st_find(f, name);
    if (!t) mt_die("%s: tensor %s is missing; the checkpoint does not match its config.json", path, name);
    int same = t->ndim == d->ndim;
    for (int i = 0; same && i < d->ndim; i++) same = t->shape[i] == d->shape[i];
    if (!same) {
        char want[64] = "", got[64] = "";
        for (int i = 0; i < d->ndim; i++) snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", i ? "," : "", (long long)d->shape[i]);
        for (int i = 0; i < t->ndim; i++) snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", i ? "," : "", (long long)t->shape[i]);
        mt_die("%s: tensor %s has shape [%s] but the model needs [%s]", path, name, got, want);
    }
    if (st_read_real(f, t, out)) mt_die("%s: tensor %s has dtype %s; expected a floating-point dtype", path, name, st_dtype_name(t->dtype));
}

// Every tensor of the file must be one of the model's, named with one of the prefixes.
static void reject_unexpected_tensors(const StFile *f, const char *path, const Model *m, const char *const *prefixes,
                                      int n_prefixes) {
    for (int i = 0; i < f->n_tensors; i++) {
        const char *tn = f->tensors[i].name;
        int known = 0;
        for (int p = 0; p < n_prefixes && !known; p++) {
            size_t plen = strlen(prefixes[p]);
            known = strncmp(tn, prefixes[p], plen) == 0 && tt_find(&m->tt, tn + plen) >= 0;
        }
        if (!known)
            mt_die("%s: unexpected tensor %s; the checkpoint does not match its config.json", path, f->tensors[i].name);
    }
}

static void load_optimizer(const char *dir, const Model *m, Optimizer *opt) {
    char path[CKPT_PATH_MAX + 64], name[MT_NAME_MAX + 16];
    snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
    StFile f;
    open_safetensors(&f, path);
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        snprintf(name, sizeof(name), "exp_avg.%s", d->name);
        read_tensor(&f, path, name, d, opt->exp_avg + d->offset);
        snprintf(name, sizeof(name), "exp_avg_sq.%s", d->name);
        read_tensor(&f, path, name, d, opt->exp_avg_sq + d->offset);
    }
    static const char *const moment_prefixes[] = {"exp_avg.", "exp_avg_sq."};
    reject_unexpected_tensors(&f, path, m, moment_prefixes, 2);
    st_close(&f);
}

static void load_trainer_state(const char *dir, TrainerState *st, Optimizer *opt) {
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
    opt->step = (long)step;
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
    load_trainer_state(dir, st, opt);
}
