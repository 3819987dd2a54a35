// fuzz_hf_config.c — a checkpoint's or Hugging Face model's config.json, read as `--load DIR`
// reads it: config_from_checkpoint (src/hf/hf_config.c) with the plain-HF path
// (src/hf/hf_config_read.c), the "moetron" flags section (config_set_flag) and
// config_validate. A config that reads cleanly must survive fuzz_check_config_round_trip
// (written back as a checkpoint saves it, read again).
#include <stdio.h>
#include <sys/stat.h>

#include "core/config.h"
#include "fuzz.h"
#include "hf/hf_config.h"

typedef struct {
    const uint8_t *data;
    size_t size;
    Config c;
    char dir[600];
} Ctx;

static void read_input(void *ctx) {
    Ctx *x = ctx;
    fuzz_write("in/config.json", x->data, x->size);
    config_defaults(&x->c);
    config_from_checkpoint(&x->c, x->dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Ctx x;  // Config is large: not on the stack
    x.data = data;
    x.size = size;
    snprintf(x.dir, sizeof x.dir, "%s/in", fuzz_dir());
    mkdir(x.dir, 0755);
    if (fuzz_run(read_input, &x) != FUZZ_RETURNED) return 0;
    fuzz_check_config_round_trip(&x.c);
    return 0;
}
