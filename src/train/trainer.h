// trainer.h — `moetron train`: the training loop.
#pragma once
#include "core/config.h"

int train_main(Config *c);
