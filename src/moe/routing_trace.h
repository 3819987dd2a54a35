// routing_trace.h — --moe-routing-trace-path and --moe-enable-routing-replay: every
// training forward's top-k picks of every MoE layer written to one JSONL file per rank,
// or read back from such files and used instead of the router's own choice (as
// Megatron-Core's router replay: the probs are then the router's scores of the replayed
// experts). docs/moe.md, "Routing trace and replay", has the format.
#pragma once
#include <stdint.h>

#include "core/config.h"

typedef struct RoutingTrace RoutingTrace;

// The run's trace: NULL without --moe-routing-trace-path. Recording checks that this rank's
// file does not exist (nothing is overwritten) and makes it, with its directory, at the first
// record; replay reads this rank's file whole (in memory, indexed by sample and layer) and
// checks that it was written by the same layout. c must outlive the trace; experts and topk:
// the model's routed experts and k. Fatal with one line naming the file on any problem.
RoutingTrace *routing_trace_open(const Config *c, int experts, int topk);
void routing_trace_close(RoutingTrace *t);  // NULL is fine

// Replay: whether picks are read rather than written.
int routing_trace_replays(const RoutingTrace *t);

// Record the picks (host memory, N x k expert indices) of one MoE layer in the training
// micro-batch that starts at global sample `first_sample` of step `iteration`.
void routing_trace_write(RoutingTrace *t, long iteration, int64_t first_sample, int layer, const int32_t *picks, int N);

// The recorded picks (host memory, N x k) of that layer in that micro-batch; fatal when the
// file has no such record or it holds another number of tokens.
const int32_t *routing_trace_replay(const RoutingTrace *t, int64_t first_sample, int layer, int N);
