// watchdog.h — a collective that never completes (another rank stopped, hung or lost its
// node) ends the job with a message instead of hanging it (--distributed-timeout-minutes).
//
// The MPI backend brackets every call that waits for other ranks with watchdog_enter /
// watchdog_leave; once started, a thread checks every second how long the current wait has
// lasted and, past the timeout, stops every rank through mt_die (MPI_Abort) with a line
// naming the collective and the group.
//
// Waits while the job does I/O it knows about do not count: every rank brackets such a
// phase (saving or loading a checkpoint, where the other ranks wait while rank 0 writes)
// with watchdog_io_begin / watchdog_io_end, and the phase ends with a collective inside the
// bracket, so no rank leaves it while another is still writing.
#pragma once

// Start the checking thread (once; later calls change the timeout).
void watchdog_start(double timeout_s);
void watchdog_enter(const char *what, const char *group);
void watchdog_leave(void);

// While inside (brackets nest), no wait times out; leaving the outermost restarts the clock
// of a wait still in progress, so only waiting after the I/O counts.
void watchdog_io_begin(void);
void watchdog_io_end(void);
