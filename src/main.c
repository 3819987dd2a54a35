// main.c — `moetron <command> [flags]`: dispatch only.
#include <stdio.h>
#include <string.h>

#include "cmd/commands.h"
#include "core/common.h"
#include "core/config.h"
#include "core/device.h"
#include "ops/gemm.h"
#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

#define MOETRON_VERSION "0.1.0"

static void usage(FILE *out) {
    fprintf(out,
            "moetron %s — Mixture-of-Experts language-model training in C\n\n"
            "usage: moetron <command> [flags]      (moetron <command> --help for its flags)\n\n"
            "commands:\n"
            "  train      train a model (default: the built-in MoE model on built-in data)\n"
            "  generate   continue a prompt with a trained checkpoint (--load DIR --prompt TEXT)\n"
            "  forward    dump logits, loss, routing and gradients of one batch (--load --input --dump)\n"
            "  data       dump the first training samples in Megatron-Core's order (--data-path --num-samples --dump)\n"
            "  prepare    tokenize .txt/.jsonl into Megatron .bin/.idx (--input --output-prefix --tokenizer-model)\n"
            "  plan       per-rank memory and FLOPs of a training run, without allocating it (train's flags, --world-size)\n"
            "  report     an HTML page of a run's --log-jsonl: losses, throughput, tokens per expert (RUN [--output FILE])\n"
            "  flags      print the flag reference as markdown (docs/flags.md)\n",
            MOETRON_VERSION);
}

static int has_help_flag(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

// -fsanitize=address builds (GCC and clang say so differently); tests shorten their
// slowest multi-process sweeps under them.
#if defined(__SANITIZE_ADDRESS__)
#define BUILT_WITH_SANITIZERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_WITH_SANITIZERS 1
#endif
#endif
#ifndef BUILT_WITH_SANITIZERS
#define BUILT_WITH_SANITIZERS 0
#endif

// --device (when not given: $MOETRON_DEVICE, else auto) and --bf16 / --fp16; on GPUs the
// collectives move their data with NCCL from here on (every process reaches this point
// with the same flags).
static void use_device(const Config *c) {
    const char *from_env = getenv("MOETRON_DEVICE");
    int use_env = !config_flag_given(c, "device") && from_env && from_env[0];
    if (use_env && !device_name_known(from_env))
        mt_die("MOETRON_DEVICE=%s: use %s (or unset it)", from_env, DEVICE_NAMES);
    device_select(device_parse(use_env ? from_env : c->device), config_gemm_inputs(c));
#ifdef MT_COMM_NCCL
    // tensor memory is device memory: MPI's collectives (host sums, host copies) cannot
    // handle it, NCCL must
    if (device_active() == DEVICE_CUDA && !comm_use_nccl(device_local_rank()) && comm_world_size() > 1)
        mt_die("--device cuda with %d processes needs NCCL, and it is off: leave MOETRON_NCCL unset (or set it to 1) "
               "and build the cuda plugin with nccl.h in CUDA_HOME/include, or run with --device cpu",
               comm_world_size());
#endif
}

static int run_command(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moetron %s (gemm: %s, mpi: %s, cuda: %s%s)\n", MOETRON_VERSION, mt_gemm_backend(), comm_backend_name(),
               device_cuda_built() ? "yes" : "no", BUILT_WITH_SANITIZERS ? ", sanitizers" : "");
        return 0;
    }
    if (!strcmp(argv[1], "flags")) {
        config_print_help(CMD_TRAIN, 1);
        return 0;
    }
    Command cmd;
    if (!strcmp(argv[1], "train")) cmd = CMD_TRAIN;
    else if (!strcmp(argv[1], "generate")) cmd = CMD_GENERATE;
    else if (!strcmp(argv[1], "forward")) cmd = CMD_FORWARD;
    else if (!strcmp(argv[1], "data")) cmd = CMD_DATA;
    else if (!strcmp(argv[1], "prepare")) cmd = CMD_PREPARE;
    else if (!strcmp(argv[1], "plan")) cmd = CMD_PLAN;
    else if (!strcmp(argv[1], "report")) cmd = CMD_REPORT;
    else {
        mt_die("unknown command '%s'; use train, generate, forward, data, prepare, plan or report", argv[1]);
    }
    if (has_help_flag(argc - 2, argv + 2)) {
        config_print_help(cmd, 0);
        return 0;
    }
    Config c;
    config_defaults(&c);
    config_parse_args(&c, cmd, argc - 2, argv + 2);
    if (cmd == CMD_TRAIN) checkpoint_load_nothing_yet(&c);
    // With --load the checkpoint fills in the flags not given; validation follows that.
    if (!c.load[0]) config_validate(&c);
    if (cmd == CMD_TRAIN || cmd == CMD_GENERATE || cmd == CMD_FORWARD) use_device(&c);
    if (cmd == CMD_TRAIN) return train_main(&c);
    if (cmd == CMD_GENERATE) return generate_main(&c);
    if (cmd == CMD_DATA) return data_main(&c);
    if (cmd == CMD_PREPARE) return prepare_main(&c);
    if (cmd == CMD_PLAN) return plan_main(&c);
    if (cmd == CMD_REPORT) return report_main(&c);
    return forward_main(&c);
}

int main(int argc, char **argv) {
    comm_world_init(&argc, &argv);
    int status = run_command(argc, argv);
    mt_flush_stdout();  // output lost on a full disk is an error, whatever the command
    comm_world_finalize();
    return status;
}
