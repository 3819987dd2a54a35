// watchdog.h — a collective that never completes (another rank stopped, hung or lost its
// node) ends the job with a message instead of hanging it (--distributed-timeout-minutes).
//
// The MPI backend brackets every call that waits for other ranks with watchdog_enter /
// watchdog_leave; once started, a thread checks every second how long the current wait has
// lasted and, past the timeout, stops every rank through mt_die (MPI_Abort) with a line
// naming the collective and the group.
#pragma once

// Start the checking thread (once; later calls change the timeout).
void watchdog_start(double timeout_s);
void watchdog_enter(const char *what, const char *group);
void watchdog_leave(void);
