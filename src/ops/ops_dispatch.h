// ops_dispatch.h — the ops of the dispatch plan, expert row grouping and EP exchange layouts: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_DISPATCH).
#pragma once
#include "ops/ops.h"
