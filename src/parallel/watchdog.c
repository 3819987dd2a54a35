#include "parallel/watchdog.h"

#include <pthread.h>
#include <unistd.h>

#include "core/common.h"
#include "core/timer.h"

static double g_timeout_s;
static int g_started;
// The wait in progress: its start (0 when none), what it is and on which group. Written
// by the main thread, read by the checking thread.
static double g_since;
static const char *g_what, *g_group;
static int g_io_depth;  // open watchdog_io_begin brackets: no wait counts while > 0

static void *check_loop(void *unused) {
    (void)unused;
    for (;;) {
        sleep(1);
        // the I/O depth first: once it reads 0, the clock watchdog_io_end restarted is seen
        if (__atomic_load_n(&g_io_depth, __ATOMIC_ACQUIRE) > 0) continue;
        double since;
        __atomic_load(&g_since, &since, __ATOMIC_ACQUIRE);
        if (since <= 0 || now_seconds() - since <= g_timeout_s) continue;
        mt_die_from_thread("%s on process group %s has waited %.0f s, more than --distributed-timeout-minutes %g: another rank "
               "is stuck or gone (see its output above); ending every rank",
               __atomic_load_n(&g_what, __ATOMIC_ACQUIRE), __atomic_load_n(&g_group, __ATOMIC_ACQUIRE),
               now_seconds() - since, g_timeout_s / 60);
    }
    return NULL;
}

void watchdog_start(double timeout_s) {
    g_timeout_s = timeout_s;
    if (g_started) return;
    pthread_t thread;
    if (pthread_create(&thread, NULL, check_loop, NULL)) mt_die("cannot start the collective watchdog thread");
    pthread_detach(thread);
    g_started = 1;
}

void watchdog_enter(const char *what, const char *group) {
    if (!g_started) return;
    __atomic_store_n(&g_what, what, __ATOMIC_RELEASE);
    __atomic_store_n(&g_group, group, __ATOMIC_RELEASE);
    double now = now_seconds();
    __atomic_store(&g_since, &now, __ATOMIC_RELEASE);
}

void watchdog_leave(void) {
    if (!g_started) return;
    double zero = 0;
    __atomic_store(&g_since, &zero, __ATOMIC_RELEASE);
}

void watchdog_io_begin(void) { __atomic_add_fetch(&g_io_depth, 1, __ATOMIC_ACQ_REL); }

void watchdog_io_end(void) {
    double since;
    __atomic_load(&g_since, &since, __ATOMIC_ACQUIRE);
    if (since > 0) {  // a wait in progress: count it from now
        double now = now_seconds();
        __atomic_store(&g_since, &now, __ATOMIC_RELEASE);
    }
    __atomic_sub_fetch(&g_io_depth, 1, __ATOMIC_ACQ_REL);
}
