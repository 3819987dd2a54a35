// check_loss.c — the backend under test's ops of ops_loss.h (LM head loss sums and weights, vocab-parallel cross-entropy)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

void check_loss_ops(void) {}
