#include "train/memory_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/common.h"
#include "core/device.h"

double memory_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

int memory_processes_on_node(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        int n = v ? atoi(v) : 0;
        if (n > 0) return n;
    }
    return 1;
}

double memory_process_limit_bytes(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_DATA, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
    return (double)limit.rlim_cur;
}

static const double GiB = 1024.0 * 1024 * 1024;

double memory_need_total(const MemoryNeed *need) {
    return need->parameters + need->gradients + need->optimizer + need->activations + need->exchange +
           need->reduction;
}

static void die_short(const MemoryNeed *need, const char *shared, double available, const char *what) {
    mt_die("the run needs about %.2f GiB per process (parameters %.2f, gradients %.2f, AdamW moments %.2f, "
           "expert exchange %.2f, gradient reductions %.2f, activations %.2f for micro-batches of %d x %d tokens)%s but "
           "only %.2f GiB are available (%s); "
           "lower --micro-batch-size or --seq-length, shrink the model, or spread it over more processes with "
           "--use-distributed-optimizer / --expert-model-parallel-size / --context-parallel-size",
           memory_need_total(need) / GiB, need->parameters / GiB, need->gradients / GiB, need->optimizer / GiB,
           need->exchange / GiB, need->reduction / GiB, need->activations / GiB, need->micro_batch_size,
           need->seq_length, shared,
           available / GiB, what);
}

void memory_check_fits(const MemoryNeed *need) {
    int on_gpu = device_active() == DEVICE_CUDA;  // one GPU per process: its free memory
    double per_process = memory_need_total(need), limit = on_gpu ? -1 : memory_process_limit_bytes();
    if (limit >= 0 && per_process > limit) die_short(need, "", limit, "this process's data limit, ulimit -d");
    double available = on_gpu ? device_memory_free_bytes() : memory_available_bytes();
    if (available < 0) return;  // not Linux: nothing to compare with
    int processes = on_gpu ? 1 : memory_processes_on_node();
    if (per_process * processes <= available) return;
    char shared[96] = "";
    if (processes > 1) snprintf(shared, sizeof(shared), " and %d processes share this machine,", processes);
    die_short(need, shared, available, on_gpu ? "free on the GPU" : "MemAvailable");
}

void memory_need_print(const MemoryNeed *need) {
    const double MiB = 1024.0 * 1024;
    char exchange[128] = "";
    if (need->exchange > 0) snprintf(exchange, sizeof(exchange), ", expert exchange %.1f", need->exchange / MiB);
    if (need->reduction > 0)
        snprintf(exchange + strlen(exchange), sizeof(exchange) - strlen(exchange), ", gradient reductions %.1f",
                 need->reduction / MiB);
    printf("memory: per process %.1f MiB (parameters %.1f, gradients %.1f, AdamW moments %.1f%s, activations %.1f "
           "for micro-batches of %d x %d tokens)\n",
           memory_need_total(need) / MiB, need->parameters / MiB, need->gradients / MiB, need->optimizer / MiB,
           exchange, need->activations / MiB, need->micro_batch_size, need->seq_length);
}
