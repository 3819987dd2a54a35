// run_control.h — when a training run skips a step or stops early.
//
//   non-finite steps  with --check-for-nan-in-loss-and-grad (the default) a step whose loss
//                     or gradient norm is NaN or Inf is skipped: no optimizer step, no
//                     expert-bias update, a console line and "skipped": true in the
//                     metrics; --nan-skip-limit of them in a row stop the run with an
//                     error (the last checkpoint is intact). Without it the first stops.
//                     No checkpoint is written while such a streak lasts (a scheduled save
//                     waits for the next finite step; an early stop or the end of the run
//                     does not save).
//   loss spikes       a loss above --loss-spike-factor × the mean of the previous 20 is
//                     reported (console note, "loss_spike": true in the metrics).
//   early stops       --exit-interval, --exit-duration-in-mins and, with
//                     --exit-signal-handler, SIGTERM / SIGINT: the step in progress finishes,
//                     the run saves (with --save) and exits 0 with a message.
// Every rank decides the same: losses and norms are already global, and the stop decision
// is all-reduced over the world each step.
#pragma once
#include "core/config.h"
#include "parallel/comm.h"

enum { LOSS_WINDOW = 20 };

typedef struct {
    const Config *cfg;
    double start_s;              // when the run started (for --exit-duration-in-mins)
    int skipped_in_a_row;
    int save_held_noted;         // the console was told that this streak holds checkpoints back
    double recent[LOSS_WINDOW];  // the last finite losses, as a ring
    int n_recent, next_recent;
} RunControl;

// Installs the SIGTERM / SIGINT handlers with --exit-signal-handler.
void run_control_init(RunControl *rc, const Config *c, double start_s);
// 1 when the step must be skipped (non-finite loss or gradient norm); dies when that is not
// allowed or after --nan-skip-limit in a row.
int run_control_skip_step(RunControl *rc, long step, double loss, double grad_norm);
// 1 when a checkpoint may be written after this step: not while the latest steps were skipped
// (the weights that led to them are suspect, and pruning must not remove the last good
// checkpoint for them); the console is told once per streak.
int run_control_may_save(RunControl *rc, long step);
// 1 when the loss of a finite step is a spike against the recent mean (reported on the console).
int run_control_loss_spike(RunControl *rc, long step, double loss);
// After a step: why the run stops now ("--exit-interval 5", "SIGTERM", ...) or NULL.
// Collective over world: every rank gets the same answer.
const char *run_control_stop_reason(RunControl *rc, long step, const Comm *world);
