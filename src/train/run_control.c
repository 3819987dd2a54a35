#include "train/run_control.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/timer.h"

static volatile sig_atomic_t g_signal;  // the first SIGTERM / SIGINT received, or 0

static void on_signal(int sig) {
    if (!g_signal) g_signal = sig;
}

void run_control_init(RunControl *rc, const Config *c, double start_s) {
    memset(rc, 0, sizeof(*rc));
    rc->cfg = c;
    rc->start_s = start_s;
    g_signal = 0;
    if (!c->exit_signal_handler) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int run_control_skip_step(RunControl *rc, long step, double loss, double grad_norm) {
    if (isfinite(loss) && isfinite(grad_norm)) {
        rc->skipped_in_a_row = 0;
        rc->save_held_noted = 0;
        return 0;
    }
    const Config *c = rc->cfg;
    if (!c->check_for_nan_in_loss_and_grad)
        mt_die("step %ld: loss %g, gradient norm %g are not finite; lower --lr or raise --lr-warmup-iters (the last "
               "checkpoint is intact)", step, loss, grad_norm);
    if (++rc->skipped_in_a_row >= c->nan_skip_limit)
        mt_die("step %ld: loss %g, gradient norm %g: %d steps in a row were not finite (--nan-skip-limit %d); lower "
               "--lr or raise --lr-warmup-iters (the last checkpoint is intact)", step, loss, grad_norm,
               rc->skipped_in_a_row, c->nan_skip_limit);
    printf("step %ld: loss %g, gradient norm %g are not finite: update skipped (%d in a row of --nan-skip-limit %d)\n",
           step, loss, grad_norm, rc->skipped_in_a_row, c->nan_skip_limit);
    fflush(stdout);
    return 1;
}

int run_control_may_save(RunControl *rc, long step) {
    if (rc->skipped_in_a_row == 0) return 1;
    if (!rc->save_held_noted) {
        printf("note: step %ld: no checkpoint while steps are skipped as not finite (%d in a row): the save waits for "
               "the next finite step and the checkpoints already written are kept\n", step, rc->skipped_in_a_row);
        fflush(stdout);
        rc->save_held_noted = 1;
    }
    return 0;
}

int run_control_loss_spike(RunControl *rc, long step, double loss) {
    double mean = 0;
    for (int i = 0; i < rc->n_recent; i++) mean += rc->recent[i];
    mean = rc->n_recent ? mean / rc->n_recent : 0;
    int spike = rc->cfg->loss_spike_factor > 0 && rc->n_recent == LOSS_WINDOW && loss > rc->cfg->loss_spike_factor * mean;
    if (spike) {
        printf("note: step %ld: loss %.4f is %.1fx the mean %.4f of the previous %d steps (loss spike)\n", step, loss,
               loss / mean, mean, LOSS_WINDOW);
        fflush(stdout);
    }
    rc->recent[rc->next_recent] = loss;
    rc->next_recent = (rc->next_recent + 1) % LOSS_WINDOW;
    if (rc->n_recent < LOSS_WINDOW) rc->n_recent++;
    return spike;
}

// Reasons in a fixed order; the all-reduce keeps the one every rank sees first.
enum { STOP_NONE, STOP_SIGTERM, STOP_SIGINT, STOP_DURATION, STOP_INTERVAL };

const char *run_control_stop_reason(RunControl *rc, long step, const Comm *world) {
    const Config *c = rc->cfg;
    int64_t stop[4] = {g_signal == SIGTERM, g_signal == SIGINT,
                       c->exit_duration_in_mins > 0 && now_seconds() - rc->start_s >= 60.0 * c->exit_duration_in_mins,
                       c->exit_interval > 0 && step % c->exit_interval == 0};
    comm_allreduce_sum_int64(world, stop, 4);  // a signal on any rank stops them all
    static char reason[64];
    if (stop[STOP_SIGTERM - 1]) return "received SIGTERM (--exit-signal-handler)";
    if (stop[STOP_SIGINT - 1]) return "received SIGINT (--exit-signal-handler)";
    if (stop[STOP_DURATION - 1]) {
        snprintf(reason, sizeof(reason), "ran for --exit-duration-in-mins %g", c->exit_duration_in_mins);
        return reason;
    }
    if (stop[STOP_INTERVAL - 1]) {
        snprintf(reason, sizeof(reason), "--exit-interval %d", c->exit_interval);
        return reason;
    }
    return NULL;
}
