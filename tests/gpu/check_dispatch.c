// check_dispatch.c — the backend under test's ops of ops_dispatch.h (dispatch plan, expert row grouping, EP exchange layouts)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

void check_dispatch_ops(void) {}
