// memory_check.h — before a run allocates its large buffers: do they fit in this machine's
// memory? Stops with the estimate, item by item, instead of failing later inside malloc or
// being killed by the kernel.
#pragma once
#include <stddef.h>

typedef struct {
    double parameters, gradients, optimizer, activations;  // bytes of this process
    double exchange;  // the expert-parallel exchange's buffers at their bound (moe/expert_parallel.h)
    double reduction; // the temporaries of the gradient reductions in flight (the MPI library's)
    int micro_batch_size, seq_length;                      // this rank's micro-batches (T/CP with context parallelism)
} MemoryNeed;

// Bytes of all of need's parts: what one process holds.
double memory_need_total(const MemoryNeed *need);
// MemAvailable of /proc/meminfo in bytes; -1 when unknown.
double memory_available_bytes(void);
// How many processes of this run share the machine (the launcher's local size; 1 without one).
int memory_processes_on_node(void);
// The data-segment limit of this process (RLIMIT_DATA: ulimit -d, prlimit --data, a job
// scheduler's per-process budget) in bytes; -1 when unlimited.
double memory_process_limit_bytes(void);
// Dies with one line when need × processes on this machine exceeds the available memory,
// or need exceeds this process's limit.
void memory_check_fits(const MemoryNeed *need);
// The line a run prints of what one process holds: "memory: per process ... GiB (...)".
void memory_need_print(const MemoryNeed *need);
