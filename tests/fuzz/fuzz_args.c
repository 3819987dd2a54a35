// fuzz_args.c — command-line flags (src/core/args.c) as `moetron COMMAND ...` parses them:
// config_defaults, config_parse_args and, without --load, config_validate (as src/main.c).
// Input: the argument words, one per line; a first line naming a command (train, generate,
// forward, data, prepare) selects it, else train. A configuration that validates must
// survive fuzz_check_config_round_trip (the config.json of its checkpoint reads back), and
// the sizes the program derives from it are computed through the program's own functions
// (derived_sizes): an overflow there is a UBSan report or mt_size_product's internal error,
// so a bound config_validate misses is a bug this target finds.
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "data/dataset.h"
#include "fuzz.h"
#include "model/layers.h"
#include "model/model.h"
#include "moe/dispatcher.h"

typedef struct {
    Command cmd;
    int argc;
    char **argv;
    Config c;
    int validated;
} Ctx;

// Models of at most this many tensors are described (model_describe: every shape and the
// flat-buffer layout); larger ones would make the target slow, not find more.
enum { MAX_DESCRIBED_TENSORS = 1 << 12 };

// What a run of c sizes its buffers with: tokens per micro-batch (acts_alloc), expert
// capacity and dispatch rows (router, dispatcher), attention widths (tensor shapes, the
// KV cache), the built-in corpus, `moetron data`'s dump and the parameter table.
static void derived_sizes(const Config *c) {
    static Model m;  // large: not on the stack
    int N = c->micro_batch_size * c->seq_length;
    RouterConfig rc = model_router_config(c);
    if (rc.E > 0) {
        int capacity = dispatch_capacity(N, rc.k, rc.E, rc.capacity_factor);
        if (capacity < 0 || capacity > N) fuzz_fail("capacity %d outside 0..%d tokens", capacity, N);
        (void)dispatch_max_rows(N, rc.k, rc.E, rc.capacity_factor, rc.pad_to_capacity, 1);
    }
    AttentionWidths w = attention_widths(c);
    (void)mt_size_product((int64_t)c->max_positions * w.k, sizeof(real));  // kv_caches_new
    (void)dataset_mock_bytes(c);
    (void)mt_size_product(c->num_samples * ((int64_t)c->seq_length + 1), sizeof(int32_t));  // data_main
    if ((int64_t)c->num_layers * (3 * (int64_t)c->num_experts + 16) > MAX_DESCRIBED_TENSORS) return;
    model_describe(&m, c, NULL);
    model_free(&m);
}

static void body(void *ctx) {
    Ctx *x = ctx;
    config_defaults(&x->c);
    config_parse_args(&x->c, x->cmd, x->argc, x->argv);
    if (x->c.load[0]) return;
    config_validate(&x->c);
    derived_sizes(&x->c);
    x->validated = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Ctx x;
    // the words, NUL-terminated, allocated outside fuzz_run (they are the caller's argv)
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    char **argv = malloc((size + 2) * sizeof(char *));
    int argc = 0;
    for (char *s = text;;) {
        char *nl = memchr(s, '\n', (size_t)(text + size - s));
        argv[argc++] = s;
        if (!nl) break;
        *nl = 0;
        s = nl + 1;
    }
    if (argc == 1 && !argv[0][0]) argc = 0;  // no words at all
    static const struct {
        const char *name;
        Command cmd;
    } commands[] = {{"train", CMD_TRAIN}, {"generate", CMD_GENERATE}, {"forward", CMD_FORWARD},
                    {"data", CMD_DATA},   {"prepare", CMD_PREPARE}};
    x.cmd = CMD_TRAIN;
    int first = 0;
    for (size_t i = 0; argc > 0 && i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[0], commands[i].name)) x.cmd = commands[i].cmd, first = 1;
    x.argc = argc - first;
    x.argv = argv + first;
    x.validated = 0;
    if (fuzz_run(body, &x) == FUZZ_RETURNED && x.validated) fuzz_check_config_round_trip(&x.c);
    free(argv);
    free(text);
    return 0;
}
