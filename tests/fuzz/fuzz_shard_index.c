// fuzz_shard_index.c — model.safetensors.index.json, the index of a sharded checkpoint or
// Hugging Face model (hf/hf_weights.c: its "weight_map" read, the shards it names opened and
// checked to hold their tensors), through hf_weights_load of a tiny model.
// Input: the index. The shards are fixed: on the first input the target saves a tiny
// Mixtral model with checkpoint_save into four shards, and every input replaces the index
// of that checkpoint. tests/fuzz/corpus/shard_index/ has the index moetron writes for the
// same model (tests/fuzz/make_seeds.py: TINY, FAMILIES["mixtral"] and SHARDED there are
// the flags below).
// Oracle: a load that returns has filled every weight with its saved value.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "fuzz.h"
#include "hf/hf_weights.h"
#include "model/model.h"
#include "train/checkpoint.h"

static char flags[][32] = {
    "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
    "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr-warmup-iters", "0",
    "--make-vocab-size-divisible-by", "1", "--moe-ffn-hidden-size", "8", "--ffn-hidden-size", "16",
    "--num-experts", "4", "--moe-router-topk", "2", "--max-shard-size", "8KB"};

static Config config;  // large: not on the stack
static Model model;
static real *saved;    // the weights as checkpoint_save wrote them
static char iter_dir[720];

// The tiny model and its checkpoint (outside fuzz_run: a failure here ends the process).
static void setup(void) {
    enum { N_FLAGS = sizeof flags / sizeof flags[0] };
    char *argv[N_FLAGS];
    for (int i = 0; i < N_FLAGS; i++) argv[i] = flags[i];
    config_defaults(&config);
    config_parse_args(&config, CMD_TRAIN, N_FLAGS, argv);
    config_validate(&config);
    model_build(&model, &config);
    model_init_weights(&model, 1);
    char ckpt[700];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", fuzz_dir());
    TrainerState st = {.iteration = 1};
    checkpoint_save(ckpt, &model, NULL, &st);
    snprintf(iter_dir, sizeof iter_dir, "%s/iter_0000001", ckpt);
    saved = malloc(model.tt.total * sizeof(real));
    memcpy(saved, model.tt.params, model.tt.total * sizeof(real));
}

static void load(void *ctx) {
    (void)ctx;
    hf_weights_load(iter_dir, &model);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!saved) {
        setup();
        // the index checkpoint_save wrote must load (else every input would fail for nothing)
        if (fuzz_run(load, NULL) != FUZZ_RETURNED) fuzz_fail("the saved tiny checkpoint does not load: %s", fuzz_error());
    }
    fuzz_write("ckpt/iter_0000001/model.safetensors.index.json", data, size);
    memset(model.tt.params, 0, model.tt.total * sizeof(real));
    if (fuzz_run(load, NULL) == FUZZ_RETURNED && memcmp(model.tt.params, saved, model.tt.total * sizeof(real)))
        fuzz_fail("the index loaded, but the weights are not the ones saved");
    return 0;
}
