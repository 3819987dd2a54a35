// commands.h — the entry points of `moetron <command>`.
#pragma once
#include "core/config.h"

int generate_main(Config *c);
int forward_main(Config *c);
