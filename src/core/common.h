// common.h — the few things every file needs: the compute type, checks that exit
// with one clear line, and allocation that never returns NULL.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// The compute type of parameters, activations and gradients. The normal build is
// float; the gradient-check build compiles the same model code with double so that
// finite differences are accurate to ~1e-8 and tolerances can be tight.
// real_exp: libm's exp in double; in float a vectorizable e^x (core/fast_exp.h).
#ifdef MT_DOUBLE
typedef double real;
#define real_exp exp
#define real_sqrt sqrt
#else
typedef float real;
#include "core/fast_exp.h"
#define real_exp fast_expf
#define real_sqrt sqrtf
#endif

#ifdef __cplusplus  // the cuda backend's .cu files are C++: these functions are C
extern "C" {
#endif

// Print "moetron: error: <message>" and exit(1). Every user-facing error goes here:
// one line that names the file or flag and says how to fix it.
void mt_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
// How mt_die ends a run of several processes (set by comm_world_init under MPI): the
// message gets `prefix` ("[rank 3] ") and end_all() stops every process instead of
// exit(1). NULL, NULL restores the single-process behaviour.
void mt_set_die_handler(const char *prefix, void (*end_all)(void));
// mt_die for a thread other than the main one (the collective watchdog): the same line, then
// _exit(1) without calling into MPI or exit handlers, which the main thread may be inside;
// the launcher then ends the other processes of a job whose process failed.
void mt_die_from_thread(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
// Flushes standard output; a failed write (a full disk) is an mt_die, so that no command
// exits 0 with its output cut short.
void mt_flush_stdout(void);

// Internal invariant: a bug in moetron, not in the user's input.
#define MT_ASSERT(cond)                                                                \
    do {                                                                               \
        if (!(cond)) mt_die("internal error at %s:%d: %s (please report)", __FILE__,   \
                            __LINE__, #cond);                                          \
    } while (0)

void *mt_malloc(size_t bytes);  // dies with a clear message on failure
void *mt_calloc(size_t count, size_t size);
void *mt_realloc(void *ptr, size_t bytes);
char *mt_strdup(const char *s);
// count · size: the bytes of an array, the elements of a shape. A negative count or a
// product beyond SIZE_MAX is an internal error: config_validate bounds every size derived
// from flags, so this only catches what it missed.
size_t mt_size_product(int64_t count, size_t size);

#ifdef __cplusplus
}
#endif

#define MT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MT_MAX(a, b) ((a) > (b) ? (a) : (b))
