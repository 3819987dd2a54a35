#include "core/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/timer.h"

enum { PROGRESS_QUIET_S = 3, PROGRESS_REDRAW_HZ = 5, QUARTERS = 4 };
typedef enum { SHOW_BY_POLICY, SHOW_ALWAYS, SHOW_NEVER } ProgressOverride;

static ProgressOverride progress_override(void) {
    const char *v = getenv("MOETRON_PROGRESS");
    if (!v || !*v) return SHOW_BY_POLICY;
    if (!strcmp(v, "always")) return SHOW_ALWAYS;
    if (!strcmp(v, "never")) return SHOW_NEVER;
    mt_die("MOETRON_PROGRESS=%s: use always or never (or leave it unset)", v);
}

void format_duration(char *out, size_t cap, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, cap, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
    else snprintf(out, cap, "%lds", s);
}

void progress_begin(Progress *p, const char *what, const char *unit, double scale, double total,
                    ProgressPolicy policy) {
    *p = (Progress){.what = what, .unit = unit, .total = total, .scale = scale, .start_s = now_seconds(),
                    .tty = isatty(1), .policy = policy};
}

// Whether the operation may report at all by now.
static int may_show(const Progress *p, double now) {
    switch (progress_override()) {
    case SHOW_ALWAYS: return 1;
    case SHOW_NEVER: return 0;
    default: return p->policy == PROGRESS_ALWAYS || now - p->start_s >= PROGRESS_QUIET_S;
    }
}

static void draw(Progress *p, double now, int final) {
    double elapsed = now - p->start_s, shown = p->done / p->scale, rate = elapsed > 0 ? shown / elapsed : 0;
    double left = rate > 0 ? (p->total - p->done) / p->scale / rate : 0;
    char eta[32];
    format_duration(eta, sizeof eta, final ? elapsed : left);
    int percent = p->total > 0 ? (int)(100 * p->done / p->total) : 100;
    int decimals = p->scale > 1;  // whole units (batches) without a fraction
    fprintf(stdout, "%s%-12s %8.*f / %.*f %s %3d%% | %6.1f %s/s | %s %s%s%s", p->tty ? "\r" : "", p->what, decimals,
            shown, decimals, p->total / p->scale, p->unit, percent, rate, p->unit, final ? "took" : "ETA", eta,
            p->tty ? "\033[K" : "", p->tty && !final ? "" : "\n");
    fflush(stdout);
    p->drawn_s = now;
    p->shown = 1;
}

void progress_update(Progress *p, double done) {
    double now = now_seconds();
    p->done = done;
    int quarter = p->total > 0 ? (int)(QUARTERS * done / p->total) : QUARTERS;
    int due = p->tty ? now - p->drawn_s >= 1.0 / PROGRESS_REDRAW_HZ : quarter > p->quarters && quarter < QUARTERS;
    p->quarters = quarter > p->quarters ? quarter : p->quarters;
    if (due && may_show(p, now)) draw(p, now, 0);
}

void progress_end(Progress *p) {
    ProgressOverride o = progress_override();
    int show = o == SHOW_ALWAYS || (o == SHOW_BY_POLICY && (p->shown || p->policy == PROGRESS_ALWAYS));
    if (show) draw(p, now_seconds(), 1);
}
