// gemm_lowp.c — rounding, packing and the AVX-512 BF16 micro-kernel of the cpu GEMM's
// 16-bit-input modes (gemm_lowp.h). The emulation (lowp_round_panel + the fp32 kernel
// under lowp_run_flushed) and the hardware kernel give the same bits: VDPBF16PS adds
// each of its two products to the lane with one rounding, high half first, flushing
// subnormals, which is a fused multiply-add per product under flush-to-zero (checked
// against the instruction by tests/unit/test_gemm_lowp.c wherever the CPU has it).
#include "ops/cpu/gemm_lowp.h"

#include "core/float_formats.h"

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

// bf16 of v with an fp32 subnormal read as ±0 (the dot product's operands never are
// subnormal), else rounded to nearest even.
static inline uint16_t bf16_flushed(float v) {
    uint32_t b = float_bits(v);
    if ((b & F32_EXPONENT) == 0) return (uint16_t)((b & F32_SIGN) >> 16);
    return bf16_from_float(v);
}

void lowp_round_panel(real *x, size_t n, GemmInputs inputs) {
    if (inputs == GEMM_INPUTS_BF16)
        for (size_t i = 0; i < n; i++) x[i] = (real)bf16_to_float(bf16_flushed((float)x[i]));
    else if (inputs == GEMM_INPUTS_FP16)
        for (size_t i = 0; i < n; i++) x[i] = (real)f16_to_float(f16_from_float((float)x[i]));
}

// One lane's pair at depth 2q: the 2q element high, 2q+1 low (`pad` past kc).
static inline void pack_pair(uint16_t *pair, const real *lane, int k, int kc, size_t s_k, uint16_t pad) {
    pair[1] = bf16_flushed((float)lane[(size_t)k * s_k]);
    pair[0] = k + 1 < kc ? bf16_flushed((float)lane[(size_t)(k + 1) * s_k]) : pad;
}

void lowp_pack_bf16_pairs(uint16_t *dst, const real *src, int w, int W, int kc, size_t s_w, size_t s_k,
                          uint16_t pad) {
    int pairs = lowp_pairs(kc);
    for (int j0 = 0; j0 < w; j0 += W) {  // one panel of W lanes
        uint16_t *panel = dst + (size_t)j0 * pairs * 2;
        int lanes = MT_MIN(W, w - j0);
        for (int q = 0; q < pairs; q++) {
            uint16_t *row = panel + (size_t)q * W * 2;
            for (int j = 0; j < lanes; j++) pack_pair(row + 2 * j, src + (size_t)(j0 + j) * s_w, 2 * q, kc, s_k, pad);
            for (int j = lanes; j < W; j++) row[2 * j] = row[2 * j + 1] = 0;
        }
    }
}

#if LOWP_X86 && !defined(MT_DOUBLE)
int lowp_have_avx512bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

// Six rows of one 16-column vector each: per pair of depths one load of b, six broadcasts
// of a's pairs, six dot products into independent accumulators.
__attribute__((target("avx512f,avx512bf16"))) void lowp_micro_avx512bf16(int kc, const uint16_t *a,
                                                                         const uint16_t *b, real *acc) {
    __m512 c[LOWP_MR];
    for (int i = 0; i < LOWP_MR; i++) c[i] = _mm512_setzero_ps();
    int pairs = lowp_pairs(kc);
#pragma GCC unroll 2
    for (int q = 0; q < pairs; q++) {
        __m512bh bq = (__m512bh)_mm512_load_si512((const void *)(b + (size_t)q * LOWP_NR * 2));
        const uint16_t *aq = a + (size_t)q * LOWP_MR * 2;
        for (int i = 0; i < LOWP_MR; i++) {
            int32_t pair;
            memcpy(&pair, aq + 2 * i, sizeof pair);
            c[i] = _mm512_dpbf16_ps(c[i], (__m512bh)_mm512_set1_epi32(pair), bq);
        }
    }
    for (int i = 0; i < LOWP_MR; i++) _mm512_store_ps(acc + i * LOWP_NR, c[i]);
}
#else
int lowp_have_avx512bf16(void) { return 0; }

void lowp_micro_avx512bf16(int kc, const uint16_t *a, const uint16_t *b, real *acc) {
    (void)kc, (void)a, (void)b, (void)acc;
    mt_die("internal error: the AVX-512 BF16 GEMM kernel called on a CPU or build without it (please report)");
}
#endif

void lowp_run_flushed(LowpMicro micro, int kc, const real *a, const real *b, real *acc) {
#if LOWP_X86
    unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | MXCSR_FLUSH_TO_ZERO | MXCSR_DENORMALS_ARE_ZERO);
    micro(kc, a, b, acc);
    _mm_setcsr(saved);
#else
    micro(kc, a, b, acc);
#endif
}
