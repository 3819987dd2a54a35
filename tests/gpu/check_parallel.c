// check_parallel.c — the backend under test's ops of ops_parallel.h (tensor/context-parallel gathers, slices, partial sums)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

void check_parallel_ops(void) {}
