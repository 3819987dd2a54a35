#include "cmd/load_model.h"

#include "hf/hf_config.h"
#include "train/checkpoint.h"

void load_model_for_inference(Model *m, Config *c) {
    if (!c->load[0]) mt_die("--load is required: the checkpoint directory to use");
    char resolved[MT_PATH_MAX + 32];
    checkpoint_resolve(resolved, c->load);
    config_from_checkpoint(c, resolved);
    model_build(m, c);
    checkpoint_load(resolved, m, NULL, NULL);
}
