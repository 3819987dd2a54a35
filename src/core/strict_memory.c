// strict_memory.c — closed tensor blocks and the fault handler that names a host access
// (strict_memory.h).
#include "core/strict_memory.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"

typedef struct {
    char *base;
    size_t bytes;   // asked for
    size_t mapped;  // whole pages
} StrictBlock;

static struct {
    int enabled;
    StrictBlock *blocks;
    size_t count, capacity;
    int open_depth;  // strict_open calls not yet closed
    int survey;      // MOETRON_STRICT_SURVEY=1: report each place once and go on
    void *seen[256];  // survey: faulting instructions already reported
    int seen_count;
} g;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void protect(const StrictBlock *b, int prot) {
    if (mprotect(b->base, b->mapped, prot) != 0) mt_die("strict memory: mprotect of %zu bytes failed", b->mapped);
}

static void protect_all(int prot) {
    for (size_t i = 0; i < g.count; i++) protect(&g.blocks[i], prot);
}

static const StrictBlock *block_of(const void *p) {
    for (size_t i = 0; i < g.count; i++)
        if ((const char *)p >= g.blocks[i].base && (const char *)p < g.blocks[i].base + g.blocks[i].mapped)
            return &g.blocks[i];
    return NULL;
}

// Writes text to stderr without stdio (async-signal-safe).
static void say(const char *text) {
    ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
    (void)ignored;
}

static void say_number(const char *prefix, uintptr_t value, int base) {
    char digits[32], *d = digits + sizeof(digits);
    *--d = 0;
    do {
        *--d = "0123456789abcdef"[value % (uintptr_t)base];
        value /= (uintptr_t)base;
    } while (value);
    say(prefix);
    if (base == 16) say("0x");
    say(d);
}

enum { MAX_FRAMES = 24 };

// Prints the frames of this executable as "function at file:line" (addr2line on their
// offsets in the binary, in a child process); 0 when that cannot be done.
static int symbolize(void *const *frames, int n) {
    static char offsets[MAX_FRAMES][24];
    static char *argv[MAX_FRAMES + 8];
    Dl_info self;
    if (!dladdr((void *)symbolize, &self) || !self.dli_fname) return 0;
    int argc = 0;
    argv[argc++] = "addr2line";
    argv[argc++] = "-f";
    argv[argc++] = "-p";
    argv[argc++] = "-i";
    argv[argc++] = "-e";
    argv[argc++] = (char *)self.dli_fname;
    for (int i = 2; i < n; i++) {  // 0: this handler's caller chain starts after the signal frame
        Dl_info where;
        if (!dladdr(frames[i], &where) || where.dli_fbase != self.dli_fbase) continue;
        // frame 2 is the faulting instruction itself; the others are return addresses (−1: inside the call)
        uintptr_t off = (uintptr_t)frames[i] - (uintptr_t)self.dli_fbase - (i > 2);
        char *d = offsets[i] + sizeof(offsets[0]);
        *--d = 0;
        do {
            *--d = "0123456789abcdef"[off % 16];
            off /= 16;
        } while (off);
        *--d = 'x';
        *--d = '0';
        argv[argc++] = d;
    }
    argv[argc] = NULL;
    pid_t child = fork();
    if (child < 0) return 0;
    if (child == 0) {
        dup2(STDERR_FILENO, STDOUT_FILENO);
        execvp("addr2line", argv);
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

enum { X86_TRAP_FLAG = 0x100 };  // EFLAGS.TF: trap after the next instruction
static const StrictBlock *survey_open_block;  // opened for one instruction

// Survey mode: names the place once (its innermost frames), opens the block for the one
// faulting instruction (single-stepped with the trap flag; on_step closes it again) and
// lets the access proceed, so one run lists every place.
static void survey_fault(const StrictBlock *b, void *context) {
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    int known = 0;
    for (int i = 0; i < g.seen_count && n > 2; i++) known |= g.seen[i] == frames[2];
    if (!known && n > 2) {
        if (g.seen_count < (int)(sizeof(g.seen) / sizeof(g.seen[0]))) g.seen[g.seen_count++] = frames[2];
        say("strict survey: host access at\n");
        if (!symbolize(frames, n < 6 ? n : 6)) backtrace_symbols_fd(frames, n, STDERR_FILENO);
    }
    protect(b, PROT_READ | PROT_WRITE);
#if defined(__x86_64__)
    ((ucontext_t *)context)->uc_mcontext.gregs[REG_EFL] |= X86_TRAP_FLAG;
    survey_open_block = b;
#endif
}

static void on_step(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
#if defined(__x86_64__)
    ((ucontext_t *)context)->uc_mcontext.gregs[REG_EFL] &= ~X86_TRAP_FLAG;
    if (survey_open_block && g.open_depth == 0) protect(survey_open_block, PROT_NONE);
    survey_open_block = NULL;
#else
    (void)context;
#endif
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)context;
    const StrictBlock *b = block_of(info->si_addr);
    if (!b) {  // not ours: the default action (a plain crash)
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (g.survey) {
        survey_fault(b, context);
        return;
    }
    say("error: strict memory (--device cpu-strict): host code touched tensor memory outside an op");
    say_number(" at ", (uintptr_t)info->si_addr, 16);
    say_number(", byte ", (uintptr_t)((char *)info->si_addr - b->base), 10);
    say_number(" of a block of ", b->bytes, 10);
    say(" bytes; the place, innermost first:\n");
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    if (!symbolize(frames, n)) backtrace_symbols_fd(frames, n, STDERR_FILENO);
    _exit(134);
}

void strict_memory_enable(void) {
    if (g.enabled) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    const char *survey = getenv("MOETRON_STRICT_SURVEY");
    g.survey = survey && strcmp(survey, "1") == 0;
    if (g.survey) {
        sa.sa_sigaction = on_step;
        sigaction(SIGTRAP, &sa, NULL);
    }
    g.enabled = 1;
}

int strict_memory_enabled(void) { return g.enabled; }

void *strict_alloc(size_t bytes) {
    size_t page = page_size(), mapped = (bytes + page - 1) / page * page;
    if (mapped == 0) mapped = page;
    void *p = mmap(NULL, mapped, g.open_depth ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) mt_die("out of memory: a strict tensor block of %zu bytes", bytes);
    if (g.count == g.capacity) {
        g.capacity = g.capacity ? 2 * g.capacity : 64;
        g.blocks = mt_realloc(g.blocks, g.capacity * sizeof(StrictBlock));
    }
    g.blocks[g.count++] = (StrictBlock){.base = p, .bytes = bytes, .mapped = mapped};
    return p;
}

void strict_free(void *p) {
    for (size_t i = 0; i < g.count; i++)
        if (g.blocks[i].base == p) {
            munmap(p, g.blocks[i].mapped);
            g.blocks[i] = g.blocks[--g.count];
            return;
        }
    mt_die("internal error: strict_free of a pointer that is not a strict block (please report)");
}

int strict_owns(const void *p) { return block_of(p) != NULL; }

void strict_open(void) {
    if (g.open_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

void strict_close(void) {
    if (g.open_depth == 0) mt_die("internal error: strict_close without strict_open (please report)");
    if (--g.open_depth == 0) protect_all(PROT_NONE);
}
