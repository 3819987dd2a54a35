// gemm_lowp.c — rounding, packing and the AVX-512 BF16 micro-kernel of the cpu GEMM's
// 16-bit-input modes (gemm_lowp.h). The emulation (lowp_round_panel + explicit fused
// multiply-adds under flush-to-zero, lowp_micro_fma_flushed) and the hardware kernel give
// the same bits, at any optimisation level: VDPBF16PS adds
// each of its two products to the lane with one rounding, high half first, flushing
// subnormals, which is a fused multiply-add per product under flush-to-zero (checked
// against the instruction by tests/unit/test_gemm_lowp.c wherever the CPU has it).
#include "ops/cpu/gemm_lowp.h"

#include <math.h>
#include <string.h>

#include "core/float_formats.h"
#include "ops/cpu/gemm_fma.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOWP_X86 1
#else
#define LOWP_X86 0
#endif

enum {
    F32_EXPONENT = 0x7F800000u,
    MXCSR_FLUSH_TO_ZERO = 0x8000u,    // subnormal results become ±0
    MXCSR_DENORMALS_ARE_ZERO = 0x0040u,  // subnormal operands read as ±0
};

// bf16_from_float_flushed(v) widened back to a float's bits, without branches (so that the loop over a
// panel vectorizes): ±0 for a subnormal, NaN kept quiet, else nearest even.
static inline uint32_t bf16_flushed_bits(uint32_t b) {
    uint32_t magnitude = b & ~F32_SIGN;
    uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1)) & 0xFFFF0000u;
    uint32_t nan = (b | 0x00400000u) & 0xFFFF0000u;
    uint32_t out = magnitude > F32_INF ? nan : rounded;
    return (b & F32_EXPONENT) == 0 ? b & F32_SIGN : out;
}

// f16_to_float(f16_from_float(v))'s bits, without branches: the mantissa rounded to 10 bits
// (nearest even; from 65520 up infinity), half subnormals to a multiple of 2^-24 by the float
// addition, NaN the quiet one. Equal for all 2^32 inputs (checked once, exhaustively).
static inline uint32_t f16_rounded_bits(uint32_t b) {
    enum { F16_MIN_NORMAL = 0x38800000u, F16_OVERFLOW = 0x47800000u, QUIET_NAN = 0x7FC00000u };
    uint32_t sign = b & F32_SIGN, a = b & ~F32_SIGN;
    uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1)) & ~0x1FFFu;
    normal = normal >= F16_OVERFLOW ? F32_INF : normal;
    uint32_t subnormal = float_bits((bits_float(a) + 0.5f) - 0.5f);
    uint32_t out = a < F16_MIN_NORMAL ? subnormal : normal;
    return sign | (a > F32_INF ? QUIET_NAN : out);
}

// lowp_bf16_round_run one element at a time (a CPU without AVX-512 BF16).
static void bf16_round_run_scalar(uint16_t *dst, const real *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_from_float_flushed((float)src[i]);
}

void lowp_round_panel(real *x, size_t n, GemmInputs inputs) {
#ifndef MT_DOUBLE
    if (inputs == GEMM_INPUTS_BF16) {
        for (size_t i = 0; i < n; i++) x[i] = bits_float(bf16_flushed_bits(float_bits(x[i])));
        return;
    }
    if (inputs == GEMM_INPUTS_FP16) {
        for (size_t i = 0; i < n; i++) x[i] = bits_float(f16_rounded_bits(float_bits(x[i])));
        return;
    }
#endif
    if (inputs == GEMM_INPUTS_BF16)
        for (size_t i = 0; i < n; i++) x[i] = (real)bf16_to_float(bf16_from_float_flushed((float)x[i]));
    else if (inputs == GEMM_INPUTS_FP16)
        for (size_t i = 0; i < n; i++) x[i] = (real)f16_to_float(f16_from_float((float)x[i]));
}

// Element `at` of src (stored as `store`) as packed bf16: fp32 rounded, bf16 as it is.
static inline uint16_t packed_element(const void *src, Storage store, size_t at) {
    if (store == STORE_BF16) return ((const uint16_t *)src)[at];
    return bf16_from_float_flushed((float)((const real *)src)[at]);
}

// One lane's pair at depth 2q (the lane's first element at `lane` of src): the 2q element high,
// 2q+1 low (`pad` past kc).
static inline void pack_pair(uint16_t *pair, const void *src, Storage store, size_t lane, int k, int kc, size_t s_k,
                             uint16_t pad) {
    pair[1] = packed_element(src, store, lane + (size_t)k * s_k);
    pair[0] = k + 1 < kc ? packed_element(src, store, lane + (size_t)(k + 1) * s_k) : pad;
}

static void pack_pairs_scalar(uint16_t *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                              size_t s_k, uint16_t pad) {
    int pairs = lowp_pairs(kc);
    for (int j0 = 0; j0 < w; j0 += W) {  // one panel of W lanes
        uint16_t *panel = dst + (size_t)j0 * pairs * 2;
        int lanes = MT_MIN(W, w - j0);
        for (int q = 0; q < pairs; q++) {
            uint16_t *row = panel + (size_t)q * W * 2;
            for (int j = 0; j < lanes; j++)
                pack_pair(row + 2 * j, src, store, (size_t)(j0 + j) * s_w, 2 * q, kc, s_k, pad);
            for (int j = lanes; j < W; j++) row[2 * j] = row[2 * j + 1] = 0;
        }
    }
}

#if LOWP_X86 && !defined(MT_DOUBLE)
int lowp_have_avx512bf16(void) {
    static int known = -1;  // asked once; racing first calls compute the same
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512bf16");
    }
    return known;
}

// The vector packers convert with VCVTNE2PS2BF16, which rounds exactly as bf16_from_float_flushed does
// (subnormals to ±0, nearest even, NaN kept quiet: checked over random bit patterns), so
// they write the scalar packers' bytes.
#define PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// The first n <= 32 floats at src (the rest zero), as 32 bf16.
PACK_TARGET static inline __m512i bf16x32(const real *src, int n) {
    __mmask16 lo = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1);
    __mmask16 hi = (__mmask16)(n >= 32 ? 0xFFFF : n > 16 ? (1u << (n - 16)) - 1 : 0);
    __m512 a = _mm512_maskz_loadu_ps(lo, src), b = _mm512_maskz_loadu_ps(hi, src + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}

// The n <= 32 elements from element `at` of src (stored as `store`; the rest zero), as 32 bf16.
PACK_TARGET static inline __m512i bf16x32_at(const void *src, Storage store, size_t at, int n) {
    if (store == STORE_FP32) return bf16x32((const real *)src + at, n);
    __mmask32 mask = (__mmask32)(n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1);
    return _mm512_maskz_loadu_epi16(mask, (const uint16_t *)src + at);
}

PACK_TARGET static void bf16_round_run_avx512(uint16_t *dst, const real *src, size_t n) {
    enum { RUN = 32 };
    size_t i = 0;
    for (; i + RUN <= n; i += RUN) _mm512_storeu_si512((void *)(dst + i), bf16x32(src + i, RUN));
    if (i < n) _mm512_mask_storeu_epi16(dst + i, (__mmask32)((1u << (n - i)) - 1), bf16x32(src + i, (int)(n - i)));
}

void lowp_bf16_round_run(uint16_t *dst, const real *src, size_t n) {
    if (lowp_have_avx512bf16()) bf16_round_run_avx512(dst, src, n);
    else bf16_round_run_scalar(dst, src, n);
}

// Pair panels whose lanes run along k in memory (s_k == 1): 32 depths of a lane converted at
// once, each pair's halves swapped (depth 2q high), written down the lane's column of pairs.
PACK_TARGET static void pack_pairs_rows(uint16_t *dst, const void *src, Storage store, int w, int W, int kc,
                                        size_t s_w, uint16_t pad) {
    enum { CHUNK = 32 };
    int pairs = lowp_pairs(kc);
    _Alignas(64) uint32_t chunk[CHUNK / 2];
    for (int j0 = 0; j0 < w; j0 += W) {
        uint32_t *panel = (uint32_t *)(dst + (size_t)j0 * pairs * 2);  // pair q of lane j at [q*W + j]
        for (int j = 0; j < W; j++) {
            if (j0 + j >= w) {
                for (int q = 0; q < pairs; q++) panel[(size_t)q * W + j] = 0;
                continue;
            }
            size_t lane = (size_t)(j0 + j) * s_w;
            for (int k0 = 0; k0 < kc; k0 += CHUNK) {
                int n = MT_MIN(CHUNK, kc - k0);
                _mm512_store_si512((void *)chunk, _mm512_rol_epi32(bf16x32_at(src, store, lane + k0, n), 16));
                for (int q = 0; q < (n + 1) / 2; q++) panel[(size_t)(k0 / 2 + q) * W + j] = chunk[q];
            }
            if (kc % 2) {  // the last pair's low half is past kc: the padding
                uint32_t *last = &panel[(size_t)(pairs - 1) * W + j];
                *last = (*last & 0xFFFF0000u) | pad;
            }
        }
    }
}

// Pair panels of W lanes contiguous at each depth (s_w == 1): per vector of LOWP_NR lanes,
// two depths' rows converted together and interleaved into pairs (the earlier depth high),
// stored as one vector when W is a multiple of LOWP_NR, else pair by pair into the panels
// the lanes fall in (A's panels of LOWP_MR lanes).
// Depths k (lanes 0-15 of the result) and k + 1 (16-31) of the `lanes` (mask) lanes from j0 of a
// source contiguous along the lanes (stored as `store`), as bf16; depth k + 1 is `pad` (in the
// lanes) past kc.
PACK_TARGET static inline __m512i two_depths(const void *src, Storage store, int k, int kc, size_t s_k, int j0,
                                             __mmask16 lanes, uint16_t pad) {
    size_t at = (size_t)k * s_k + j0, next = at + s_k;
    if (store == STORE_BF16) {
        const uint16_t *x = src;
        __m512i earlier = _mm512_maskz_loadu_epi16((__mmask32)lanes, x + at);  // 16 lanes in the low half
        __m512i later = k + 1 < kc ? _mm512_maskz_loadu_epi16((__mmask32)lanes, x + next)
                                   : _mm512_maskz_mov_epi16((__mmask32)lanes, _mm512_set1_epi16((short)pad));
        return _mm512_inserti64x4(earlier, _mm512_castsi512_si256(later), 1);
    }
    const real *x = src;
    __m512 earlier = _mm512_maskz_loadu_ps(lanes, x + at);
    __m512 later = k + 1 < kc ? _mm512_maskz_loadu_ps(lanes, x + next)
                              : _mm512_maskz_mov_ps(lanes, _mm512_set1_ps(bits_float((uint32_t)pad << 16)));
    return (__m512i)_mm512_cvtne2ps_pbh(later, earlier);
}

PACK_TARGET static void pack_pairs_columns(uint16_t *dst, const void *src, Storage store, int w, int W, int kc,
                                           size_t s_k, uint16_t pad) {
    int pairs = lowp_pairs(kc), whole = W % LOWP_NR == 0;
    uint32_t *out = (uint32_t *)dst;  // pair q of lane j at [(j / W) * pairs * W + q * W + j % W]
    // output halfword 2i takes the later depth's lane i (input 16 + i), 2i + 1 the earlier's (i)
    __m512i swap = _mm512_set_epi16(15, 31, 14, 30, 13, 29, 12, 28, 11, 27, 10, 26, 9, 25, 8, 24, 7, 23, 6, 22, 5, 21,
                                    4, 20, 3, 19, 2, 18, 1, 17, 0, 16);
    _Alignas(64) uint32_t chunk[LOWP_NR];
    int padded_w = (w + W - 1) / W * W;  // lanes up to the last panel's end: zeros past w
    // depth pairs outer: each pass reads two whole rows of the block (contiguous), not one
    // line of each of the block's rows
    for (int q = 0; q < pairs; q++) {
        int k = 2 * q;
        for (int j0 = 0; j0 < padded_w; j0 += LOWP_NR) {  // one vector of lanes
            int left = MT_MAX(w - j0, 0), count = MT_MIN(LOWP_NR, padded_w - j0);
            __mmask16 lanes = (__mmask16)(left >= LOWP_NR ? 0xFFFF : (1u << left) - 1);
            __m512i both = _mm512_permutexvar_epi16(swap, two_depths(src, store, k, kc, s_k, j0, lanes, pad));
            if (whole) {
                _mm512_store_si512((void *)(out + (size_t)(j0 / W) * pairs * W + (size_t)q * W + j0 % W), both);
                continue;
            }
            _mm512_store_si512((void *)chunk, both);
            for (int i = 0; i < count; i++) {
                int j = j0 + i;
                out[(size_t)(j / W) * pairs * W + (size_t)q * W + j % W] = chunk[i];
            }
        }
    }
}

void lowp_pack_bf16_pairs(uint16_t *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                          size_t s_k, uint16_t pad) {
    if (lowp_have_avx512bf16() && s_k == 1) pack_pairs_rows(dst, src, store, w, W, kc, s_w, pad);
    else if (lowp_have_avx512bf16() && s_w == 1) pack_pairs_columns(dst, src, store, w, W, kc, s_k, pad);
    else pack_pairs_scalar(dst, src, store, w, W, kc, s_w, s_k, pad);
}

// Six rows of two 16-column vectors each: per pair of depths two loads of b, six broadcasts
// of a's pairs, twelve dot products into independent accumulators.
__attribute__((target("avx512f,avx512bf16"))) void lowp_micro_avx512bf16(int kc, const uint16_t *a,
                                                                         const uint16_t *b, real *acc) {
    __m512 c[LOWP_MR][2];
    for (int i = 0; i < LOWP_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    int pairs = lowp_pairs(kc);
    for (int q = 0; q < pairs; q++) {
        const uint16_t *bq = b + (size_t)q * LOWP_BF16_NR * 2;
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bq);
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bq + LOWP_NR * 2));
        const uint16_t *aq = a + (size_t)q * LOWP_MR * 2;
        for (int i = 0; i < LOWP_MR; i++) {
            int32_t pair;
            memcpy(&pair, aq + 2 * i, sizeof pair);
            __m512bh ai = (__m512bh)_mm512_set1_epi32(pair);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, b1);
        }
    }
    for (int i = 0; i < LOWP_MR; i++) {
        _mm512_store_ps(acc + i * LOWP_BF16_NR, c[i][0]);
        _mm512_store_ps(acc + i * LOWP_BF16_NR + LOWP_NR, c[i][1]);
    }
}
#else
int lowp_have_avx512bf16(void) { return 0; }

void lowp_bf16_round_run(uint16_t *dst, const real *src, size_t n) { bf16_round_run_scalar(dst, src, n); }

void lowp_pack_bf16_pairs(uint16_t *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                          size_t s_k, uint16_t pad) {
    pack_pairs_scalar(dst, src, store, w, W, kc, s_w, s_k, pad);
}

void lowp_micro_avx512bf16(int kc, const uint16_t *a, const uint16_t *b, real *acc) {
    (void)kc, (void)a, (void)b, (void)acc;
    mt_die("internal error: the AVX-512 BF16 GEMM kernel called on a CPU or build without it (please report)");
}
#endif

#ifdef MT_DOUBLE
#define real_fma fma
#else
#define real_fma fmaf
#endif

static void micro_fma_scalar(int kc, const real *a, const real *b, real *acc) {
    real c[LOWP_MR * LOWP_NR] = {0};
    for (int k = 0; k < kc; k++, a += LOWP_MR, b += LOWP_NR)
        for (int i = 0; i < LOWP_MR; i++)
            for (int j = 0; j < LOWP_NR; j++) c[i * LOWP_NR + j] = real_fma(a[i], b[j], c[i * LOWP_NR + j]);
    memcpy(acc, c, sizeof c);
}

// Flush-to-zero and denormals-are-zero on (returns the mode to restore), where the CPU has them.
static unsigned flush_begin(void) {
#if LOWP_X86
    unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | MXCSR_FLUSH_TO_ZERO | MXCSR_DENORMALS_ARE_ZERO);
    return saved;
#else
    return 0;
#endif
}

static void flush_end(unsigned saved) {
#if LOWP_X86
    _mm_setcsr(saved);
#else
    (void)saved;
#endif
}

void lowp_micro_fma_flushed(int kc, const real *a, const real *b, real *acc) {
    unsigned saved = flush_begin();
    if (fma_have_avx2()) fma_micro_avx2(kc, a, b, acc);
    else micro_fma_scalar(kc, a, b, acc);
    flush_end(saved);
}

void lowp_micro_fma512_flushed(int kc, const real *a, const real *b, real *acc) {
    unsigned saved = flush_begin();
    fma_micro_avx512(kc, a, b, acc);
    flush_end(saved);
}

// ---- AMX-BF16 -------------------------------------------------------------------------------

enum {
    AMX_HALF = LOWP_AMX_TILE / 2,         // rows (or columns) of one hardware tile: 16
    AMX_ROW_BYTES = 64,                   // bytes of a tile row
    AMX_STEP_ELEMS = LOWP_AMX_TILE * LOWP_AMX_DEPTH,  // bf16 of one step of a panel
};

static int ceil_steps(int kc) { return (kc + LOWP_AMX_DEPTH - 1) / LOWP_AMX_DEPTH; }

// src element (lane j, depth k; src stored as `store`) as packed bf16, zero outside w x kc.
static inline uint16_t amx_element(const void *src, Storage store, int j, int k, int w, int kc, size_t s_w,
                                   size_t s_k) {
    return j < w && k < kc ? packed_element(src, store, (size_t)j * s_w + (size_t)k * s_k) : 0;
}

static void pack_amx_a_scalar(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    int steps = ceil_steps(kc);
    for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE)
        for (int s = 0; s < steps; s++) {
            uint16_t *step = dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS;
            for (int j = 0; j < LOWP_AMX_TILE; j++)
                for (int d = 0; d < LOWP_AMX_DEPTH; d++)
                    step[j * LOWP_AMX_DEPTH + d] =
                        amx_element(src, store, j0 + j, s * LOWP_AMX_DEPTH + d, w, kc, s_w, s_k);
        }
}

static void pack_amx_b_scalar(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    int steps = ceil_steps(kc);
    for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE)
        for (int s = 0; s < steps; s++) {
            uint16_t *step = dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS;
            for (int q = 0; q < LOWP_AMX_DEPTH / 2; q++)
                for (int j = 0; j < LOWP_AMX_TILE; j++)
                    for (int half = 0; half < 2; half++)
                        step[(q * LOWP_AMX_TILE + j) * 2 + half] =
                            amx_element(src, store, j0 + j, s * LOWP_AMX_DEPTH + 2 * q + half, w, kc, s_w, s_k);
        }
}

#if LOWP_X86 && !defined(MT_DOUBLE) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

enum {
    CPUID_AMX_BF16 = 1u << 22,  // CPUID.(7,0):EDX
    CPUID_AMX_TILE = 1u << 24,
    ARCH_REQ_XCOMP_PERM = 0x1023,
    XFEATURE_XTILEDATA = 18,
    AMX_PALETTE = 1,
};

// The AMX packers use the vector conversion above (AMX CPUs all have AVX-512 BF16: asked below),
// or for a source stored as bf16 (gemm.h STORE_BF16) its values as they are (bf16x32_at).

// A with each row contiguous along k (s_k == 1): a row's 32 depths are one conversion.
PACK_TARGET static void pack_amx_a_rows(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w) {
    int steps = ceil_steps(kc);
    for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE)
        for (int s = 0; s < steps; s++) {
            uint16_t *step = dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS;
            int depths = MT_MIN(LOWP_AMX_DEPTH, kc - s * LOWP_AMX_DEPTH);
            for (int j = 0; j < LOWP_AMX_TILE; j++) {
                __m512i row = j0 + j < w ? bf16x32_at(src, store, (size_t)(j0 + j) * s_w + s * LOWP_AMX_DEPTH, depths)
                                         : _mm512_setzero_si512();
                _mm512_store_si512((void *)(step + j * LOWP_AMX_DEPTH), row);
            }
        }
}

// Depths k and k + 1 of lanes [j0, j0 + lanes) of a source contiguous along the lanes
// (element (j, k) at src[k·s_k + j]) as bf16 pairs, (k, k + 1) in each 32 bits: lanes 0-15 of
// the 32 in pairs[0], 16-31 in pairs[1]; zero past the lanes and past kc.
PACK_TARGET static inline void depth_pairs(__m512i pairs[2], const void *src, Storage store, int k, int kc,
                                           size_t s_k, int j0, int lanes) {
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                           37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);  // lanes 0-15 of both rows
    const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(AMX_HALF));     // lanes 16-31
    __m512i even = k < kc ? bf16x32_at(src, store, (size_t)k * s_k + j0, lanes) : _mm512_setzero_si512();
    __m512i odd = k + 1 < kc ? bf16x32_at(src, store, (size_t)(k + 1) * s_k + j0, lanes) : _mm512_setzero_si512();
    pairs[0] = _mm512_permutex2var_epi16(even, first, odd);
    pairs[1] = _mm512_permutex2var_epi16(even, second, odd);
}

// The 16 x 16 matrix of 32-bit elements whose row i is r[i], transposed in place (row i
// becomes column i): 32-bit, then 64-bit interleaves within each 128-bit block, then two
// rounds of 128-bit block shuffles.
PACK_TARGET static inline void transpose16_epi32(__m512i r[16]) {
    enum { EVEN_BLOCKS = 0x88, ODD_BLOCKS = 0xdd };  // blocks (0, 2 | 0, 2) and (1, 3 | 1, 3) of (a | b)
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // u[i + c]: column c (+4, +8, +12 in the other blocks) of rows i..i+3
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], EVEN_BLOCKS);        // columns c, c+8 of rows 0-7
        __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], ODD_BLOCKS);         // columns c+4, c+12 of rows 0-7
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], EVEN_BLOCKS);   // the same of rows 8-15
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], ODD_BLOCKS);
        r[c] = _mm512_shuffle_i32x4(v0, w0, EVEN_BLOCKS);
        r[c + 8] = _mm512_shuffle_i32x4(v0, w0, ODD_BLOCKS);
        r[c + 4] = _mm512_shuffle_i32x4(v1, w1, EVEN_BLOCKS);
        r[c + 12] = _mm512_shuffle_i32x4(v1, w1, ODD_BLOCKS);
    }
}

// B with its columns contiguous at each k (s_w == 1): each step's depth pairs are B's
// layout as they come.
PACK_TARGET static void pack_amx_b_columns(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_k) {
    int steps = ceil_steps(kc);
    for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE) {
        int lanes = MT_MIN(LOWP_AMX_TILE, w - j0);
        for (int s = 0; s < steps; s++) {
            uint16_t *step = dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS;
            for (int q = 0; q < LOWP_AMX_DEPTH / 2; q++) {
                __m512i pairs[2];
                depth_pairs(pairs, src, store, s * LOWP_AMX_DEPTH + 2 * q, kc, s_k, j0, lanes);
                _mm512_store_si512((void *)(step + (size_t)q * LOWP_AMX_TILE * 2), pairs[0]);
                _mm512_store_si512((void *)(step + (size_t)q * LOWP_AMX_TILE * 2 + LOWP_AMX_TILE), pairs[1]);
            }
        }
    }
}

// A with its rows contiguous at each k (s_w == 1, A transposed): a step's depth pairs
// ([16 pairs][32 lanes] of 32 bits) transposed to A's [32 lanes][16 pairs] in registers,
// lanes 0-15 and 16-31 as two 16 x 16 blocks.
PACK_TARGET static void pack_amx_a_columns(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_k) {
    int steps = ceil_steps(kc);
    for (int s = 0; s < steps; s++)  // each depth row's panels one after the other: one run of its memory
        for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE) {
            int lanes = MT_MIN(LOWP_AMX_TILE, w - j0);
            uint32_t *step = (uint32_t *)(dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS);
            __m512i low[AMX_HALF], high[AMX_HALF];  // [pair q]: lanes 0-15, lanes 16-31
            for (int q = 0; q < LOWP_AMX_DEPTH / 2; q++) {
                __m512i pairs[2];
                depth_pairs(pairs, src, store, s * LOWP_AMX_DEPTH + 2 * q, kc, s_k, j0, lanes);
                low[q] = pairs[0];
                high[q] = pairs[1];
            }
            transpose16_epi32(low);  // now [lane j]: its 16 pairs
            transpose16_epi32(high);
            for (int j = 0; j < AMX_HALF; j++) {
                _mm512_store_si512((void *)(step + (size_t)j * (LOWP_AMX_DEPTH / 2)), low[j]);
                _mm512_store_si512((void *)(step + (size_t)(AMX_HALF + j) * (LOWP_AMX_DEPTH / 2)), high[j]);
            }
        }
}

// B with each column contiguous along k (s_k == 1, B transposed): a column's 32 depths
// converted are its 16 pairs; the 32 x 16 block of pairs transposed in registers (columns
// 0-15 and 16-31 as two 16 x 16 blocks) to B's [16 pairs][32 lanes].
PACK_TARGET static void pack_amx_b_rows(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w) {
    int steps = ceil_steps(kc);
    for (int j0 = 0; j0 < w; j0 += LOWP_AMX_TILE) {
        int lanes = MT_MIN(LOWP_AMX_TILE, w - j0);
        for (int s = 0; s < steps; s++) {
            uint32_t *step = (uint32_t *)(dst + ((size_t)j0 / LOWP_AMX_TILE * steps + s) * AMX_STEP_ELEMS);
            int depths = MT_MIN(LOWP_AMX_DEPTH, kc - s * LOWP_AMX_DEPTH);
            __m512i low[AMX_HALF], high[AMX_HALF];  // [lane j]: its 16 pairs, lanes 0-15 and 16-31
            for (int j = 0; j < AMX_HALF; j++) {
                low[j] = j < lanes ? bf16x32_at(src, store, (size_t)(j0 + j) * s_w + s * LOWP_AMX_DEPTH, depths)
                                   : _mm512_setzero_si512();
                high[j] = AMX_HALF + j < lanes
                              ? bf16x32_at(src, store, (size_t)(j0 + AMX_HALF + j) * s_w + s * LOWP_AMX_DEPTH, depths)
                              : _mm512_setzero_si512();
            }
            transpose16_epi32(low);  // now [pair q]: lanes 0-15 of it
            transpose16_epi32(high);
            for (int q = 0; q < LOWP_AMX_DEPTH / 2; q++) {
                _mm512_store_si512((void *)(step + q * LOWP_AMX_TILE), low[q]);
                _mm512_store_si512((void *)(step + q * LOWP_AMX_TILE + AMX_HALF), high[q]);
            }
        }
    }
}

void lowp_pack_amx_a(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    if (s_k == 1) pack_amx_a_rows(dst, src, store, w, kc, s_w);
    else if (s_w == 1) pack_amx_a_columns(dst, src, store, w, kc, s_k);
    else pack_amx_a_scalar(dst, src, store, w, kc, s_w, s_k);
}

void lowp_pack_amx_b(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    if (s_w == 1) pack_amx_b_columns(dst, src, store, w, kc, s_k);
    else if (s_k == 1) pack_amx_b_rows(dst, src, store, w, kc, s_w);
    else pack_amx_b_scalar(dst, src, store, w, kc, s_w, s_k);
}

int lowp_have_amx(void) {
    static int known = -1;  // asked once; racing first calls compute the same
    if (known >= 0) return known;
    unsigned eax, ebx, ecx, edx;
    int cpu = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & CPUID_AMX_BF16) && (edx & CPUID_AMX_TILE) &&
              lowp_have_avx512bf16();
    known = cpu && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return known;
}

// The tile configuration (palette 1): eight tiles of 16 rows x 64 bytes — 0-3 the four
// 16 x 16 fp32 accumulators, 4-5 A's two row halves, 6-7 B's two column halves.
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

__attribute__((target("amx-tile"))) static void amx_configure_thread(void) {
    static __thread int configured;
    if (configured) return;
    AmxConfig cfg = {.palette = AMX_PALETTE};
    for (int t = 0; t < 8; t++) cfg.rows[t] = AMX_HALF, cfg.colsb[t] = AMX_ROW_BYTES;
    _tile_loadconfig(&cfg);
    configured = 1;
}

__attribute__((target("amx-tile,amx-bf16"))) void lowp_micro_amx(int kc, const uint16_t *a, const uint16_t *b,
                                                                 real *C, size_t ldc, int accumulate) {
    enum { A_STRIDE = LOWP_AMX_DEPTH * 2, B_STRIDE = LOWP_AMX_TILE * 4 };
    size_t c_stride = ldc * sizeof(real);
    real *c_rows2 = C + AMX_HALF * ldc;  // the C tile's rows 16-31
    amx_configure_thread();
    if (accumulate) {
        _tile_loadd(0, C, c_stride);
        _tile_loadd(1, C + AMX_HALF, c_stride);
        _tile_loadd(2, c_rows2, c_stride);
        _tile_loadd(3, c_rows2 + AMX_HALF, c_stride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int s = 0; s < ceil_steps(kc); s++) {
        const uint16_t *as = a + (size_t)s * AMX_STEP_ELEMS, *bs = b + (size_t)s * AMX_STEP_ELEMS;
        // each load just before its first product, so that it overlaps the products before
        // it (the tile registers are not renamed: a load waits for the last reader of its tile)
        _tile_loadd(4, as, A_STRIDE);  // rows 0-15
        _tile_loadd(6, bs, B_STRIDE);  // columns 0-15
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bs + AMX_HALF * 2, B_STRIDE);  // columns 16-31
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, as + AMX_HALF * LOWP_AMX_DEPTH, A_STRIDE);  // rows 16-31
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, C, c_stride);
    _tile_stored(1, C + AMX_HALF, c_stride);
    _tile_stored(2, c_rows2, c_stride);
    _tile_stored(3, c_rows2 + AMX_HALF, c_stride);
}
#else
int lowp_have_amx(void) { return 0; }

void lowp_pack_amx_a(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    pack_amx_a_scalar(dst, src, store, w, kc, s_w, s_k);
}

void lowp_pack_amx_b(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k) {
    pack_amx_b_scalar(dst, src, store, w, kc, s_w, s_k);
}

void lowp_micro_amx(int kc, const uint16_t *a, const uint16_t *b, real *C, size_t ldc, int accumulate) {
    (void)kc, (void)a, (void)b, (void)C, (void)ldc, (void)accumulate;
    mt_die("internal error: the AMX GEMM kernel called on a CPU or build without it (please report)");
}
#endif
