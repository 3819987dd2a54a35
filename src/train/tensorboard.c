// tensorboard.c — the event file of a run: its name, its directory, queued scalars, writes.
#include "train/tensorboard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/tb_event.h"
#include "core/timer.h"

#define EVENT_FILE_PREFIX "events.out.tfevents."
enum { HOSTNAME_MAX = 256, SEQUENCE_DIGITS = 4 };

void tb_check_dir(const char *dir) {
    struct stat s;
    if (!dir[0]) return;
    if (stat(dir, &s) != 0) {
        if (errno != ENOENT)  // e.g. a path under a regular file
            mt_die("--tensorboard-dir %s: cannot use it: %s; name a directory (it is created when missing)", dir,
                   strerror(errno));
        return;
    }
    if (!S_ISDIR(s.st_mode))
        mt_die("--tensorboard-dir %s exists and is not a directory: name a directory (it is created when missing)",
               dir);
}

// The sequence number a file named `name` takes after `base` ("<base>" is 0,
// "<base>.0003" is 3); -1 when name is not base or base followed by one.
static long sequence_after_base(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0) return -1;
    if (!name[n]) return 0;
    char *end;
    long k = name[n] == '.' ? strtol(name + n + 1, &end, 10) : -1;
    return k > 0 && !*end ? k : -1;
}

// The file name for a new event file: base = events.out.tfevents.<time>.<host>, or when a
// file of that base exists already (a run resumed within the same second), base.<n> with n
// one past the highest, zero-padded so that names sort in the order they were made.
static void new_file_name(char *out, size_t cap, const char *dir) {
    char host[HOSTNAME_MAX] = "localhost";
    if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    char base[HOSTNAME_MAX + 64];
    snprintf(base, sizeof(base), EVENT_FILE_PREFIX "%010lld.%s", (long long)unix_seconds(), host);
    long highest = -1;
    DIR *d = opendir(dir);
    if (!d) mt_die("--tensorboard-dir %s: cannot list it: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        long k = sequence_after_base(e->d_name, base);
        if (k > highest) highest = k;
    }
    closedir(d);
    if (highest < 0) snprintf(out, cap, "%s/%s", dir, base);
    else snprintf(out, cap, "%s/%s.%0*ld", dir, base, SEQUENCE_DIGITS, highest + 1);
}

// Frames one encoded event onto the queue.
static void queue_event(TbWriter *w, const uint8_t *event, size_t len) {
    if (w->pending_len + len + TFRECORD_OVERHEAD > w->pending_cap) {
        w->pending_cap = 2 * (w->pending_len + len + TFRECORD_OVERHEAD);
        w->pending = mt_realloc(w->pending, w->pending_cap);
    }
    w->pending_len += tfrecord_frame(w->pending + w->pending_len, event, len);
}

void tb_open(TbWriter *w, const char *dir) {
    memset(w, 0, sizeof(*w));
    w->fd = -1;
    tb_check_dir(dir);
    if (make_directories(dir) != 0) mt_die("--tensorboard-dir %s: cannot create it: %s", dir, strerror(errno));
    tb_check_dir(dir);  // mkdir -p leaves an existing file of that name alone
    new_file_name(w->path, sizeof(w->path), dir);
    w->fd = open(w->path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL, 0644);
    if (w->fd < 0) mt_die("--tensorboard-dir: cannot create the event file %s: %s", w->path, strerror(errno));
    uint8_t event[TB_EVENT_MAX];
    queue_event(w, event, tb_event_file_version(event, unix_seconds()));
    tb_flush(w);
}

void tb_scalar(TbWriter *w, const char *tag, double value, int64_t step) {
    if (w->fd < 0) return;
    uint8_t event[TB_EVENT_MAX];
    queue_event(w, event, tb_event_scalar(event, unix_seconds(), step, tag, (float)value));
}

void tb_flush(TbWriter *w) {
    if (w->fd < 0 || w->pending_len == 0) return;
    int partial_left, errnum = append_whole(w->fd, w->pending, w->pending_len, &partial_left);
    w->pending_len = 0;
    if (!errnum) return;
    mt_die("--tensorboard-dir: cannot write %s: %s%s; the run stops here (the checkpoints saved so far are "
           "intact): free space or log elsewhere, then resume with --load",
           w->path, strerror(errnum), partial_left ? " (a partial record is left at its end)" : "");
}

void tb_close(TbWriter *w) {
    tb_flush(w);
    if (w->fd >= 0) close(w->fd);
    free(w->pending);
    memset(w, 0, sizeof(*w));
    w->fd = -1;
}
