// check_state.c — the backend under test's ops of ops_state.h (checkpoint staging, KV cache, sampling, optimizer bookkeeping)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

void check_state_ops(void) {}
