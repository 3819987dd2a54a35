// ops_state.h — the ops of checkpoint staging, generation (KV cache, sampling) and optimizer bookkeeping: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_STATE).
#pragma once
#include "ops/ops.h"
