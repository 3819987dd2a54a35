// memory_check.h — before a run allocates its large buffers: do they fit in this machine's
// memory? Stops with the estimate, item by item, instead of failing later inside malloc or
// being killed by the kernel.
#pragma once
#include <stddef.h>

typedef struct {
    double parameters, gradients, optimizer, activations;  // bytes of this process
    int micro_batch_size, seq_length;                      // for the message
} MemoryNeed;

// MemAvailable of /proc/meminfo in bytes; -1 when unknown.
double memory_available_bytes(void);
// How many processes of this run share the machine (the launcher's local size; 1 without one).
int memory_processes_on_node(void);
// Dies with one line when need × processes on this machine exceeds the available memory.
void memory_check_fits(const MemoryNeed *need);
