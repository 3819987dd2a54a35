// check_router.c — the backend under test's ops of ops_router.h (router capacity, counts, balancing statistics and losses, router backward)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

void check_router_ops(void) {}
