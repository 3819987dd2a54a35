// comm.h — collectives over a named process group. The single-process build uses
// groups of size 1 through these same calls, so the one-process path is the parallel
// path with trivial groups (an MPI implementation plugs in behind this header).
#pragma once
#include "core/common.h"

typedef struct {
    const char *name;  // "dp", "ep", "tp", ... for messages
    int rank, size;
} Comm;

// The trivial group of this process alone.
Comm comm_self(const char *name);
// Sum x (n) over the group in rank order (deterministic); result on every rank.
void comm_allreduce_sum(const Comm *g, real *x, size_t n);
void comm_allreduce_sum_double(const Comm *g, double *x, size_t n);
