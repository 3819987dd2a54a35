// data.c — placeholder while the command is being written (replaced in this change).
#include "cmd/commands.h"
#include "core/common.h"

int data_main(Config *c) {
    (void)c;
    mt_die("moetron data is being implemented");
}
