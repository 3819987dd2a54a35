// prepare.c — placeholder while the command is being written (replaced in this change).
#include "cmd/commands.h"
#include "core/common.h"

int prepare_main(Config *c) {
    (void)c;
    mt_die("moetron prepare is being implemented");
}
