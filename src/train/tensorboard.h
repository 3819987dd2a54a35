// tensorboard.h — a TensorBoard event file of scalars (--tensorboard-dir), written by
// moetron itself (core/tb_event.h has the format). One file per run: a resumed run adds a
// new file to the directory and never rewrites an old one. Scalars are gathered per logged
// step and appended in one write by tb_flush, so a reader sees each step as it is logged.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

typedef struct {
    int fd;                 // the event file, open for appending; -1 when none
    char path[2 * MT_PATH_MAX];
    uint8_t *pending;       // framed records not yet written
    size_t pending_len, pending_cap;
} TbWriter;

// Refuses (one error line) a --tensorboard-dir that exists and is not a directory; a missing
// one is fine (tb_open creates it). Cheap: every process checks before any work.
void tb_check_dir(const char *dir);
// Creates dir (and its parents) and a new event file in it, named
// events.out.tfevents.<unix time>.<hostname>[.<n>] so that the files of later runs sort after
// those of earlier ones (TensorBoard reads a directory's files in name order), and writes
// its first event.
void tb_open(TbWriter *w, const char *dir);
// Queues one scalar; nothing is written before tb_flush. No-op when w is not open.
void tb_scalar(TbWriter *w, const char *tag, double value, int64_t step);
// Appends the queued scalars in one write. A failure (a full disk) stops the run with one
// error line; the file keeps the whole steps before.
void tb_flush(TbWriter *w);
void tb_close(TbWriter *w);
