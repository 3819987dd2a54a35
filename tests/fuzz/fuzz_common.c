// fuzz_common.c — mt_die caught by longjmp, allocation tracking, captured stderr and a
// private temporary directory for the fuzz targets (see fuzz.h).
#include "fuzz.h"

#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/config.h"
#include "core/json.h"
#include "hf/hf_config.h"
#include "hf/hf_family.h"
#include "tokenizer/tokenizer.h"

// ---- allocations made while a parser runs ------------------------------------------------
// ASan (clang's and gcc's) calls these hooks on every malloc/calloc/realloc/free. Without a
// sanitizer the weak symbol is absent: nothing is tracked and what a dying parser held
// leaks, which a short replay run does not mind.
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *)) __attribute__((weak));

#define SLOT_BITS 20
#define SLOTS (1u << SLOT_BITS)
static uintptr_t slots[SLOTS];    // open addressing, linear probing, 0 = empty
static uint32_t touched[SLOTS];   // slots written since the last reset (every occupied one is among them)
static size_t n_touched, live;
static int touched_overflow, table_overflow;
static volatile int tracking;

static size_t slot_of(uintptr_t p) { return (size_t)(((uint64_t)p >> 4) * 0x9E3779B97F4A7C15ull >> (64 - SLOT_BITS)); }

static void track_add(uintptr_t p) {
    if (live >= SLOTS / 4 * 3) {
        table_overflow = 1;
        return;
    }
    size_t i = slot_of(p);
    while (slots[i]) {
        if (slots[i] == p) return;
        i = (i + 1) & (SLOTS - 1);
    }
    slots[i] = p;
    live++;
    if (n_touched < SLOTS) touched[n_touched++] = (uint32_t)i;
    else touched_overflow = 1;
}

static void track_remove(uintptr_t p) {
    size_t i = slot_of(p);
    while (slots[i] != p) {
        if (!slots[i]) return;
        i = (i + 1) & (SLOTS - 1);
    }
    // backward-shift deletion: the entries after i that probed past it move up
    slots[i] = 0;
    live--;
    for (size_t j = i;;) {
        j = (j + 1) & (SLOTS - 1);
        if (!slots[j]) break;
        size_t home = slot_of(slots[j]);
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        slots[i] = slots[j];
        slots[j] = 0;
        i = j;
    }
}

static void on_malloc(const volatile void *p, size_t size) {
    (void)size;
    if (tracking && p) track_add((uintptr_t)p);
}

static void on_free(const volatile void *p) {
    if (tracking && p) track_remove((uintptr_t)p);
}

// Forgets every tracked block; frees them too when free_them (the parser died holding them).
static void track_reset(int free_them) {
    if (touched_overflow) {
        for (size_t i = 0; i < SLOTS; i++)
            if (slots[i]) {
                if (free_them) free((void *)slots[i]);
                slots[i] = 0;
            }
    } else {
        for (size_t k = 0; k < n_touched; k++) {
            uintptr_t p = slots[touched[k]];
            if (!p) continue;
            if (free_them) free((void *)p);
            slots[touched[k]] = 0;
        }
    }
    n_touched = live = 0;
    touched_overflow = 0;
}

// ---- mt_die, stderr ----------------------------------------------------------------------

static jmp_buf die_jump;
static volatile int in_run;
static FILE *real_stderr, *capture;
static char capture_buf[1 << 22];
static char last_error[4096];
static char stdout_buf[1 << 16];
static int verbose;

static void on_die(void) {
    if (in_run) longjmp(die_jump, 1);
    // outside fuzz_run: mt_die goes on to exit(1) as usual
}

static void remove_dir(void);

static void init(void) {
    static int done;
    if (done) return;
    done = 1;
    verbose = getenv("FUZZ_VERBOSE") && strcmp(getenv("FUZZ_VERBOSE"), "0");
    real_stderr = stderr;
    // stdout gets a static buffer now, so that a parser's first printf cannot allocate one
    // inside a run (the block would be freed by track_reset if the parser then died).
    setvbuf(stdout, stdout_buf, _IOFBF, sizeof stdout_buf);
    capture = fmemopen(capture_buf, sizeof capture_buf - 1, "w");
    if (!capture) {
        perror("fuzz: fmemopen");
        abort();
    }
    setvbuf(capture, NULL, _IONBF, 0);
    mt_set_die_handler(NULL, on_die);
    if (__sanitizer_install_malloc_and_free_hooks) __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
    atexit(remove_dir);
}

void fuzz_fail(const char *fmt, ...) {
    FILE *out = real_stderr ? real_stderr : stderr;
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: BUG: ", out);
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    va_end(ap);
    fflush(out);
    abort();
}

const char *fuzz_error(void) { return last_error; }

// The first "moetron: error: " line of the captured text (NUL-terminated) into last_error;
// *rest: what follows that line (mt_die writes the line last, so normally nothing).
static void find_error(const char *text, size_t n, const char **rest) {
    static const char head[] = "moetron: error: ";
    last_error[0] = 0;
    *rest = "";
    const char *found = NULL;
    for (const char *s = text; s < text + n && !found;) {
        if ((size_t)(text + n - s) >= sizeof head - 1 && !memcmp(s, head, sizeof head - 1)) found = s;
        const char *nl = memchr(s, '\n', (size_t)(text + n - s));
        if (!nl) break;
        s = nl + 1;
    }
    if (!found) return;
    const char *end = memchr(found, '\n', (size_t)(text + n - found));
    size_t len = end ? (size_t)(end - found) : (size_t)(text + n - found);
    if (end) *rest = end + 1;
    if (len >= sizeof last_error) len = sizeof last_error - 1;
    memcpy(last_error, found, len);
    last_error[len] = 0;
}

int fuzz_run(void (*body)(void *ctx), void *ctx) {
    init();
    clearerr(capture);
    fseek(capture, 0, SEEK_SET);
    FILE *saved = stderr;
    volatile int died = 0;
    in_run = 1;
    stderr = capture;
    track_reset(0);
    table_overflow = 0;
    tracking = 1;
    if (setjmp(die_jump) == 0) body(ctx);
    else died = 1;
    tracking = 0;
    in_run = 0;
    stderr = saved;
    long n = ftell(capture);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof capture_buf) n = sizeof capture_buf - 1;
    capture_buf[n] = 0;
    if (verbose && n) fwrite(capture_buf, 1, (size_t)n, real_stderr);
    track_reset(died);
    if (died && table_overflow && verbose)
        fprintf(real_stderr, "fuzz: note: too many live allocations to track; a dying parser's blocks leak\n");
    if (!died) {
        last_error[0] = 0;
        return FUZZ_RETURNED;
    }
    const char *rest;
    find_error(capture_buf, (size_t)n, &rest);
    if (!last_error[0] && (size_t)n < sizeof capture_buf - 1)
        fuzz_fail("mt_die without a \"moetron: error:\" line; captured: %.300s", capture_buf);
    // mt_die writes one line: a message that quotes a newline from the input must not break it
    if (rest[0]) fuzz_fail("the error message runs over several lines: %.300s", last_error);
    // MT_ASSERT's "internal error at FILE:LINE: ..." (checked at the start of the message, so
    // that user text quoted in an error cannot look like one)
    if (!strncmp(last_error + strlen("moetron: error: "), "internal error at ", 18))
        fuzz_fail("an internal error on bad input: %s", last_error);
    return FUZZ_DIED;
}

// ---- files ---------------------------------------------------------------------------------

static char dir[256];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_dir(void) {
    if (!dir[0]) return;
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    dir[0] = 0;
}

const char *fuzz_dir(void) {
    init();
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/moetron-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
    }
    return dir;
}

const char *fuzz_path(const char *name) {
    static char paths[4][600];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", fuzz_dir(), name);
    return p;
}

const char *fuzz_write(const char *name, const void *data, size_t size) {
    const char *path = fuzz_path(name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n <= 0) {
            perror(path);
            abort();
        }
        p += n;
        size -= (size_t)n;
    }
    close(fd);
    return path;
}

FuzzPair fuzz_split(const uint8_t *data, size_t size) {
    if (size < 4) return (FuzzPair){data + size, data + size, 0, 0};
    size_t n = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    if (n > size - 4) n = size - 4;
    return (FuzzPair){data + 4, data + 4 + n, n, size - 4 - n};
}

// ---- config.json round trip ---------------------------------------------------------------

typedef struct {
    const Config *c;
    Config again;
    char dir[600];
} RoundTrip;

static void write_and_read_back(void *ctx) {
    RoundTrip *r = ctx;
    char why[256];
    HfFamily family = hf_family_choose(r->c, why);
    JsonWriter w;
    jw_init(&w);
    hf_config_write(&w, r->c, family);
    fuzz_write("round_trip/config.json", jw_text(&w), jw_len(&w));
    jw_free(&w);
    config_defaults(&r->again);
    config_from_checkpoint(&r->again, r->dir);
}

void fuzz_check_config_round_trip(const Config *c) {
    static RoundTrip r;  // Config is large: not on the stack
    r.c = c;
    snprintf(r.dir, sizeof r.dir, "%s/round_trip", fuzz_dir());
    mkdir(r.dir, 0755);
    if (fuzz_run(write_and_read_back, &r) != FUZZ_RETURNED) {
        if (strstr(fuzz_error(), "--hf-architecture")) return;  // the family named cannot express c
        fuzz_fail("the config.json written for a valid config does not read back: %s", fuzz_error());
    }
    const Config *a = c, *b = &r.again;
#define SAME(field)                                                                                 \
    if (a->field != b->field)                                                                       \
        fuzz_fail("config.json round trip changed " #field ": %lld -> %lld", (long long)a->field,    \
                  (long long)b->field)
    SAME(num_layers);
    SAME(hidden_size);
    SAME(num_attention_heads);
    SAME(kv_heads);
    SAME(head_dim);
    SAME(num_experts);
    SAME(moe_router_topk);
    SAME(padded_vocab_size);
    SAME(multi_latent_attention);
#undef SAME
    if (memcmp(a->moe_layer, b->moe_layer, sizeof a->moe_layer))
        fuzz_fail("config.json round trip changed the MoE layer pattern");
}

void fuzz_tokenizer_round_trip(const Tokenizer *t, const char *text, size_t len) {
    int32_t *ids;
    int n = tokenizer_encode(t, text, len, &ids);
    int vocab = tokenizer_vocab_size(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) fuzz_fail("id %d out of the vocabulary (%d)", ids[i], vocab);
    char small[64];
    size_t need = tokenizer_decode(t, ids, n, small, sizeof small);
    char *out = malloc(need + 1);
    if (tokenizer_decode(t, ids, n, out, need + 1) != need) fuzz_fail("tokenizer_decode is not deterministic");
    free(out);
    free(ids);
}
