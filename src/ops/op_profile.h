// op_profile.h — the per-op part of `train --profile`: calls and wall time of every op of
// the op list (src/ops/op_list.h), on whichever backend runs them.
//
// The dispatch wrappers (dispatch.c) bracket each op with op_profile_start/stop. On the
// cpu an op's time is the wall clock around it; on a backend with a queue timer (cuda:
// events on its stream) it is the time between two marks queued around the op's kernels,
// resolved in batches (when the marks run out, and before printing). Recorded like the
// kinds of src/core/profile.h: only while profiling is on, on the main thread outside
// OpenMP parallel regions; an op called inside another op counts in both.
#pragma once
#include "ops/op_list.h"

// Where an op's timing started: a wall-clock time or a queue mark (mark −1: not recorded).
typedef struct {
    double seconds;
    int mark;
} OpStamp;

OpStamp op_profile_start(void);
void op_profile_stop(OpId op, OpStamp started);
void op_profile_reset(void);
// One line per op that ran since the last reset, most time first: calls, seconds, share
// of total_s (the profiled steps' wall time) and mean microseconds per call.
void op_profile_print(double total_s);
