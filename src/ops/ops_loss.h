// ops_loss.h — the ops of the LM head loss reductions and vocab-parallel cross-entropy: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_LOSS).
#pragma once
#include "ops/ops.h"
