// check_quantize.c — the backend under test's quantizer ops (ops_quantize.h) against the cpu
// backend (op_check.h), bit for bit: codes, scales and dequantized values are compared as
// integers (a float by its bits, NaN included), on random inputs with adversarial pieces
// (an all-zero block, values at rounding midpoints, subnormals, saturation, and in the
// "special" inputs NaN and infinities). Outputs start as all-ones bytes under test. On top,
// the round trip quantize → dequantize of finite inputs must stay within the format's
// precision of x (normwise), which checks the cpu backend's own codes.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_check.h"
#include "ops/quantize_math.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

// Round-trip tolerances (max |dequant − x| / max |x|): half an ulp of the element format at
// its top binade, plus room for the block scale's own rounding (NVFP4's E4M3 scale).
#define ROUND_TRIP_E4M3 (1.0 / 16)
#define ROUND_TRIP_E5M2 (1.0 / 8)
#define ROUND_TRIP_NVFP4 0.25

typedef enum { INPUT_FINITE, INPUT_SPECIAL } InputKind;

// x (rows, cols): normal values over 2^-20 .. 2^12 in magnitude, the first MX block of row
// 0 all zero, every 7th element a midpoint of E4M3 / E2M1 rounding, every 13th a float
// subnormal; INPUT_SPECIAL adds NaN and ±infinity in row 1 (when there is one).
static float *quant_input(int rows, int cols, InputKind kind) {
    size_t n = (size_t)rows * cols;
    float *x = check_random(n, -1, 1), *e = check_random(n, -20, 12);
    for (size_t i = 0; i < n; i++) {
        x[i] = ldexpf(x[i], (int)e[i]);
        if (i % 7 == 3) x[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + 0.0625f) * ldexpf(1.0f, (int)(i % 5));  // E4M3 tie
        if (i % 11 == 5) x[i] = (i % 2 ? -2.5f : 5.0f);                                                  // E2M1 ties
        if (i % 13 == 6) x[i] = bits_float(0x00000003u + (uint32_t)i);                                    // subnormal
    }
    for (int c = 0; c < MX_BLOCK && c < cols; c++) x[c] = 0.0f;
    if (kind == INPUT_SPECIAL && rows > 1 && cols > 3) {
        x[cols + 0] = NAN, x[cols + 1] = INFINITY, x[cols + 2] = -INFINITY, x[cols + 3] = -NAN;
    }
    return x;
}

// Host bytes widened to int32 (kept with the check's buffers).
static int32_t *widen(const uint8_t *bytes, size_t n) {
    int32_t *w = check_random_ints(n, 0, 1);
    for (size_t i = 0; i < n; i++) w[i] = bytes[i];
    return w;
}

// The bytes the backend under test wrote (n at d) against the cpu's, exactly.
static void compare_bytes(const char *check, const char *output, const uint8_t *cpu_bytes, const void *d, size_t n) {
    uint8_t *test = (uint8_t *)check_random_ints(n / 4 + 1, 0, 1);
    check_download(test, d, n);
    check_compare_ints(check, output, widen(cpu_bytes, n), check_ints_to_device(widen(test, n), n), n);
}

// Floats compared by their bits.
static void compare_float_bits(const char *check, const char *output, const float *cpu_values, const float *d,
                               size_t n) {
    check_compare_ints(check, output, (const int32_t *)cpu_values, (const int32_t *)d, n);
}

static uint8_t *host_bytes(size_t n) { return (uint8_t *)check_random_ints(n / 4 + 1, 0, 1); }

static uint8_t *device_unset_bytes(size_t n) {
    uint8_t *ones = host_bytes(n);
    memset(ones, 0xFF, n);
    return check_device_bytes(ones, n);
}

static const char *fp8_name(Fp8Format f) { return f == FP8_E5M2 ? "e5m2" : "e4m3"; }

// ---- FP8 per tensor ---------------------------------------------------------------------------

static void check_fp8_tensor(size_t n, Fp8Format f, InputKind kind, int pow2) {
    char name[96];
    snprintf(name, sizeof(name), "fp8_tensor %s n=%zu%s%s", fp8_name(f), n, kind ? " special" : "", pow2 ? " pow2" : "");
    float *x = quant_input(1, (int)n, kind), *d_x = check_to_device(x, n);
    Fp8ScaleParams p = {.format = f, .pow2_scales = pow2, .amax_epsilon = 0.0f};
    float amax[2], scale, scale_inv;
    uint8_t *codes = host_bytes(n);
    float *y = check_random(n, 0, 1);
    cpu()->quant_amax(amax, x, n, AMAX_IGNORE_NAN);
    cpu()->quant_amax(amax + 1, x, n, AMAX_PROPAGATE_NAN);
    cpu()->fp8_scale_from_amax(&scale, &scale_inv, amax, &p);
    cpu()->fp8_quantize_tensor(codes, x, &scale, n, f);
    cpu()->fp8_dequantize_tensor(y, codes, &scale_inv, n, f);

    float *d_amax = check_device_nan(2), *d_scale = check_device_nan(1), *d_scale_inv = check_device_nan(1);
    uint8_t *d_codes = device_unset_bytes(n);
    float *d_y = check_device_nan(n);
    under()->quant_amax(d_amax, d_x, n, AMAX_IGNORE_NAN);
    under()->quant_amax(d_amax + 1, d_x, n, AMAX_PROPAGATE_NAN);
    under()->fp8_scale_from_amax(d_scale, d_scale_inv, d_amax, &p);
    under()->fp8_quantize_tensor(d_codes, d_x, d_scale, n, f);
    under()->fp8_dequantize_tensor(d_y, d_codes, d_scale_inv, n, f);

    compare_float_bits(name, "amax", amax, d_amax, 2);
    compare_float_bits(name, "scale", &scale, d_scale, 1);
    compare_float_bits(name, "scale_inv", &scale_inv, d_scale_inv, 1);
    compare_bytes(name, "codes", codes, d_codes, n);
    compare_float_bits(name, "dequantized", y, d_y, n);
    if (kind == INPUT_FINITE && !pow2) check_compare(name, "round trip", x, d_y, n, f == FP8_E5M2 ? ROUND_TRIP_E5M2 : ROUND_TRIP_E4M3);
    check_free_all();
}

// The columnwise copy of per-tensor codes, byte for byte.
static void check_fp8_transpose(int rows, int cols) {
    char name[96];
    snprintf(name, sizeof(name), "fp8_transpose %dx%d", rows, cols);
    size_t n = (size_t)rows * cols;
    int32_t *values = check_random_ints(n, 0, 256);
    uint8_t *codes = host_bytes(n), *t = host_bytes(n);
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)values[i];
    cpu()->fp8_transpose(t, codes, rows, cols);
    uint8_t *d_t = device_unset_bytes(n);
    under()->fp8_transpose(d_t, check_device_bytes(codes, n), rows, cols);
    compare_bytes(name, "transposed", t, d_t, n);
    check_free_all();
}

// n random finite codes of format f (NaN and infinity codes moved to finite neighbours).
static uint8_t *finite_codes(size_t n, Fp8Format f) {
    int32_t *values = check_random_ints(n, 0, 256);
    uint8_t *codes = host_bytes(n);
    for (size_t i = 0; i < n; i++) {
        int v = values[i], magnitude = v & 0x7F;
        if (f == FP8_E4M3 && magnitude == 0x7F) v -= 1;
        if (f == FP8_E5M2 && magnitude >= 0x7C) v -= 4;
        codes[i] = (uint8_t)v;
    }
    return codes;
}

// cuBLASLt's FP8 GEMM against the emulation: its tensor cores keep about 14 bits of a partial
// sum between promotions to fp32 (gemm_fp8.cu), ~2^-14 of the sum per promotion interval of
// K (128 or so), √(K/128) intervals adding at random: ~3.5e-4 normwise at K = 4096. The bound
// leaves about 3x; an error past it is a wrong sum, not rounding.
#define TOL_FP8_TENSOR_CORES 1e-3

// C (M, N) = (sa·A)(sb·B)ᵀ + beta·C against the cpu's emulation, normwise (the backends
// differ in where the scales round and in the summation order: ops_quantize.h). Shapes that
// are multiples of 16 take cuBLASLt's FP8 GEMM on a Hopper-class GPU (TOL_FP8_TENSOR_CORES),
// the others the emulation (fp32 sums); beta 0 starts C as NaN on the backend under test.
static void check_fp8_gemm(int M, int N, int K, Fp8Format fa, Fp8Format fb, float beta) {
    char name[96];
    snprintf(name, sizeof(name), "fp8_gemm %dx%dx%d %s x %s beta=%g", M, N, K, fp8_name(fa), fp8_name(fb), beta);
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    uint8_t *A = finite_codes(na, fa), *B = finite_codes(nb, fb);
    float scale_inv[2] = {0.1875f, 0.0371f};
    float *C = check_random(nc, -100, 100), *work = check_random(na + nb, 0, 1);
    float *d_C = beta != 0.0f ? check_to_device(C, nc) : check_device_nan(nc);
    float *d_scale_inv = check_to_device(scale_inv, 2), *d_work = check_device_nan(na + nb);
    uint8_t *d_A = check_device_bytes(A, na), *d_B = check_device_bytes(B, nb);
    cpu()->fp8_gemm(C, A, fa, &scale_inv[0], B, fb, &scale_inv[1], M, N, K, beta, work);
    under()->fp8_gemm(d_C, d_A, fa, d_scale_inv, d_B, fb, d_scale_inv + 1, M, N, K, beta, d_work);
    int tensor_cores = M % 16 == 0 && N % 16 == 0 && K % 16 == 0;  // cuBLASLt may take it
    check_compare(name, "C", C, d_C, nc, tensor_cores ? TOL_FP8_TENSOR_CORES : TOL_FP32);
    if (beta == 0.0f) {  // the same call again gives the same bits (one plan, sequential reductions)
        float *first = check_random(nc, 0, 1), *d_again = check_device_nan(nc);
        check_finish();
        check_download(first, d_C, nc * sizeof(float));
        under()->fp8_gemm(d_again, d_A, fa, d_scale_inv, d_B, fb, d_scale_inv + 1, M, N, K, beta, d_work);
        compare_float_bits(name, "C again", first, d_again, nc);
    }
    check_free_all();
}

// DelayedScaling from a history of amaxes (one 0, one NaN, one infinite entry among them).
static void check_fp8_delayed(int length, AmaxHistoryAlgo algo, int margin) {
    char name[96];
    snprintf(name, sizeof(name), "fp8_delayed len=%d %s margin=%d", length, algo ? "max" : "most_recent", margin);
    float *history = check_random((size_t)length, 0, 100), prev = 0.5f, scale = 0, scale_inv = 0;
    if (length > 3) history[1] = 0.0f, history[2] = NAN, history[3] = INFINITY;
    Fp8DelayedParams p = {.format = FP8_E4M3, .history_len = length, .algo = algo, .margin = margin};
    cpu()->fp8_delayed_scale(&scale, &scale_inv, history, &prev, &p);
    float *d_scale = check_device_nan(1), *d_scale_inv = check_device_nan(1);
    under()->fp8_delayed_scale(d_scale, d_scale_inv, check_to_device(history, (size_t)length), check_to_device(&prev, 1), &p);
    compare_float_bits(name, "scale", &scale, d_scale, 1);
    compare_float_bits(name, "scale_inv", &scale_inv, d_scale_inv, 1);
    check_free_all();
}

// ---- FP8 in tiles -------------------------------------------------------------------------------

static void check_fp8_block(int rows, int cols, int tile_rows, int pow2, InputKind kind) {
    char name[96];
    snprintf(name, sizeof(name), "fp8_block %dx%d tile=%dx%d%s%s", rows, cols, tile_rows, FP8_BLOCK,
             pow2 ? " pow2" : "", kind ? " special" : "");
    size_t n = (size_t)rows * cols, ns = (size_t)quant_blocks(rows, tile_rows) * quant_blocks(cols, FP8_BLOCK);
    Fp8BlockParams p = {.format = FP8_E4M3, .tile_rows = tile_rows, .pow2_scales = pow2, .amax_epsilon = 0.0f};
    float *x = quant_input(rows, cols, kind), *scale_inv = check_random(ns, 0, 1), *y = check_random(n, 0, 1);
    uint8_t *codes = host_bytes(n);
    cpu()->fp8_block_quantize(codes, scale_inv, x, rows, cols, &p);
    cpu()->fp8_block_dequantize(y, codes, scale_inv, rows, cols, &p);
    uint8_t *d_codes = device_unset_bytes(n);
    float *d_scale_inv = check_device_nan(ns), *d_y = check_device_nan(n);
    under()->fp8_block_quantize(d_codes, d_scale_inv, check_to_device(x, n), rows, cols, &p);
    under()->fp8_block_dequantize(d_y, d_codes, d_scale_inv, rows, cols, &p);
    compare_bytes(name, "codes", codes, d_codes, n);
    compare_float_bits(name, "scale_inv", scale_inv, d_scale_inv, ns);
    compare_float_bits(name, "dequantized", y, d_y, n);
    check_free_all();
}

// ---- MXFP8 --------------------------------------------------------------------------------------

static void check_mxfp8(int rows, int cols, Fp8Format f, MxScaleMode mode, InputKind kind) {
    char name[96];
    snprintf(name, sizeof(name), "mxfp8 %dx%d %s %s%s", rows, cols, fp8_name(f), mode ? "rceil" : "floor",
             kind ? " special" : "");
    size_t n = (size_t)rows * cols, ns = (size_t)rows * quant_blocks(cols, MX_BLOCK);
    float *x = quant_input(rows, cols, kind), *y = check_random(n, 0, 1);
    uint8_t *codes = host_bytes(n), *scales = host_bytes(ns);
    cpu()->mxfp8_quantize(codes, scales, x, rows, cols, f, mode);
    cpu()->mxfp8_dequantize(y, codes, scales, rows, cols, f);
    uint8_t *d_codes = device_unset_bytes(n), *d_scales = device_unset_bytes(ns);
    float *d_y = check_device_nan(n);
    under()->mxfp8_quantize(d_codes, d_scales, check_to_device(x, n), rows, cols, f, mode);
    under()->mxfp8_dequantize(d_y, d_codes, d_scales, rows, cols, f);
    compare_bytes(name, "codes", codes, d_codes, n);
    compare_bytes(name, "scales", scales, d_scales, ns);
    compare_float_bits(name, "dequantized", y, d_y, n);
    check_free_all();
}

// ---- NVFP4 ---------------------------------------------------------------------------------------

static void check_nvfp4(int rows, int cols, int tile_rows, int stochastic, InputKind kind) {
    char name[96];
    snprintf(name, sizeof(name), "nvfp4 %dx%d tile=%dx%d%s%s", rows, cols, tile_rows, NVFP4_BLOCK,
             stochastic ? " stochastic" : "", kind ? " special" : "");
    size_t n = (size_t)rows * cols, ns = (size_t)rows * quant_blocks(cols, NVFP4_BLOCK);
    Nvfp4Params p = {.tile_rows = tile_rows, .stochastic = stochastic, .seed = 0x5EED};
    float *x = quant_input(rows, cols, kind), *y = check_random(n, 0, 1), amax;
    uint8_t *codes = host_bytes(n / 2), *scales = host_bytes(ns);
    cpu()->quant_amax(&amax, x, n, AMAX_PROPAGATE_NAN);
    cpu()->nvfp4_quantize(codes, scales, x, &amax, rows, cols, &p);
    cpu()->nvfp4_dequantize(y, codes, scales, &amax, rows, cols);
    float *d_x = check_to_device(x, n), *d_amax = check_device_nan(1), *d_y = check_device_nan(n);
    uint8_t *d_codes = device_unset_bytes(n / 2), *d_scales = device_unset_bytes(ns);
    under()->quant_amax(d_amax, d_x, n, AMAX_PROPAGATE_NAN);
    under()->nvfp4_quantize(d_codes, d_scales, d_x, d_amax, rows, cols, &p);
    under()->nvfp4_dequantize(d_y, d_codes, d_scales, d_amax, rows, cols);
    compare_bytes(name, "codes", codes, d_codes, n / 2);
    compare_bytes(name, "scales", scales, d_scales, ns);
    compare_float_bits(name, "dequantized", y, d_y, n);
    // an all-zero tensor has per-tensor scale 0 and dequantizes to NaN, as torchao's (0 / 0)
    if (kind == INPUT_FINITE && !stochastic && amax > 0) check_compare(name, "round trip", x, d_y, n, ROUND_TRIP_NVFP4);
    check_free_all();
}

// The transform against the cpu's bits, and its orthogonality: y = x·S·H/4, and H/4 applied
// to y (mask 0) gives back x·S (H·H / 16 = I), up to rounding.
static void check_hadamard(size_t n, uint32_t sign_mask) {
    char name[96];
    snprintf(name, sizeof(name), "hadamard16 n=%zu signs=%#x", n, sign_mask);
    float *x = check_random(n, -4, 4), *y = check_random(n, 0, 1);
    cpu()->hadamard16(y, x, n, sign_mask);
    float *d_y = check_device_nan(n), *d_back = check_device_nan(n);
    under()->hadamard16(d_y, check_to_device(x, n), n, sign_mask);
    compare_float_bits(name, "y", y, d_y, n);
    under()->hadamard16(d_back, d_y, n, 0);
    float *back = check_random(n, 0, 1), *xs = check_host_copy(x, n);
    cpu()->hadamard16(back, y, n, 0);
    for (size_t i = 0; i < n; i++)
        if ((sign_mask >> (i % HADAMARD_DIM)) & 1) xs[i] = -xs[i];  // (x·S·H/4)·H/4 = x·S
    check_compare(name, "H/4 twice = signs", xs, d_back, n, TOL_FP32);
    check_free_all();
}

// ---- all -------------------------------------------------------------------------------------------

void check_quantize_ops(void) {
    static const size_t LENGTHS[] = {1, 37, 4097, 300001};
    static const int SHAPES[][2] = {{1, 16}, {3, 96}, {130, 300}, {257, 64}};
    for (int i = 0; i < COUNT(LENGTHS); i++)
        for (int kind = INPUT_FINITE; kind <= INPUT_SPECIAL; kind++) {
            check_fp8_tensor(LENGTHS[i], FP8_E4M3, kind, 0);
            check_fp8_tensor(LENGTHS[i], FP8_E5M2, kind, i & 1);
        }
    static const int TRANSPOSES[][2] = {{1, 1}, {3, 96}, {130, 300}, {4097, 33}};
    for (int s = 0; s < COUNT(TRANSPOSES); s++) check_fp8_transpose(TRANSPOSES[s][0], TRANSPOSES[s][1]);
    static const int GEMMS[][3] = {{64, 128, 256}, {32, 48, 4096}, {272, 96, 64}, {37, 50, 70}, {16, 16, 0}};
    for (int s = 0; s < COUNT(GEMMS); s++)
        for (int beta = 0; beta <= 1; beta++) {
            int M = GEMMS[s][0], N = GEMMS[s][1], K = GEMMS[s][2];
            check_fp8_gemm(M, N, K, FP8_E4M3, FP8_E4M3, (float)beta);
            check_fp8_gemm(M, N, K, FP8_E5M2, FP8_E4M3, (float)beta);
            check_fp8_gemm(M, N, K, FP8_E4M3, FP8_E5M2, (float)beta);
        }
    check_fp8_gemm(64, 64, 64, FP8_E5M2, FP8_E5M2, 1);
    check_fp8_delayed(1, AMAX_HISTORY_MOST_RECENT, 0);
    check_fp8_delayed(16, AMAX_HISTORY_MAX, 1);
    check_fp8_delayed(1024, AMAX_HISTORY_MAX, 0);
    for (int s = 0; s < COUNT(SHAPES); s++)
        for (int kind = INPUT_FINITE; kind <= INPUT_SPECIAL; kind++) {
            int rows = SHAPES[s][0], cols = SHAPES[s][1];
            check_fp8_block(rows, cols, 1, 1, kind);
            check_fp8_block(rows, cols, FP8_BLOCK, 1, kind);
            check_fp8_block(rows, cols, 1, 0, kind);
            for (int mode = MX_SCALE_FLOOR; mode <= MX_SCALE_RCEIL; mode++) {
                check_mxfp8(rows, cols, FP8_E4M3, mode, kind);
                check_mxfp8(rows, cols, FP8_E5M2, mode, kind);
            }
            check_nvfp4(rows, cols, 1, 0, kind);
            check_nvfp4(rows, cols, NVFP4_BLOCK, 0, kind);
            check_nvfp4(rows, cols, 1, 1, kind);
        }
    check_hadamard(16, HADAMARD_TE_WGRAD_SIGNS);
    check_hadamard(16 * 4099, HADAMARD_TE_WGRAD_SIGNS);
    check_hadamard(16 * 33, 0);
}
