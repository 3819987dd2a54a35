// fuzz_args.c — command-line flags (src/core/args.c) as `moetron COMMAND ...` parses them:
// config_defaults, config_parse_args and, without --load, config_validate (as src/main.c).
// Input: the argument words, one per line; a first line naming a command (train, generate,
// forward, data, prepare) selects it, else train. A configuration that validates must
// survive fuzz_check_config_round_trip (the config.json of its checkpoint reads back).
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "fuzz.h"

typedef struct {
    Command cmd;
    int argc;
    char **argv;
    Config c;
    int validated;
} Ctx;

static void body(void *ctx) {
    Ctx *x = ctx;
    config_defaults(&x->c);
    config_parse_args(&x->c, x->cmd, x->argc, x->argv);
    if (x->c.load[0]) return;
    config_validate(&x->c);
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
