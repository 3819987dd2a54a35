// ops_router.h — the ops of router capacity, counts, balancing statistics/losses and backward: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_ROUTER).
#pragma once
#include "ops/ops.h"
