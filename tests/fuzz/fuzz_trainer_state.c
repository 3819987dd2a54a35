// fuzz_trainer_state.c — the small state files of a checkpoint directory:
//   trainer_state.json: read as src/train/checkpoint.c's load_trainer_state does (a static
//     function there: the same json_parse_file and field extraction, copied below);
//   latest_checkpointed_iteration.txt: the same bytes, through checkpoint_resolve (public).
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json.h"
#include "fuzz.h"
#include "train/checkpoint.h"

typedef struct {
    const uint8_t *data;
    size_t size;
    char dir[600];
} Ctx;

// load_trainer_state of src/train/checkpoint.c, on a file of these bytes
static void trainer_state(void *ctx) {
    Ctx *x = ctx;
    const char *path = fuzz_write("ckpt/iter_0000010/trainer_state.json", x->data, x->size);
    char err[512];
    JsonValue *root = json_parse_file(path, err, sizeof(err));
    if (!root) mt_die("%s: %s", path, err);
    int64_t iteration, consumed, step;
    if (!json_get_int64(root, "iteration", &iteration) || !json_get_int64(root, "consumed_train_samples", &consumed) ||
        !json_get_int64(root, "optimizer_step", &step) || iteration < 0 || consumed < 0 || step < 0)
        mt_die("%s: needs non-negative integers iteration, consumed_train_samples and optimizer_step", path);
    TrainerState st;
    st.iteration = (long)iteration;
    st.consumed_train_samples = consumed;
    (void)st;
    json_free(root);
}

static void latest_iteration(void *ctx) {
    Ctx *x = ctx;
    fuzz_write("ckpt/latest_checkpointed_iteration.txt", x->data, x->size);
    char out[MT_PATH_MAX + 32];
    checkpoint_resolve(out, x->dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Ctx x;
    x.data = data;
    x.size = size;
    if (!x.dir[0]) {  // a checkpoint of iteration 10, so that "10" resolves
        snprintf(x.dir, sizeof x.dir, "%s/ckpt", fuzz_dir());
        mkdir(x.dir, 0755);
        char iter[700];
        snprintf(iter, sizeof iter, "%s/iter_0000010", x.dir);
        mkdir(iter, 0755);
        fuzz_write("ckpt/iter_0000010/config.json", "{}", 2);
    }
    fuzz_run(trainer_state, &x);
    fuzz_run(latest_iteration, &x);
    return 0;
}
