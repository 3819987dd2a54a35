// replay_main.c — runs a fuzz target (no libFuzzer) on every file of the directories (or
// files) given: its seed corpus and the crashing inputs kept as regressions.
//   build/fuzz/replay_json tests/fuzz/corpus/json tests/fuzz/regressions/json
// Each file is run as it is and, for the seeds (files not under a regressions/ directory),
// also damaged, deterministically: cut at up to 96 offsets, 48 single-bit flips and 16
// fields overwritten with a huge value (4 or 8 bytes of 0xff or 0x7f...). Every one of them
// must end in the parser's result or one clean "moetron: error:" line (fuzz.h): a crash, a
// sanitizer report or an internal error ends the process (tests/run.sh reports it).
// Prints "ok fuzz_replay_<target> (...)". FUZZ_VERBOSE=1 prints each file and its error;
// FUZZ_NO_DAMAGE=1 runs the files only as they are.
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

#ifndef FUZZ_NAME
#define FUZZ_NAME "target"
#endif

// A UBSan report is a failure, also in builds that let it continue (gcc's default).
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "halt_on_error=1:abort_on_error=1:print_stacktrace=1"; }

static int inputs, runs, errors;

// What runs now, named when the process dies on it (a crash report says where, not on what).
static char current[1200];

static void name_current(void) {
    if (!current[0]) return;
    ssize_t ignored = write(1, current, strlen(current));
    (void)ignored;
}

static void on_signal(int sig) {
    name_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void run_one(const char *path, const char *damage, const unsigned char *data, size_t n) {
    snprintf(current, sizeof current, "FAIL fuzz_replay_%s: died on %.900s%s\n", FUZZ_NAME, path, damage);
    // an exactly-sized copy, so that AddressSanitizer sees a read past the end
    unsigned char *exact = malloc(n ? n : 1);
    memcpy(exact, data, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    runs++;
    if (fuzz_error()[0]) errors++;
    current[0] = 0;
}

static uint64_t next_random(uint64_t *state) {  // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

// Truncations, bit flips and huge values written over a field: the damage a file gets.
static void run_damaged(const char *path, const unsigned char *data, size_t n) {
    if (!n) return;
    unsigned char *copy = malloc(n);
    size_t cuts = n < 96 ? n : 96;
    char what[96];
    for (size_t k = 0; k < cuts; k++) {  // 0 .. n-1 bytes
        snprintf(what, sizeof what, " cut to %zu bytes", k * n / cuts);
        run_one(path, what, data, k * n / cuts);
    }
    uint64_t state = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) state = (state ^ data[i]) * 0x100000001B3ull;
    if (!state) state = 1;
    for (int k = 0; k < 48; k++) {
        memcpy(copy, data, n);
        uint64_t bit = next_random(&state) % (8 * (uint64_t)n);
        copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        snprintf(what, sizeof what, " with bit %llu flipped", (unsigned long long)bit);
        run_one(path, what, copy, n);
    }
    for (int k = 0; k < 16; k++) {
        memcpy(copy, data, n);
        size_t width = k % 2 ? 8 : 4, at = (size_t)(next_random(&state) % n);
        for (size_t i = 0; i < width && at + i < n; i++) copy[at + i] = k % 4 < 2 ? 0xff : i + 1 == width ? 0x7f : 0xff;
        snprintf(what, sizeof what, " with %zu bytes at %zu overwritten (variant %d)", width, at, k);
        run_one(path, what, copy, n);
    }
    free(copy);
}

static void replay_file(const char *path, int damage) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        printf("FAIL fuzz_replay_%s: cannot open %s\n", FUZZ_NAME, path);
        exit(1);
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *data = malloc(cap);
    for (size_t got; data && (got = fread(data + n, 1, cap - n, fp)) > 0;) {
        n += got;
        if (n == cap) data = realloc(data, cap *= 2);
    }
    fclose(fp);
    if (!data) abort();
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s\n", path);
    run_one(path, "", data, n);
    inputs++;
    if (damage && !getenv("FUZZ_NO_DAMAGE")) run_damaged(path, data, n);
    free(data);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void replay_path(const char *path) {
    struct stat st;
    if (stat(path, &st)) return;
    int damage = !strstr(path, "regressions");
    if (!S_ISDIR(st.st_mode)) {
        replay_file(path, damage);
        return;
    }
    DIR *d = opendir(path);
    if (!d) return;
    char **names = NULL;
    size_t count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
        names = realloc(names, (count + 1) * sizeof *names);
        names[count] = malloc(strlen(path) + strlen(e->d_name) + 2);
        sprintf(names[count++], "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (count) qsort(names, count, sizeof *names, compare_names);
    for (size_t i = 0; i < count; i++) {
        if (!stat(names[i], &st) && S_ISREG(st.st_mode)) replay_file(names[i], damage);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    signal(SIGABRT, on_signal);  // fuzz_fail, and sanitizers that abort
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(name_current);
    else {
        signal(SIGSEGV, on_signal);
        signal(SIGBUS, on_signal);
        signal(SIGFPE, on_signal);
        signal(SIGILL, on_signal);
    }
    for (int i = 1; i < argc; i++) replay_path(argv[i]);
    if (!inputs) {
        printf("FAIL fuzz_replay_%s: no input found\n", FUZZ_NAME);
        return 1;
    }
    printf("ok fuzz_replay_%s (%d files, %d runs with the damaged copies, %d ended in moetron: error)\n", FUZZ_NAME,
           inputs, runs, errors);
    return 0;
}
