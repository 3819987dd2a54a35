// ops_parallel.h — the ops of tensor- and context-parallel gathers, slices and partial sums: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_PARALLEL).
#pragma once
#include "ops/ops.h"
