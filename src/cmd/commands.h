// commands.h — the entry points of `moetron <command>`.
#pragma once
#include "core/config.h"

int generate_main(Config *c);
int forward_main(Config *c);
// `moetron data`: build the Megatron sample order and dump the first --num-samples samples.
int data_main(Config *c);
// `moetron prepare`: tokenize text / jsonl into Megatron .bin/.idx (training a BPE if asked).
int prepare_main(Config *c);
// `moetron plan`: what each rank of a training run would hold and compute, without allocating it.
int plan_main(Config *c);
// `moetron report RUN`: the HTML page of a run's --log-jsonl (docs/metrics.md, "moetron report").
int report_main(Config *c);
