// fuzz.h — what every fuzz target (tests/fuzz/fuzz_*.c) shares.
//
// A target defines LLVMFuzzerTestOneInput and is linked either with libFuzzer (make fuzz,
// clang -fsanitize=fuzzer,address,undefined) or with tests/fuzz/replay_main.c (make test:
// every file of tests/fuzz/corpus/<target>/ and tests/fuzz/regressions/<target>/ once).
//
// moetron's parsers end a run on bad input with mt_die ("moetron: error: ..." and exit(1)).
// For fuzzing that is the expected, clean outcome, so fuzz_run() calls the parser with a
// die handler (mt_set_die_handler) that longjmps back instead of exiting, frees what the
// parser had allocated (tracked through the sanitizer's malloc hooks, so that libFuzzer's
// leak check sees no leak), and returns FUZZ_DIED with the message in fuzz_error(). A
// crash, a sanitizer report, a hang, or an mt_die that is an internal error (MT_ASSERT:
// "internal error at ..."), has no message or runs over several lines is a bug: fuzz_run
// aborts on the last three.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FUZZ_RETURNED = 0, FUZZ_DIED = 1 };

// Runs body(ctx) with mt_die caught; stderr is captured meanwhile (shown with FUZZ_VERBOSE=1).
// body must free what it allocates on its normal path. Not reentrant.
int fuzz_run(void (*body)(void *ctx), void *ctx);
// The last "moetron: error: ..." line caught by fuzz_run (without the newline), "" if none.
const char *fuzz_error(void);

// Encodes text with a loaded tokenizer and decodes the ids: every id must lie in the
// vocabulary and the decoded length must not depend on the buffer (fuzz_fail otherwise).
struct Tokenizer;
void fuzz_tokenizer_round_trip(const struct Tokenizer *t, const char *text, size_t len);

// A private directory (created on first use, removed at exit) and files in it.
const char *fuzz_dir(void);
// Writes data to fuzz_dir()/name and returns the path (a static buffer per call site is the
// caller's business: the result stays valid until the next fuzz_path call).
const char *fuzz_write(const char *name, const void *data, size_t size);
const char *fuzz_path(const char *name);

// Splits an input made of two files: u32 little-endian n, n bytes of the first, then the
// second (n is cut to what the input holds).
typedef struct {
    const uint8_t *first, *second;
    size_t first_size, second_size;
} FuzzPair;
FuzzPair fuzz_split(const uint8_t *data, size_t size);

// The config.json that a checkpoint of c (validated) would hold, written by hf_config_write
// for the family hf_family_choose picks, must read back with config_from_checkpoint into
// the same model shape; aborts otherwise. A family refused for c is fine.
void fuzz_check_config_round_trip(const Config *c);

// Aborts with a message: an oracle of a target found a wrong result.
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
