#include "train/run_summary.h"

#include <math.h>
#include <stdio.h>

#include "core/progress.h"

void run_summary_step(RunSummary *s, const StepRecord *r) {
    if (!s->logged++) {
        s->first_step = r->step;
        s->first_loss = r->loss;
    } else {  // the first logged step carries start-up (warm-up, first allocations): left out of the rates
        s->tokens_per_s_sum += r->tokens_per_s;
        s->tflops_sum += r->tflops;
        s->mfu_sum += r->mfu;
        s->rate_steps++;
    }
    s->last_step = r->step;
    s->last_loss = r->loss;
    s->last_lm_loss = r->lm_loss;
    s->mem_peak_mb = fmax(s->mem_peak_mb, r->mem_peak_mb);
    s->moe |= r->router.load_imbalance > 0;
    s->worst_imbalance = fmax(s->worst_imbalance, r->router.load_imbalance);
    s->dropped_frac_sum += r->router.dropped_frac;
    s->skipped += r->skipped;
    s->loss_spikes += r->loss_spike;
}

void run_summary_eval(RunSummary *s, long step, double loss) {
    if (!s->evals++ || loss < s->best_eval_loss) {
        s->best_eval_loss = loss;
        s->best_eval_step = step;
    }
    s->last_eval_loss = loss;
}

void run_summary_saved(RunSummary *s, long step) {
    s->saves++;
    s->last_save_step = step;
}

void run_summary_print(const RunSummary *s, long steps_run, double wall_s, const char *save_dir) {
    char took[32];
    format_duration(took, sizeof(took), wall_s);
    printf("summary: %ld step%s in %s", steps_run, steps_run == 1 ? "" : "s", took);
    if (s->logged)
        printf(" | loss %.4f at step %ld -> %.4f at step %ld (lm %.4f)", s->first_loss, s->first_step, s->last_loss,
               s->last_step, s->last_lm_loss);
    printf("\n");
    if (s->evals)
        printf("  held-out: loss %.4f at the end, best %.4f at step %ld\n", s->last_eval_loss, s->best_eval_loss,
               s->best_eval_step);
    if (s->rate_steps)
        printf("  speed: %.0f tokens/s, %.3f TFLOP/s (MFU %.1f%%), mean of %d logged steps | peak memory %.1f MB\n",
               s->tokens_per_s_sum / s->rate_steps, s->tflops_sum / s->rate_steps, 100 * s->mfu_sum / s->rate_steps,
               s->rate_steps, s->mem_peak_mb);
    if (s->moe && s->logged)
        printf("  experts: worst load imbalance %.2f (max / mean tokens over the logged steps' layer means), "
               "dropped %.2f%% of choices\n", s->worst_imbalance, 100 * s->dropped_frac_sum / s->logged);
    if (s->skipped || s->loss_spikes)
        printf("  trouble: %d skipped step%s, %d loss spike%s\n", s->skipped, s->skipped == 1 ? "" : "s",
               s->loss_spikes, s->loss_spikes == 1 ? "" : "s");
    if (s->saves)
        printf("  checkpoints: %d saved, the last %s/iter_%07ld\n", s->saves, save_dir, s->last_save_step);
    fflush(stdout);
}
