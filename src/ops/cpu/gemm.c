// gemm.c — row-major GEMM for moetron: OpenBLAS when linked, and a portable blocked
// GEMM in plain C that is always compiled.
//
// Portable algorithm (the classic Goto/BLIS structure):
//   for jc over N in NC-wide blocks:
//     for pc over K in KC-deep blocks:             pack op(B)[pc:+KC, jc:+NC] into NR-wide panels
//       for ic over M in MC-tall blocks:           pack op(A)[ic:+MC, pc:+KC] into MR-tall panels
//         for each NR panel, for each MR panel:    MR x NR register tile, summed over KC
// Packing turns all four transpose combinations (and any leading dimension) into the
// same contiguous layout, and zero-pads edge panels so the micro-kernel is always a
// full MR x NR tile; only the write-back looks at the true edge.
//
// Threads: C is cut into a grid of gm x gn rectangles (one per thread) whose edges
// fall on MR / NR panel boundaries; each rectangle is computed by one thread on its
// own, with private packing buffers and no barriers. K is never split: each element
// of C is summed by one thread, over K blocks in order and within a block in order,
// with the same kernel wherever its tile lies, so the result does not depend on the
// number of threads (only on KC, a compile-time constant).
//
// The fp32 micro-kernel comes in two tiles with the same arithmetic: the portable 6x16 (AVX2's
// fused multiply-adds written out where the CPU has them, gemm_fma.h; GCC vectors elsewhere) and
// AVX-512's 6x32 (gemm_fma.h) where the CPU has it; each sums an element by the same fused
// multiply-adds in the same order, so they give the same bits, in any build. (A CPU without
// FMA instructions multiplies and adds: its own bits.)
//
// Low-precision inputs (mt_gemm_set_inputs, gemm_lowp.h): the same blocking and threads
// with another GemmKernel — panels rounded to bf16 or fp16 as they are packed and the fp32
// kernel (the emulation), or bf16 pair panels and the AVX-512 BF16 kernel; both sum each
// element in the same order, so they agree bit for bit.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/gemm_lowp.h"
#include "ops/cpu/gemm_fma.h"
#include "core/float_formats.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "core/profile.h"
#include "core/timer.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MT_HAVE_CBLAS
#include <cblas.h>
#endif

// ---------------------------------------------------------------------------
// Blocking parameters. A vector is 32 bytes (one AVX register): 8 floats or
// 4 doubles. The micro-tile is MR rows x NR = 2 vectors: 6x16 for float, 6x8
// for double, i.e. 12 accumulator registers + 2 for B + 1 broadcast of A.
// KC * NR fits the B micro-panel in L1 (16 KiB), MC * KC the A block in L2
// (144 KiB), KC * NC the B block in a thread's share of L3 (512 KiB). Tuned on a
// 2-core Zen 3; the result does not depend on MC or NC, only on KC.
// ---------------------------------------------------------------------------
#define VEC_BYTES 32
#define VL ((int)(VEC_BYTES / sizeof(real)))
#define MR 6
#define NR (2 * VL)
#define KC MT_GEMM_K_BLOCK  // the depth of one block of sums (gemm.h)
#define MC (MR * (96 / (int)sizeof(real)))  // 144 rows float, 72 rows double
#define NC (2048 / (int)sizeof(real))       // 512 columns float, 256 double
#define GEMM_TILE_MAX (LOWP_AMX_TILE * LOWP_AMX_TILE)  // the largest kernel tile (AMX's), in reals
#define PAR_MIN_WORK (64.0 * 64.0 * 64.0)  // M*N*K at or below this runs on one thread

#if defined(__GNUC__)
#define MT_GEMM_VECTOR_EXT 1
typedef real vreal __attribute__((vector_size(VEC_BYTES)));
#else
#define MT_GEMM_VECTOR_EXT 0
#endif

// The micro-kernel is the only place where a fused multiply-add is wanted; GCC in
// ISO C mode does not contract a*b+c by itself, so ask for it here alone.
// The write-back, in turn, never fuses, whatever -ffp-contract the build uses.
#if defined(__GNUC__) && !defined(__clang__)
#define KERNEL_ATTR __attribute__((optimize("fp-contract=fast"), noinline))
#define STORE_ATTR __attribute__((optimize("fp-contract=off")))
#else
#define KERNEL_ATTR
#define STORE_ATTR
#endif

// One GEMM problem, with op(A) and op(B) described by element strides:
// op(A)[i,k] = A[i*a_rs + k*a_ks], op(B)[k,j] = B[k*b_ks + j*b_cs], each operand's
// elements stored as its Storage (gemm.h).
typedef struct {
    int M, N, K;
    real alpha, beta;
    const void *A;
    Storage a_store;
    size_t a_rs, a_ks;
    const void *B;
    Storage b_store;
    size_t b_ks, b_cs;
    void *C;
    Storage c_store;  // STORE_BF16: beta 0, and each K pass sums into a staging block (gemm_rect)
    size_t ldc;
    const struct GemmKernel *kernel;
} GemmProblem;

// How the micro-tiles of a GEMM are computed: the packed element, how a block of op(A) or
// op(B) (its elements stored as `store`: fp32, or bf16 values that rounding leaves as they are)
// is packed into panels of W lanes, and the micro-kernel over one A and one B panel
// (acc[MR][NR] = the panels' product over depth kc).
typedef struct GemmKernel {
    const char *name;
    int mr, nr;         // the micro-tile: rows of A's panels, columns of B's
    int mc;             // rows of op(A) packed at a time (a multiple of mr)
    size_t elem_bytes;  // one packed element
    int depth_align;    // a panel's depth is kc rounded up to this (bf16 pairs, AMX steps)
    // Packing a lane of op(A) whose depths are not side by side in memory (a_ks != 1), or a lane
    // of op(B) not side by side with the next lane (b_cs != 1), against one that is: AMX's
    // packers transpose those in registers, measured about twice the work (12.8% of a
    // weight-gradient GEMM against 5.8% for its other operand, with half the lanes); 1 for the
    // other kernels, whose packers were not measured so.
    double transposed_lane_cost;
    void (*pack_a)(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w, size_t s_k);
    void (*pack_b)(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w, size_t s_k);
    void (*micro)(int kc, const void *a, const void *b, real *acc);
    // Or NULL: C[mr][nr] (rows ldc apart) = the panels' product plus C's own values when
    // accumulate, summed in the kernel's accumulators starting from C (AMX's tiles), so that
    // C needs no trip through acc and no separate write-back (alpha 1, beta 0 or 1).
    void (*micro_into)(int kc, const void *a, const void *b, real *C, size_t ldc, int accumulate);
} GemmKernel;

// ---------------------------------------------------------------------------
// Backend choice: the one piece of global state, set once (or by
// mt_gemm_force_portable). Racing first calls compute the same value.
// ---------------------------------------------------------------------------
enum { BACKEND_UNSET = 0, BACKEND_BLAS = 1, BACKEND_PORTABLE = 2 };
static int g_backend = BACKEND_UNSET;

#if defined(__GNUC__)
#define BACKEND_LOAD() __atomic_load_n(&g_backend, __ATOMIC_ACQUIRE)
#define BACKEND_STORE(v) __atomic_store_n(&g_backend, (v), __ATOMIC_RELEASE)
#else
#define BACKEND_LOAD() (g_backend)
#define BACKEND_STORE(v) (g_backend = (v))
#endif

// The backend when nothing is forced: OpenBLAS if linked and not overridden by
// MOETRON_GEMM=portable.
static int backend_default(void) {
#ifdef MT_HAVE_CBLAS
    const char *env = getenv("MOETRON_GEMM");
    if (env && strcmp(env, "portable") == 0) return BACKEND_PORTABLE;
    return BACKEND_BLAS;
#else
    return BACKEND_PORTABLE;
#endif
}

static int backend_get(void) {
    int b = BACKEND_LOAD();
    if (b == BACKEND_UNSET) {
        b = backend_default();
        BACKEND_STORE(b);
    }
    return b;
}

const char *mt_gemm_backend(void) {
    return backend_get() == BACKEND_BLAS ? "openblas" : "portable";
}

void mt_gemm_force_portable(int on) {
    BACKEND_STORE(on ? BACKEND_PORTABLE : backend_default());
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------
static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// C[M,N] = beta * C, with beta == 0 writing exact zeros (NaN in C is dropped).
static void scale_c(int M, int N, real beta, real *C, size_t ldc) {
    for (int i = 0; i < M; i++) {
        real *c = C + (size_t)i * ldc;
        if (beta == 0) memset(c, 0, (size_t)N * sizeof(real));
        else if (beta != 1)
            for (int j = 0; j < N; j++) c[j] *= beta;
    }
}

// The packing buffers a thread's GEMMs use, kept from one GEMM to the next (grown to the
// largest asked for, never shrunk) and freed when the thread ends: allocating them per call
// cost page faults and the kernel's page clearing on every call that malloc served from fresh
// pages (most of a small GEMM's time). Outside the memory plan, like the other ops' scratch.
typedef enum { SCRATCH_A_PANELS, SCRATCH_B_PANELS, SCRATCH_STAGING, SCRATCH_KINDS } GemmScratch;
typedef struct {
    void *raw[SCRATCH_KINDS];     // what malloc returned
    size_t bytes[SCRATCH_KINDS];  // usable from the 64-byte aligned address in it
} ThreadScratch;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void thread_scratch_free(void *scratch) {
    ThreadScratch *t = scratch;
    for (int k = 0; k < SCRATCH_KINDS; k++) free(t->raw[k]);
    free(t);
}

static void thread_scratch_key_create(void) {
    if (pthread_key_create(&g_scratch_key, thread_scratch_free))
        mt_die("out of thread-specific keys (pthread_key_create)");
}

// This thread's buffer of kind `which`, at least `bytes` long and aligned to 64 bytes; its
// contents are not kept when it grows.
static void *thread_scratch(GemmScratch which, size_t bytes) {
    pthread_once(&g_scratch_once, thread_scratch_key_create);
    ThreadScratch *t = pthread_getspecific(g_scratch_key);
    if (!t) {
        t = mt_calloc(1, sizeof *t);
        pthread_setspecific(g_scratch_key, t);
    }
    if (t->bytes[which] < bytes) {
        free(t->raw[which]);
        t->raw[which] = mt_malloc(bytes + 64);
        t->bytes[which] = bytes;
    }
    return (void *)(((uintptr_t)t->raw[which] + 63) & ~(uintptr_t)63);
}

// ---------------------------------------------------------------------------
// Packing. A block of width w (rows of op(A) or columns of op(B)) and depth kc
// is cut into panels of W lanes (MR for A, NR for B); panel q holds lanes
// [q*W, q*W + W) stored k-major: dst[q*W*kc + k*W + i] = lane q*W + i at depth k.
// Lanes past w are zero. The source element (lane j, depth k) is src[j*s_w + k*s_k].
// ---------------------------------------------------------------------------

// dst[0, n) <- the n elements from element `at` of src (stored as `store`), as reals.
static inline void copy_run(real *restrict dst, const void *restrict src, Storage store, size_t at, int n) {
    if (store == STORE_FP32) {
        memcpy(dst, (const real *)src + at, (size_t)n * sizeof(real));
        return;
    }
    const uint16_t *x = (const uint16_t *)src + at;
    for (int i = 0; i < n; i++) dst[i] = (real)bf16_to_float(x[i]);
}

// Lanes contiguous in memory (s_w == 1): walk the source one k-row at a time, so
// reads stream through memory even when rows are far apart (large lda / ldb).
static void pack_rows(real *restrict dst, const void *restrict src, Storage store, int w, int W, int kc,
                      size_t s_k) {
    for (int k = 0; k < kc; k++) {
        size_t row = (size_t)k * s_k;
        real *d = dst + (size_t)k * W;
        int j = 0;
        for (; j + W <= w; j += W) copy_run(d + (size_t)j * kc, src, store, row + j, W);
        if (j < w) {
            copy_run(d + (size_t)j * kc, src, store, row + j, w - j);
            memset(d + (size_t)j * kc + (w - j), 0, (W - (w - j)) * sizeof(real));
        }
    }
}

// One panel of wq <= W lanes from element `at` of src, each lane strided by s_w (usually
// s_k == 1: every lane is a contiguous run along k): gather one k at a time.
static void pack_gather_panel(real *restrict dst, const void *restrict src, Storage store, size_t at, int wq, int W,
                              int kc, size_t s_w, size_t s_k) {
    const real *x32 = src;
    const uint16_t *x16 = src;
    for (int k = 0; k < kc; k++) {
        real *d = dst + (size_t)k * W;
        size_t from = at + (size_t)k * s_k;
        if (store == STORE_FP32)
            for (int i = 0; i < wq; i++) d[i] = x32[from + i * s_w];
        else
            for (int i = 0; i < wq; i++) d[i] = (real)bf16_to_float(x16[from + i * s_w]);
        for (int i = wq; i < W; i++) d[i] = 0;
    }
}

// dst[ceil(w/W) panels][kc][W] <- the w x kc block at src (stored as `store`; strides s_w, s_k).
static inline void pack_block(real *restrict dst, const void *restrict src, Storage store, int w, int W, int kc,
                              size_t s_w, size_t s_k) {
    if (s_w == 1) {
        pack_rows(dst, src, store, w, W, kc, s_k);
        return;
    }
    for (int j = 0; j < w; j += W)
        pack_gather_panel(dst + (size_t)j * kc, src, store, j * s_w, MT_MIN(W, w - j), W, kc, s_w, s_k);
}

// Ap[ceil(mc/MR) panels][kc][MR] <- op(A)[ic:ic+mc, pc:pc+kc] (in the kernel's packing)
static void pack_a(const GemmProblem *p, int ic, int mc, int pc, int kc, void *Ap) {
    const void *at = storage_at_const(p->A, p->a_store, (size_t)ic * p->a_rs + (size_t)pc * p->a_ks);
    p->kernel->pack_a(Ap, at, p->a_store, mc, p->kernel->mr, kc, p->a_rs, p->a_ks);
}

// Bp[ceil(nc/NR) panels][kc][NR] <- op(B)[pc:pc+kc, jc:jc+nc] (in the kernel's packing)
static void pack_b(const GemmProblem *p, int pc, int kc, int jc, int nc, void *Bp) {
    const void *at = storage_at_const(p->B, p->b_store, (size_t)pc * p->b_ks + (size_t)jc * p->b_cs);
    p->kernel->pack_b(Bp, at, p->b_store, nc, p->kernel->nr, kc, p->b_cs, p->b_ks);
}

// Packed elements per lane of a panel of depth kc.
static size_t panel_depth(const GemmKernel *kern, int kc) {
    return (size_t)ceil_div(kc, kern->depth_align) * kern->depth_align;
}

// ---------------------------------------------------------------------------
// Micro-kernel: acc[MR][NR] = sum_k a[k][0:MR] (outer) b[k][0:NR], k = 0..kc-1 in
// order. a is a packed A panel [kc][MR], b a packed B panel [kc][NR] (64-byte
// aligned), acc 32-byte aligned.
// ---------------------------------------------------------------------------
#if MT_GEMM_VECTOR_EXT
KERNEL_ATTR static void micro_kernel(int kc, const real *restrict a, const real *restrict b,
                                     real *restrict acc) {
    vreal c[MR][2];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = (vreal){0};
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++) {
        const vreal b0 = *(const vreal *)b;
        const vreal b1 = *(const vreal *)(b + VL);
        for (int i = 0; i < MR; i++) {
            const vreal ai = a[i] - (vreal){0};  // broadcast (x - 0 == x exactly)
            c[i][0] += ai * b0;
            c[i][1] += ai * b1;
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < MR; i++) {
        *(vreal *)(acc + i * NR) = c[i][0];
        *(vreal *)(acc + i * NR + VL) = c[i][1];
    }
}
#else
KERNEL_ATTR static void micro_kernel(int kc, const real *restrict a, const real *restrict b,
                                     real *restrict acc) {
    real c[MR][NR] = {{0}};
    for (int k = 0; k < kc; k++) {
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) c[i][j] += a[i] * b[j];
        a += MR;
        b += NR;
    }
    memcpy(acc, c, sizeof c);
}
#endif

// C[mr, nr] = alpha * acc[0:mr, 0:nr] + beta * C; beta == 0 overwrites. acc is a
// kernel's tile, rows acc_ld apart. Every element gets the same two roundings
// (alpha*acc, beta*c, then the sum; no fused multiply-add) on every path.
STORE_ATTR static void tile_store_any(real *restrict C, size_t ldc, const real *restrict acc, int acc_ld,
                                      int mr, int nr, real alpha, real beta) {
    for (int i = 0; i < mr; i++) {
        real *c = C + i * ldc;
        const real *t = acc + i * acc_ld;
        if (beta == 0)
            for (int j = 0; j < nr; j++) c[j] = alpha * t[j];
        else
            for (int j = 0; j < nr; j++) c[j] = alpha * t[j] + beta * c[j];
    }
}

#if MT_GEMM_VECTOR_EXT
// A vector that may sit at any real-aligned address (rows of C).
typedef real vreal_u __attribute__((vector_size(VEC_BYTES), aligned(sizeof(real))));

// A whole tile of tile_store_any (mr x nr, nr a multiple of VL: fp32 tiles), vectors per row.
STORE_ATTR static void tile_store_full(real *restrict C, size_t ldc, const real *restrict acc, int mr, int nr,
                                       real alpha, real beta) {
    for (int i = 0; i < mr; i++) {
        vreal_u *c = (vreal_u *)(C + i * ldc);
        const vreal *t = (const vreal *)(acc + i * nr);
        if (beta == 0)
            for (int v = 0; v < nr / VL; v++) c[v] = alpha * t[v];
        else
            for (int v = 0; v < nr / VL; v++) c[v] = alpha * t[v] + beta * c[v];
    }
}
#define PREFETCH_W(addr) __builtin_prefetch((addr), 1, 3)
#else
STORE_ATTR static void tile_store_full(real *restrict C, size_t ldc, const real *restrict acc, int mr, int nr,
                                       real alpha, real beta) {
    tile_store_any(C, ldc, acc, nr, mr, nr, alpha, beta);
}
#define PREFETCH_W(addr) ((void)0)
#endif

// C[mr, nr] = the kernel's tile product (+ C when accumulate) through micro_into: a whole
// tile in place, an edge tile through a zero-padded copy, so that every element gets the
// same arithmetic wherever its tile lies (and so whatever M, N and the threads are).
static void tile_into(const GemmKernel *kern, int kc, const char *a, const char *b, real *C, size_t ldc, int mr, int nr,
                      int accumulate) {
    if (mr == kern->mr && nr == kern->nr) {
        kern->micro_into(kc, a, b, C, ldc, accumulate);
        return;
    }
    _Alignas(64) real tile[GEMM_TILE_MAX];
    for (int i = 0; i < kern->mr; i++)
        for (int j = 0; j < kern->nr; j++) tile[i * kern->nr + j] = accumulate && i < mr && j < nr ? C[i * ldc + j] : 0;
    kern->micro_into(kc, a, b, tile, (size_t)kern->nr, accumulate);
    for (int i = 0; i < mr; i++) memcpy(C + i * ldc, tile + i * kern->nr, (size_t)nr * sizeof(real));
}

// C[mc, nc] = alpha * Ap · Bp + beta * C for one packed A block [mc, kc] and B
// block [kc, nc]. beta is the caller's beta for the first K block, 1 afterwards
// (C * 1 is exact, so later blocks simply accumulate).
static void macro_kernel(const GemmKernel *kern, int mc, int nc, int kc, const char *Ap, const char *Bp,
                         real *C, size_t ldc, real alpha, real beta) {
    _Alignas(64) real acc[GEMM_TILE_MAX];
    size_t lane_bytes = panel_depth(kern, kc) * kern->elem_bytes;  // one lane of a panel
    int vector_store = kern->elem_bytes == sizeof(real) && kern->nr % VL == 0;  // the fp32 tiles
    int into_c = kern->micro_into && alpha == 1 && (beta == 0 || beta == 1);
    for (int jr = 0; jr < nc; jr += kern->nr) {
        const char *b = Bp + (size_t)jr * lane_bytes;
        int nr = MT_MIN(kern->nr, nc - jr);
        for (int ir = 0; ir < mc; ir += kern->mr) {
            real *c = C + ir * ldc + jr;
            int mr = MT_MIN(kern->mr, mc - ir);
            if (into_c) {
                tile_into(kern, kc, Ap + (size_t)ir * lane_bytes, b, c, ldc, mr, nr, beta != 0);
                continue;
            }
            for (int i = 0; i < mr; i++) {  // fetch the C tile while the kernel runs
                PREFETCH_W(c + i * ldc);
                PREFETCH_W(c + i * ldc + nr - 1);
            }
            kern->micro(kc, Ap + (size_t)ir * lane_bytes, b, acc);
            if (vector_store && mr == kern->mr && nr == kern->nr) tile_store_full(c, ldc, acc, mr, nr, alpha, beta);
            else tile_store_any(c, ldc, acc, kern->nr, mr, nr, alpha, beta);
        }
    }
}

// The packed B blocks of consecutive K blocks that one pass over a block of C rows reuses
// (a half of a core's L2 here): the C rows then take several K blocks' sums while they sit
// in cache, instead of one trip through memory per K block.
#define B_GROUP_BYTES ((size_t)1 << 20)

// Whether gemm_rect sums each block of C rows over all of K in a staging block of fp32 (mc x
// nc, rows nb apart: 256 KiB for AMX's blocks) and writes C once after the last K block, with
// all of K's packed B for a block of columns at hand. A C stored bf16 always is (each element
// is rounded once, from its full sum). So is an fp32 C under a kernel that sums in its
// accumulators starting from C (AMX's tiles load and store C once per K block): the tiles then
// load and store rows of one dense block that stays in cache rather than rows ldc apart (a
// page apart and more for wide C) — when the GEMM overwrites C, up to STAGE_B_MAX_BYTES of
// packed B; when it adds to C (beta 1), which must first be copied into the block, from
// STAGE_ADD_MIN_K_BLOCKS K blocks on and while all of K's B fits B_GROUP_BYTES. Measured on 2
// cores of an Intel Xeon with AMX against C itself with K's blocks in B groups: beta 0,
// 0.96-1.09x with one K block, 1.14-1.27x with two to four, 1.12-1.23x with 8-32 (B past the
// group); beta 1, 0.84-0.92x with one or two, 1.01-1.15x with three, 1.28x with four,
// 0.94-0.98x with 16 (B past the group). The sums are the same (C's values pass through the
// staging block exactly), so are the bits.
#define STAGE_B_MAX_BYTES ((size_t)32 << 20)
enum { STAGE_ADD_MIN_K_BLOCKS = 3 };

static int stages_c(const GemmProblem *p, size_t b_block, int k_blocks) {
    if (p->c_store == STORE_BF16) return 1;
    if (!p->kernel->micro_into || p->alpha != 1) return 0;
    size_t all_of_b = (size_t)k_blocks * b_block;
    if (p->beta == 0) return all_of_b <= STAGE_B_MAX_BYTES;
    return p->beta == 1 && k_blocks >= STAGE_ADD_MIN_K_BLOCKS && all_of_b <= B_GROUP_BYTES;
}

// The staging block (rows ld apart) <- C[ic:ic+mc, jc:jc+nc], an fp32 C that its first K block
// adds to (beta 1).
static void load_staged_block(const GemmProblem *p, int ic, int mc, int jc, int nc, real *staging, size_t ld) {
    for (int i = 0; i < mc; i++)
        memcpy(staging + (size_t)i * ld, (const real *)p->C + (size_t)(ic + i) * p->ldc + jc,
               (size_t)nc * sizeof(real));
}

// C[ic:ic+mc, jc:jc+nc] <- the staging block's fp32 sums (rows ld apart): as they are for an fp32
// C, each rounded as bf16_pack rounds for a bf16 one.
static void store_staged_block(const GemmProblem *p, int ic, int mc, int jc, int nc, const real *staging,
                               size_t ld) {
    for (int i = 0; i < mc; i++)
        cpu_store_run(storage_at(p->C, p->c_store, (size_t)(ic + i) * p->ldc + jc), p->c_store,
                      staging + (size_t)i * ld, (size_t)nc);
}

// The sub-problem C[m0:m1, n0:n1] of p (K > 0), on the calling thread only. Each element
// still takes its K blocks in order (gemm.h): only which C rows are visited between two
// K blocks changes. A staged C (stages_c) takes every K block of a block of rows in one pass
// (all of K's packed B at once), summed in the staging block and written to C after the last.
static void gemm_rect(const GemmProblem *p, int m0, int m1, int n0, int n1) {
    const GemmKernel *kern = p->kernel;
    int mb = MT_MIN(kern->mc, m1 - m0), nb = MT_MIN(NC, n1 - n0), kb = MT_MIN(KC, p->K);
    size_t lane_bytes = panel_depth(kern, kb) * kern->elem_bytes;
    size_t b_block = (size_t)ceil_div(nb, kern->nr) * kern->nr * lane_bytes;  // one K block of B
    int k_blocks = ceil_div(p->K, KC);
    int staged = stages_c(p, b_block, k_blocks);
    int group = staged ? k_blocks : (int)MT_MAX(1, MT_MIN((size_t)k_blocks, B_GROUP_BYTES / b_block));
    char *Ap = thread_scratch(SCRATCH_A_PANELS, (size_t)ceil_div(mb, kern->mr) * kern->mr * lane_bytes);
    char *Bp = thread_scratch(SCRATCH_B_PANELS, group * b_block);
    real *staging = staged ? thread_scratch(SCRATCH_STAGING, (size_t)mb * nb * sizeof(real)) : NULL;
    for (int jc = n0; jc < n1; jc += NC) {
        int nc = MT_MIN(NC, n1 - jc);
        for (int pg = 0; pg < p->K; pg += group * KC) {
            int pend = MT_MIN(p->K, pg + group * KC);
            for (int pc = pg; pc < pend; pc += KC)
                pack_b(p, pc, MT_MIN(KC, p->K - pc), jc, nc, Bp + (pc - pg) / KC * b_block);
            for (int ic = m0; ic < m1; ic += kern->mc) {
                int mc = MT_MIN(kern->mc, m1 - ic);
                real *c = staged ? staging : (real *)p->C + (size_t)ic * p->ldc + jc;
                size_t ldc = staged ? (size_t)nb : p->ldc;
                if (staged && p->beta != 0) load_staged_block(p, ic, mc, jc, nc, staging, ldc);
                for (int pc = pg; pc < pend; pc += KC) {
                    int kc = MT_MIN(KC, p->K - pc);
                    real beta = pc == 0 ? p->beta : (real)1;
                    pack_a(p, ic, mc, pc, kc, Ap);
                    macro_kernel(kern, mc, nc, kc, Ap, Bp + (pc - pg) / KC * b_block, c, ldc, p->alpha, beta);
                }
                if (staged) store_staged_block(p, ic, mc, jc, nc, staging, ldc);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Threading: split C into gm x gn rectangles of whole panels of the kernel's tile.
// ---------------------------------------------------------------------------
#ifdef _OPENMP

// Pick a grid gm x gn (gm * gn <= nth, gm <= mp, gn <= np) for p's mp row panels and np column
// panels: fewest tiles on the busiest thread, then least packing (each thread packs its rows of
// op(A) and its columns of op(B), weighted by the kernel's transposed_lane_cost).
static void choose_grid(const GemmProblem *p, int nth, int *gm, int *gn) {
    const GemmKernel *kern = p->kernel;
    int mp = ceil_div(p->M, kern->mr), np = ceil_div(p->N, kern->nr);
    double a_lane = p->a_ks == 1 ? 1 : kern->transposed_lane_cost;
    double b_lane = p->b_cs == 1 ? 1 : kern->transposed_lane_cost;
    double best = -1;
    *gm = *gn = 1;
    for (int used = nth; used >= 1; used--) {
        for (int a = 1; a <= used; a++) {
            if (used % a || a > mp || used / a > np) continue;
            int b = used / a;
            double tiles = (double)ceil_div(mp, a) * ceil_div(np, b);
            double packing = (double)ceil_div(mp, a) * kern->mr * a_lane + (double)ceil_div(np, b) * kern->nr * b_lane;
            double cost = tiles * (kern->mr * kern->nr / 16.0) + packing;  // ~cycles per k step
            if (best < 0 || cost < best) {
                best = cost;
                *gm = a;
                *gn = b;
            }
        }
    }
}

// Cell t (row-major) of a gm x gn grid over C: its rows [m0,m1) and columns [n0,n1).
static void gemm_grid_part(const GemmProblem *p, int gm, int gn, int t) {
    int mr = p->kernel->mr, nr = p->kernel->nr;
    int mp = ceil_div(p->M, mr), np = ceil_div(p->N, nr);
    int ti = t / gn, tj = t % gn;
    int m0 = (int)((long long)mp * ti / gm) * mr;
    int m1 = MT_MIN(p->M, (int)((long long)mp * (ti + 1) / gm) * mr);
    int n0 = (int)((long long)np * tj / gn) * nr;
    int n1 = MT_MIN(p->N, (int)((long long)np * (tj + 1) / gn) * nr);
    if (m0 < m1 && n0 < n1) gemm_rect(p, m0, m1, n0, n1);
}
#endif

// The whole problem (K > 0, alpha != 0), threaded when it is large enough.
static void gemm_portable(const GemmProblem *p) {
    double work = (double)p->M * p->N * p->K;
#ifdef _OPENMP
    if (work > PAR_MIN_WORK && omp_get_max_threads() > 1) {
#pragma omp parallel
        {
            // One cell per thread; handed out dynamically so that a thread the OS
            // has not scheduled yet does not hold its cell hostage.
            int gm, gn;
            choose_grid(p, omp_get_num_threads(), &gm, &gn);
#pragma omp for schedule(dynamic, 1)
            for (int cell = 0; cell < gm * gn; cell++) gemm_grid_part(p, gm, gn, cell);
        }
        return;
    }
#endif
    (void)work;
    gemm_rect(p, 0, p->M, 0, p->N);
}

#ifdef MT_HAVE_CBLAS
// The same problem through CBLAS (K > 0, alpha != 0, leading dims already checked).
static void gemm_blas(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A,
                      int lda, const real *B, int ldb, real beta, real *C, int ldc) {
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
#ifdef MT_DOUBLE
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}
#endif

// ---------------------------------------------------------------------------
// Kernels: fp32, the emulations of 16-bit inputs (fp32 panels rounded as they are packed,
// the fp32 micro-kernel), each on the portable tile or AVX-512's, and bf16 on AVX-512 BF16 and
// on AMX.
// ---------------------------------------------------------------------------
static void pack_fp32(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w, size_t s_k) {
    pack_block(dst, src, store, w, W, kc, s_w, s_k);
}

// Elements in the packed panels of a w x kc block (whole panels of W lanes).
static size_t packed_count(int w, int W, int kc) { return (size_t)ceil_div(w, W) * W * kc; }

// Panels already bf16 (a bf16-stored block) need no rounding to bf16.
static void pack_bf16_emulated(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                               size_t s_k) {
    pack_block(dst, src, store, w, W, kc, s_w, s_k);
    if (store != STORE_BF16) lowp_round_panel(dst, packed_count(w, W, kc), GEMM_INPUTS_BF16);
}

static void pack_fp16_emulated(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                               size_t s_k) {
    pack_block(dst, src, store, w, W, kc, s_w, s_k);
    lowp_round_panel(dst, packed_count(w, W, kc), GEMM_INPUTS_FP16);
}

static void pack_bf16_pairs_a(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                              size_t s_k) {
    lowp_pack_bf16_pairs(dst, src, store, w, W, kc, s_w, s_k, LOWP_PAD_A);
}

static void pack_bf16_pairs_b(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                              size_t s_k) {
    lowp_pack_bf16_pairs(dst, src, store, w, W, kc, s_w, s_k, LOWP_PAD_B);
}

#ifndef MT_DOUBLE
_Static_assert(FMA_MR == MR && FMA_NR == NR, "gemm_fma.h's AVX2 tile is the portable fp32 tile");
#endif

// Explicit fused multiply-adds where the CPU has them (the same bits in any build, as the
// AVX-512 tile's), else the GCC-vector kernel (a CPU without FMA, a double-precision build).
static void micro_fp32(int kc, const void *a, const void *b, real *acc) {
    if (fma_have_avx2()) fma_micro_avx2(kc, a, b, acc);
    else micro_kernel(kc, a, b, acc);
}

static void micro_fp32_flushed(int kc, const void *a, const void *b, real *acc) {
    lowp_micro_fma_flushed(kc, a, b, acc);
}

static void micro_fp32_avx512(int kc, const void *a, const void *b, real *acc) {
    fma_micro_avx512(kc, a, b, acc);
}

static void micro_fp32_avx512_flushed(int kc, const void *a, const void *b, real *acc) {
    lowp_micro_fma512_flushed(kc, a, b, acc);
}

static void micro_bf16_avx512(int kc, const void *a, const void *b, real *acc) {
    lowp_micro_avx512bf16(kc, a, b, acc);
}

static void pack_amx_a(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w, size_t s_k) {
    (void)W;  // always LOWP_AMX_TILE
    lowp_pack_amx_a(dst, src, store, w, kc, s_w, s_k);
}

static void pack_amx_b(void *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w, size_t s_k) {
    (void)W;
    lowp_pack_amx_b(dst, src, store, w, kc, s_w, s_k);
}

static void micro_amx(int kc, const void *a, const void *b, real *acc) {
    lowp_micro_amx(kc, a, b, acc, LOWP_AMX_TILE, 0);
}

static void micro_amx_into(int kc, const void *a, const void *b, real *C, size_t ldc, int accumulate) {
    lowp_micro_amx(kc, a, b, C, ldc, accumulate);
}

#define FMA512_MC (24 * FMA512_MR)  // 144 rows, as MC
#define AMX_MC (4 * LOWP_AMX_TILE)  // 128 rows: an A block of 128 x KC bf16 (64 KiB) in L2

static const GemmKernel KERNEL_FP32 = {
    .name = "portable fp32", .mr = MR, .nr = NR, .mc = MC, .elem_bytes = sizeof(real), .depth_align = 1,
    .transposed_lane_cost = 1, .pack_a = pack_fp32, .pack_b = pack_fp32, .micro = micro_fp32};
static const GemmKernel KERNEL_BF16_EMULATED = {
    .name = "bf16 emulated", .mr = MR, .nr = NR, .mc = MC, .elem_bytes = sizeof(real), .depth_align = 1,
    .transposed_lane_cost = 1, .pack_a = pack_bf16_emulated, .pack_b = pack_bf16_emulated,
    .micro = micro_fp32_flushed};
static const GemmKernel KERNEL_FP16_EMULATED = {
    .name = "fp16 emulated", .mr = MR, .nr = NR, .mc = MC, .elem_bytes = sizeof(real), .depth_align = 1,
    .transposed_lane_cost = 1, .pack_a = pack_fp16_emulated, .pack_b = pack_fp16_emulated, .micro = micro_fp32};
// The same three on AVX-512's wider tile (gemm_fma.h): the same bits.
static const GemmKernel KERNEL_FP32_AVX512 = {
    .name = "avx512 fp32", .mr = FMA512_MR, .nr = FMA512_NR, .mc = FMA512_MC, .elem_bytes = sizeof(real),
    .depth_align = 1, .transposed_lane_cost = 1, .pack_a = pack_fp32, .pack_b = pack_fp32,
    .micro = micro_fp32_avx512};
static const GemmKernel KERNEL_BF16_EMULATED_AVX512 = {
    .name = "bf16 emulated", .mr = FMA512_MR, .nr = FMA512_NR, .mc = FMA512_MC, .elem_bytes = sizeof(real),
    .depth_align = 1, .transposed_lane_cost = 1, .pack_a = pack_bf16_emulated, .pack_b = pack_bf16_emulated,
    .micro = micro_fp32_avx512_flushed};
static const GemmKernel KERNEL_FP16_EMULATED_AVX512 = {
    .name = "fp16 emulated", .mr = FMA512_MR, .nr = FMA512_NR, .mc = FMA512_MC, .elem_bytes = sizeof(real),
    .depth_align = 1, .transposed_lane_cost = 1, .pack_a = pack_fp16_emulated, .pack_b = pack_fp16_emulated,
    .micro = micro_fp32_avx512};
static const GemmKernel KERNEL_BF16_AVX512 = {
    .name = "bf16 avx512-bf16", .mr = LOWP_MR, .nr = LOWP_BF16_NR, .mc = MC, .elem_bytes = sizeof(uint16_t),
    .depth_align = 2, .transposed_lane_cost = 1, .pack_a = pack_bf16_pairs_a, .pack_b = pack_bf16_pairs_b,
    .micro = micro_bf16_avx512};
static const GemmKernel KERNEL_BF16_AMX = {
    .name = "bf16 amx", .mr = LOWP_AMX_TILE, .nr = LOWP_AMX_TILE, .mc = AMX_MC, .elem_bytes = sizeof(uint16_t),
    .depth_align = LOWP_AMX_DEPTH, .transposed_lane_cost = 2, .pack_a = pack_amx_a, .pack_b = pack_amx_b,
    .micro = micro_amx, .micro_into = micro_amx_into};

// The inputs' rounding and its kernels: process-wide, set between GEMMs by the thread that
// runs them.
static GemmInputs g_inputs = GEMM_INPUTS_FP32;
static const char *g_bf16_kernel_wanted;  // mt_gemm_use_bf16_kernel's, else NULL
static const char *g_fp32_kernel_wanted;  // mt_gemm_use_fp32_kernel's, else NULL
static int g_fp32_wide = -1;              // fp32_wide_choice's, made on first use
// The bf16 kernel of each orientation [trans_a][trans_b] (choose_bf16_kernels), made on first use.
static const GemmKernel *g_bf16_kernels[2][2];
static int g_bf16_chosen;

// The fp32 tile (of fp32 inputs and of the 16-bit emulations): AVX-512's where the CPU has it,
// else the portable one; MOETRON_GEMM_FP32 (avx512, portable) asks for one. Returns whether
// it is AVX-512's.
static int fp32_wide_choice(void) {
    const char *env = getenv("MOETRON_GEMM_FP32");
    const char *want = g_fp32_kernel_wanted ? g_fp32_kernel_wanted : env && env[0] ? env : "avx512";
    if (strcmp(want, "avx512") && strcmp(want, "portable"))
        mt_die("MOETRON_GEMM_FP32=%s: use avx512 or portable (or unset it)", want);
    return !strcmp(want, "avx512") && fma_have_avx512();
}

static void gemm_portable(const GemmProblem *p);
static int gemm_prepare(GemmProblem *p, const GemmKernel *kern, int trans_a, int trans_b, int M, int N, int K,
                        real alpha, const void *A, Storage a_store, int lda, const void *B, Storage b_store, int ldb,
                        real beta, void *C, Storage c_store, int ldc);

// The problem that stands for an orientation's GEMMs when two kernels are measured against
// each other: a block of a layer's shape, two K blocks deep, fp32 operands.
enum { MEASURED_M = 256, MEASURED_N = 256, MEASURED_K = 2 * KC, MEASURED_RUNS = 3 };

// Of two kernels that give the same bits, the one that runs op(A)[M,K] op(B)[K,N] of this
// orientation faster on this machine, on the threads GEMMs get: each run once to warm up,
// then MEASURED_RUNS times, the two alternately; the best times compared.
static const GemmKernel *faster_kernel(const GemmKernel *first, const GemmKernel *second, int trans_a, int trans_b) {
    size_t operand = (size_t)MEASURED_K * MT_MAX(MEASURED_M, MEASURED_N);
    real *A = mt_malloc(operand * sizeof(real)), *B = mt_malloc(operand * sizeof(real));
    real *C = mt_malloc((size_t)MEASURED_M * MEASURED_N * sizeof(real));
    for (size_t i = 0; i < operand; i++) {  // normal values of mixed signs: the kernels' usual work
        A[i] = (real)((int)(i % 251) - 125) / 128;
        B[i] = (real)((int)(i % 241) - 120) / 64;
    }
    const GemmKernel *kernels[2] = {first, second};
    double best[2] = {1e30, 1e30};
    for (int run = -1; run < MEASURED_RUNS; run++)  // run -1: the warm-up
        for (int k = 0; k < 2; k++) {
            GemmProblem p;
            gemm_prepare(&p, kernels[k], trans_a, trans_b, MEASURED_M, MEASURED_N, MEASURED_K, 1, A, STORE_FP32,
                         trans_a ? MEASURED_M : MEASURED_K, B, STORE_FP32, trans_b ? MEASURED_K : MEASURED_N, 0, C,
                         STORE_FP32, MEASURED_N);
            double start = now_seconds();
            gemm_portable(&p);
            if (run >= 0) best[k] = MT_MIN(best[k], now_seconds() - start);
        }
    free(A), free(B), free(C);
    return best[0] <= best[1] ? first : second;
}

// bf16: AMX where the CPU has it; else, for each orientation, the faster of AVX-512 BF16 and
// the emulation (the same bits) where the CPU has AVX-512 BF16 (faster_kernel), else the
// emulation. MOETRON_GEMM_BF16 asks for amx (the default), portable (the measured choice,
// never AMX: the bits of every CPU), avx512-bf16 or emulated (those falling back the same way
// when missing).
static void choose_bf16_kernels(void) {
    const char *env = getenv("MOETRON_GEMM_BF16");
    const char *want = g_bf16_kernel_wanted ? g_bf16_kernel_wanted : env && env[0] ? env : "amx";
    if (strcmp(want, "amx") && strcmp(want, "portable") && strcmp(want, "avx512-bf16") && strcmp(want, "emulated"))
        mt_die("MOETRON_GEMM_BF16=%s: use amx, portable, avx512-bf16 or emulated (or unset it)", want);
    const GemmKernel *emulated = g_fp32_wide ? &KERNEL_BF16_EMULATED_AVX512 : &KERNEL_BF16_EMULATED;
    const GemmKernel *only = NULL;  // the kernel of every orientation, when nothing is measured
    if (!strcmp(want, "amx") && lowp_have_amx()) only = &KERNEL_BF16_AMX;
    else if (!strcmp(want, "emulated") || !lowp_have_avx512bf16()) only = emulated;
    else if (!strcmp(want, "avx512-bf16")) only = &KERNEL_BF16_AVX512;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            g_bf16_kernels[ta][tb] = only ? only : faster_kernel(&KERNEL_BF16_AVX512, emulated, ta, tb);
    g_bf16_chosen = 1;
}

static const GemmKernel *kernel_for(GemmInputs inputs, int trans_a, int trans_b) {
    if (g_fp32_wide < 0) g_fp32_wide = fp32_wide_choice();
    if (inputs == GEMM_INPUTS_FP16) return g_fp32_wide ? &KERNEL_FP16_EMULATED_AVX512 : &KERNEL_FP16_EMULATED;
    if (inputs == GEMM_INPUTS_FP32) return g_fp32_wide ? &KERNEL_FP32_AVX512 : &KERNEL_FP32;
    if (!g_bf16_chosen) choose_bf16_kernels();
    return g_bf16_kernels[trans_a != 0][trans_b != 0];
}

void mt_gemm_set_inputs(GemmInputs inputs) {
#ifdef MT_DOUBLE
    if (inputs != GEMM_INPUTS_FP32) mt_die("internal error: 16-bit GEMM inputs in a double-precision build");
#endif
    g_inputs = inputs;
    kernel_for(inputs, 0, 0);  // the choice made now, between GEMMs
}

GemmInputs mt_gemm_inputs(void) { return g_inputs; }

void mt_gemm_use_bf16_kernel(const char *name) {
    g_bf16_kernel_wanted = name;
    g_bf16_chosen = 0;
    kernel_for(g_inputs, 0, 0);
}

void mt_gemm_use_fp32_kernel(const char *name) {
    g_fp32_kernel_wanted = name;
    g_fp32_wide = -1;
    g_bf16_chosen = 0;
    kernel_for(g_inputs, 0, 0);
}

static const GemmKernel *current_kernel(int trans_a, int trans_b) { return kernel_for(g_inputs, trans_a, trans_b); }

// Whether kern takes fp32 inputs as they are (the portable tile or AVX-512's).
static int is_fp32_kernel(const GemmKernel *kern) { return kern == &KERNEL_FP32 || kern == &KERNEL_FP32_AVX512; }

// "bf16 NN emulated, NT avx512-bf16, TN ..., TT ...": the bf16 kernels when the orientations'
// differ.
static const char *bf16_kernels_name(void) {
    static char name[128];
    const char *prefix = "bf16 ";  // of each bf16 kernel's name
    size_t skip = strlen(prefix), used = (size_t)snprintf(name, sizeof name, "%s", prefix);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            used += (size_t)snprintf(name + used, sizeof name - used, "%s%c%c %s", ta + tb ? ", " : "", "NT"[ta],
                                     "NT"[tb], kernel_for(GEMM_INPUTS_BF16, ta, tb)->name + skip);
    return name;
}

const char *mt_gemm_kernel(void) {
    const GemmKernel *kern = current_kernel(0, 0);
    if (is_fp32_kernel(kern) && backend_get() == BACKEND_BLAS) return "openblas fp32";
    if (g_inputs == GEMM_INPUTS_BF16)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                if (current_kernel(ta, tb) != kern) return bf16_kernels_name();
    return kern->name;
}

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

// Whether kern's GEMMs on operands stored as a_store, b_store go to OpenBLAS (fp32 operands
// and inputs when it is the backend).
static int uses_blas(const GemmKernel *kern, Storage a_store, Storage b_store, Storage c_store) {
#ifdef MT_HAVE_CBLAS
    return is_fp32_kernel(kern) && a_store == STORE_FP32 && b_store == STORE_FP32 && c_store == STORE_FP32 &&
           backend_get() == BACKEND_BLAS;
#else
    (void)kern, (void)a_store, (void)b_store, (void)c_store;
    return 0;
#endif
}

// C[M,N] stored as c_store = beta * C (gemm.h: a bf16 C has beta 0: zeros).
static void scale_c_stored(int M, int N, real beta, void *C, Storage c_store, size_t ldc) {
    if (c_store == STORE_FP32) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++) memset((uint16_t *)C + (size_t)i * ldc, 0, (size_t)N * sizeof(uint16_t));
}

// C = alpha op(A) op(B) + beta C: the cases with nothing to multiply (M or N 0: nothing; K 0
// or alpha 0: C = beta·C) done here (returns 0), else *p is the problem for kern (returns 1).
static int gemm_prepare(GemmProblem *p, const GemmKernel *kern, int trans_a, int trans_b, int M, int N, int K,
                        real alpha, const void *A, Storage a_store, int lda, const void *B, Storage b_store, int ldb,
                        real beta, void *C, Storage c_store, int ldc) {
    MT_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return 0;
    MT_ASSERT(ldc >= N);
    MT_ASSERT(c_store == STORE_FP32 || (beta == 0 && ldc == N));
    if (K == 0 || alpha == 0) {
        scale_c_stored(M, N, beta, C, c_store, (size_t)ldc);
        return 0;
    }
    MT_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N));
    *p = (GemmProblem){
        .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
        .A = A, .a_store = a_store, .a_rs = trans_a ? 1 : (size_t)lda, .a_ks = trans_a ? (size_t)lda : 1,
        .B = B, .b_store = b_store, .b_ks = trans_b ? 1 : (size_t)ldb, .b_cs = trans_b ? (size_t)ldb : 1,
        .C = C, .c_store = c_store, .ldc = (size_t)ldc, .kernel = kern,
    };
    return 1;
}

// C = alpha op(A) op(B) + beta C with kern's tiles (OpenBLAS for fp32 when it is chosen).
static void gemm_with(const GemmKernel *kern, int trans_a, int trans_b, int M, int N, int K, real alpha,
                      const void *A, Storage a_store, int lda, const void *B, Storage b_store, int ldb, real beta,
                      void *C, Storage c_store, int ldc) {
    PROF_SCOPE(PROF_GEMM);
    GemmProblem p;
    if (!gemm_prepare(&p, kern, trans_a, trans_b, M, N, K, alpha, A, a_store, lda, B, b_store, ldb, beta, C, c_store,
                      ldc))
        return;
#ifdef MT_HAVE_CBLAS
    if (uses_blas(kern, a_store, b_store, c_store)) {
        gemm_blas(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    gemm_portable(&p);
}

void cpu_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda,
             const real *B, int ldb, real beta, real *C, int ldc) {
    gemm_with(current_kernel(trans_a, trans_b), trans_a, trans_b, M, N, K, alpha, A, STORE_FP32, lda, B, STORE_FP32,
              ldb, beta, C, STORE_FP32, ldc);
}

void cpu_gemm_stored(int trans_a, int trans_b, int M, int N, int K, real alpha, const void *A, Storage a_store, int lda,
                     const void *B, Storage b_store, int ldb, real beta, void *C, Storage c_store, int ldc) {
    gemm_with(current_kernel(trans_a, trans_b), trans_a, trans_b, M, N, K, alpha, A, a_store, lda, B, b_store, ldb,
              beta, C, c_store, ldc);
}

// ---------------------------------------------------------------------------
// Grouped GEMMs: the groups' problems on all threads at once, in one parallel region. Each
// problem is cut into rectangles of whole panels (cells), more of them for the larger
// problems, about CELLS_PER_THREAD cells a thread over the whole call; the cells are handed
// out largest first, so no thread waits at a barrier between groups while another finishes
// a large one. Every element is still summed by one thread with the kernel's arithmetic
// wherever its tile lies, so the result is that of the groups one by one.
// ---------------------------------------------------------------------------
enum { CELLS_PER_THREAD = 4 };

static double problem_work(const GemmProblem *p) { return (double)p->M * p->N * p->K; }

#ifdef _OPENMP
typedef struct {
    const GemmProblem *p;
    int gm, gn, t;  // cell t of p's gm x gn grid
    double work;
} GemmCell;

static int larger_cell_first(const void *x, const void *y) {
    const GemmCell *a = x, *b = y;
    if (a->work != b->work) return a->work < b->work ? 1 : -1;
    if (a->p != b->p) return a->p < b->p ? -1 : 1;  // problems of one array: their order
    return a->t - b->t;
}

// The cells of count problems over nth threads, largest first; returns how many.
static int cut_cells(GemmCell *cells, const GemmProblem *probs, int count, int nth) {
    double total = 0;
    for (int i = 0; i < count; i++) total += problem_work(&probs[i]);
    double unit = total / (CELLS_PER_THREAD * nth);  // the work of a cell, roughly
    int n = 0;
    for (int i = 0; i < count; i++) {
        const GemmProblem *p = &probs[i];
        int parts = (int)MT_MAX(1, MT_MIN(nth, problem_work(p) / unit + 0.5)), gm, gn;
        choose_grid(p, parts, &gm, &gn);
        for (int t = 0; t < gm * gn; t++) cells[n++] = (GemmCell){p, gm, gn, t, problem_work(p) / (gm * gn)};
    }
    qsort(cells, (size_t)n, sizeof *cells, larger_cell_first);
    return n;
}
#endif

static void gemm_problems(const GemmProblem *probs, int count) {
    double total = 0;
    for (int i = 0; i < count; i++) total += problem_work(&probs[i]);
#ifdef _OPENMP
    int nth = omp_get_max_threads();
    if (total > PAR_MIN_WORK && nth > 1) {
        GemmCell *cells = mt_malloc((size_t)count * nth * sizeof *cells);
        int n = cut_cells(cells, probs, count, nth);
#pragma omp parallel for schedule(dynamic, 1)
        for (int c = 0; c < n; c++) gemm_grid_part(cells[c].p, cells[c].gm, cells[c].gn, cells[c].t);
        free(cells);
        return;
    }
#endif
    for (int i = 0; i < count; i++) gemm_rect(&probs[i], 0, probs[i].M, 0, probs[i].N);
}

// The groups' problems (groups with rows and something to multiply), run together; or,
// when OpenBLAS runs fp32, one by one through it.
typedef struct {
    GemmProblem *probs;
    int count;
} GroupedRun;

static void grouped_add(GroupedRun *run, int trans_a, int trans_b, int M, int N, int K, real alpha, const void *A,
                        Storage a_store, int lda, const void *B, Storage b_store, int ldb, real beta, void *C,
                        Storage c_store, int ldc) {
    const GemmKernel *kern = current_kernel(trans_a, trans_b);
    if (uses_blas(kern, a_store, b_store, c_store)) {
        gemm_with(kern, trans_a, trans_b, M, N, K, alpha, A, a_store, lda, B, b_store, ldb, beta, C, c_store, ldc);
        return;
    }
    if (gemm_prepare(&run->probs[run->count], kern, trans_a, trans_b, M, N, K, alpha, A, a_store, lda, B,
                     b_store, ldb, beta, C, c_store, ldc))
        run->count++;
}

static void grouped_finish(GroupedRun *run) {
    gemm_problems(run->probs, run->count);
    free(run->probs);
}

// host_counts is not needed here: the cpu reads counts itself.
void cpu_gemm_grouped(int trans_a, int trans_b, int groups, const int32_t *counts, const int32_t *host_counts, int N,
                      int K, real alpha, const void *A, Storage a_store, int lda, const real *B, size_t b_stride,
                      int ldb, real beta, void *C, Storage c_store, int ldc) {
    PROF_SCOPE(PROF_GEMM);
    GroupedRun run = {mt_malloc((size_t)MT_MAX(groups, 1) * sizeof(GemmProblem)), 0};
    size_t first = 0;  // the group's first row
    for (int g = 0; g < groups; g++) {
        int rows = counts[g];
        MT_ASSERT(rows >= 0);
        if (rows > 0)
            grouped_add(&run, trans_a, trans_b, rows, N, K, alpha,
                        storage_at_const(A, a_store, first * (trans_a ? 1 : (size_t)lda)), a_store, lda,
                        B + (size_t)g * b_stride, STORE_FP32, ldb, beta, storage_at(C, c_store, first * ldc), c_store,
                        ldc);
        first += (size_t)rows;
    }
    grouped_finish(&run);
}

void cpu_gemm_grouped_wgrad(int groups, const int32_t *counts, const int32_t *host_counts, int out, int in,
                            real alpha, const void *dY, Storage dy_store, const void *X, Storage x_store, real *W,
                            size_t w_stride) {
    PROF_SCOPE(PROF_GEMM);
    GroupedRun run = {mt_malloc((size_t)MT_MAX(groups, 1) * sizeof(GemmProblem)), 0};
    size_t first = 0;
    for (int g = 0; g < groups; g++) {
        int rows = counts[g];
        MT_ASSERT(rows >= 0);
        // W_g[out, in] += alpha * (dY_g[rows, out])^T · X_g[rows, in]
        if (rows > 0)
            grouped_add(&run, 1, 0, out, in, rows, alpha, storage_at_const(dY, dy_store, first * out), dy_store, out,
                        storage_at_const(X, x_store, first * in), x_store, in, (real)1, W + (size_t)g * w_stride,
                        STORE_FP32, in);
        first += (size_t)rows;
    }
    grouped_finish(&run);
}
