// op_profile.h — the per-op part of `train --profile`: calls and wall time of every op of
// the op list (src/ops/op_list.h), on whichever backend runs them.
//
// The dispatch wrappers (dispatch.c) bracket each op with op_profile_start/stop; an op
// is timed until its results are complete (the backend's finish step included), so the
// GPU's times are those of its kernels as the host sees them. Recorded like the kinds of
// src/core/profile.h: only while profiling is on, on the main thread outside OpenMP
// parallel regions; an op called inside another op counts in both.
#pragma once
#include "ops/op_list.h"

// A start time, or a negative value when this call is not recorded.
double op_profile_start(void);
void op_profile_stop(OpId op, double started);
void op_profile_reset(void);
// One line per op that ran since the last reset, most time first: calls, seconds, share
// of total_s (the profiled steps' wall time) and mean microseconds per call.
void op_profile_print(double total_s);
