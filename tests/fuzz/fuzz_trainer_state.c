// fuzz_trainer_state.c — the small state files of a checkpoint directory:
//   trainer_state.json: through checkpoint_read_trainer_state;
//   latest_checkpointed_iteration.txt: the same bytes, through checkpoint_resolve (public).
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "train/checkpoint.h"

typedef struct {
    const uint8_t *data;
    size_t size;
    char dir[600];
} Ctx;

// trainer_state.json through checkpoint_read_trainer_state
static void trainer_state(void *ctx) {
    Ctx *x = ctx;
    fuzz_write("ckpt/iter_0000010/trainer_state.json", x->data, x->size);
    char iter[700];
    snprintf(iter, sizeof iter, "%s/iter_0000010", x->dir);
    TrainerState st;
    long optimizer_step;
    checkpoint_read_trainer_state(iter, &st, &optimizer_step);
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
