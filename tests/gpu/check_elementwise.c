// check_elementwise.c — the backend under test's vector, dropout, embedding, RMSNorm, RoPE, clamp,
// SwiGLU, softmax, cross-entropy and AdamW ops against the cpu backend (op_check.h).
//
// Every case: random host inputs; copies made before the cpu op runs (so in-place
// and accumulated (+=) outputs start from the same values on both); outputs the op
// overwrites start as NaN under test; each output compared at TOL_FP32. Sizes are
// odd on purpose (1, 3, 257 rows; 1, 7, 64, 4097 columns) to hit partial warps, partial
// tiles and the tails of the strided loops.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/float_formats.h"
#include "op_check.h"
#include "ops/adamw_math.h"
#include "ops/cpu/gemm_lowp.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

static const int ROWS[] = {1, 3, 257};
static const int COLS[] = {1, 7, 64, 4097};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

// ---- vectors and clamp ---------------------------------------------------------------------

// vec_count_zeros_to on every third element zero (+0 and −0 alternating) and a NaN: the
// count exactly, on both backends.
static void check_count_zeros(const char *name, size_t n) {
    float *x = check_random(n, -2, 2);
    double zeros = 0;
    for (size_t i = 0; i < n; i += 3, zeros++) x[i] = i % 2 ? -0.0f : 0.0f;
    if (n > 1) x[1] = NAN;
    float *d_x = check_to_device(x, n);
    double cpu_count = NAN, gpu_count = NAN, *d_count = check_device_bytes(&gpu_count, sizeof(double));
    cpu()->vec_count_zeros_to(&cpu_count, x, n);
    under()->vec_count_zeros_to(d_count, d_x, n);
    check_download(&gpu_count, d_count, sizeof(double));
    check_compare_double(name, "vec_count_zeros_to (cpu) = the zeros set", zeros, cpu_count, 0);
    check_compare_double(name, "vec_count_zeros_to", cpu_count, gpu_count, 0);
}

// bf16_pack / bf16_unpack on the first n - n % 2 elements: the packed halves bit for bit, on values
// with subnormals, ±0, NaN, infinities and a tie; the unpacked values the cpu GEMM's bf16 rounding
// of its inputs (lowp_round_panel, a branchless implementation of its own).
static void check_bf16_transport(const char *name, size_t n) {
    n -= n % 2;
    if (n == 0) return;
    float *x = check_random(n, -2, 2);
    static const float special[] = {1e-40f, -1e-40f, 0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1.00390625f, 3.4e38f};
    for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) x[i] = special[i];
    float *d_x = check_to_device(x, n), *d_packed = check_device_nan(n / 2), *d_back = check_device_nan(n);
    float *packed = check_random(n / 2, 0, 1), *back = check_random(n, 0, 1);
    cpu()->bf16_pack(packed, x, n);
    cpu()->bf16_unpack(back, packed, n);
    under()->bf16_pack(d_packed, d_x, n);
    under()->bf16_unpack(d_back, d_packed, n);
    float *rounded = check_host_copy(x, n);
    lowp_round_panel(rounded, n, GEMM_INPUTS_BF16);  // what a bf16 GEMM reads of x
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&rounded[i], &back[i], sizeof(float)) != 0;
    check_compare_double(name, "bf16_unpack(bf16_pack) (cpu) = the GEMM's rounding (elements differing)", 0,
                         (double)differ, 0);
    check_compare_ints(name, "bf16_pack", (const int32_t *)packed, (const int32_t *)d_packed, n / 2);
    check_compare_ints(name, "bf16_unpack", (const int32_t *)back, (const int32_t *)d_back, n);
}

// residual_add y = x + branch in each storage of x and y (gemm.h: the residual stream kept bf16
// under --bf16), against the cpu's fp32 sum of the same values, rounded once for a bf16 y:
// exactly, on every backend (one IEEE fp32 add each). y in place of x as well.
static void check_residual_add(const char *name, size_t n) {
    for (int stores = 0; stores < 4; stores++) {
        Storage x_store = stores & 1 ? STORE_BF16 : STORE_FP32, y_store = stores & 2 ? STORE_BF16 : STORE_FP32;
        float *x = check_random(n, -2, 2), *branch = check_random(n, -1, 1), *want = check_random(n, 0, 1);
        void *d_x = check_stored_to_device(x, n, x_store);  // x now holds the values stored
        float *d_branch = check_to_device(branch, n);
        cpu()->residual_add(want, STORE_FP32, x, STORE_FP32, branch, n);
        if (y_store == STORE_BF16)
            for (size_t i = 0; i < n; i++) want[i] = bf16_to_float(bf16_from_float_flushed(want[i]));
        void *d_y = check_device_nan(n);
        under()->residual_add(d_y, y_store, d_x, x_store, d_branch, n);
        char what[64];
        snprintf(what, sizeof(what), "residual_add x %s y %s", x_store ? "bf16" : "fp32", y_store ? "bf16" : "fp32");
        check_compare(name, what, want, check_widened_from_device(d_y, n, y_store), n, 0);
        if (x_store != y_store) continue;
        under()->residual_add(d_x, y_store, d_x, x_store, d_branch, n);  // in place
        snprintf(what, sizeof(what), "residual_add in place %s", x_store ? "bf16" : "fp32");
        check_compare(name, what, want, check_widened_from_device(d_x, n, y_store), n, 0);
    }
}

static void check_vectors(size_t n) {
    char name[96];
    snprintf(name, sizeof(name), "vec n=%zu", n);
    float *x = check_random(n, -2, 2), *y = check_random(n, -2, 2);
    float *d_x = check_to_device(x, n), *d_y = check_to_device(y, n);
    float *d_copy = check_device_nan(n), *d_zero = check_device_nan(n), *d_scaled = check_to_device(x, n);

    float *copy = check_random(n, 0, 1), *zero = check_random(n, 0, 1), *scaled = check_host_copy(x, n);
    cpu()->vec_copy(copy, x, n);
    cpu()->vec_zero(zero, n);
    cpu()->vec_add(y, x, n);
    cpu()->vec_scale(scaled, 0.37f, n);
    double cpu_ss = cpu()->vec_sum_squares(x, n);

    under()->vec_copy(d_copy, d_x, n);
    under()->vec_zero(d_zero, n);
    under()->vec_add(d_y, d_x, n);
    under()->vec_scale(d_scaled, 0.37f, n);
    double gpu_ss = under()->vec_sum_squares(d_x, n);
    double cpu_ss_to = NAN, gpu_ss_to = NAN, *d_ss_to = check_device_bytes(&gpu_ss_to, sizeof(double));
    cpu()->vec_sum_squares_to(&cpu_ss_to, x, n);
    under()->vec_sum_squares_to(d_ss_to, d_x, n);
    check_download(&gpu_ss_to, d_ss_to, sizeof(double));

    check_compare(name, "vec_copy", copy, d_copy, n, TOL_FP32);
    check_compare(name, "vec_zero", zero, d_zero, n, TOL_FP32);
    check_compare(name, "vec_add", y, d_y, n, TOL_FP32);
    check_compare(name, "vec_scale", scaled, d_scaled, n, TOL_FP32);
    check_compare_double(name, "vec_sum_squares", cpu_ss, gpu_ss, TOL_FP32);
    check_compare_double(name, "vec_sum_squares_to", cpu_ss, gpu_ss_to, TOL_FP32);
    check_compare_double(name, "vec_sum_squares_to = vec_sum_squares (cpu)", cpu_ss, cpu_ss_to, 0);
    check_count_zeros(name, n);
    check_bf16_transport(name, n);
    check_residual_add(name, n);
    check_free_all();
}

static void check_clamp(size_t n) {
    char name[96];
    snprintf(name, sizeof(name), "clamp n=%zu", n);
    const float limit = 1.5f;
    float *x = check_random(n, -3, 3), *d = check_random(n, -1, 1);
    float *d_x = check_to_device(x, n), *d_d = check_to_device(d, n);
    float *d_y = check_device_nan(n), *d_inplace = check_to_device(x, n);

    float *y = check_random(n, 0, 1);
    cpu()->clamp_forward(y, x, n, limit);
    cpu()->clamp_backward(d, x, n, limit);

    under()->clamp_forward(d_y, d_x, n, limit);
    under()->clamp_forward(d_inplace, d_inplace, n, limit);  // y == x
    under()->clamp_backward(d_d, d_x, n, limit);

    check_compare(name, "y", y, d_y, n, TOL_FP32);
    check_compare(name, "y in place", y, d_inplace, n, TOL_FP32);
    check_compare(name, "d", d, d_d, n, TOL_FP32);
    check_free_all();
}

// ---- dropout: the same mask bit for bit (tolerance 0), by row_first and by row_index ----------

static void check_dropout(int rows, int cols, double p) {
    char name[96];
    snprintf(name, sizeof(name), "dropout %dx%d p=%g", rows, cols, p);
    size_t n = (size_t)rows * cols;
    float *x = check_random(n, -2, 2), *y = check_random(n, 0, 1), *y_index = check_random(n, 0, 1);
    int32_t *index = check_random_ints((size_t)rows, 0, 1 << 30);
    DropoutShape s = {.mask = {.stream = 0x1234567890ABCDEFULL, .threshold = (uint32_t)(p * 4294967296.0),
                               .scale = (real)(1 / (1 - p))},
                      .rows = rows, .cols = cols, .row_first = 12345};
    DropoutShape s_index = s;
    s_index.row_index = index;
    cpu()->dropout_apply(y, x, &s);
    cpu()->dropout_apply(y_index, x, &s_index);

    float *d_x = check_to_device(x, n), *d_y = check_device_nan(n), *d_y_index = check_device_nan(n);
    float *d_inplace = check_to_device(x, n);
    s_index.row_index = check_ints_to_device(index, (size_t)rows);
    under()->dropout_apply(d_y, d_x, &s);
    under()->dropout_apply(d_y_index, d_x, &s_index);
    under()->dropout_apply(d_inplace, d_inplace, &s);  // y == x
    check_compare(name, "y", y, d_y, n, 0);
    check_compare(name, "y by row_index", y_index, d_y_index, n, 0);
    check_compare(name, "y in place", y, d_inplace, n, 0);
    check_free_all();
}

// ---- embedding -------------------------------------------------------------------------------

static void check_embedding(int N, int C, int V) {
    char name[96];
    snprintf(name, sizeof(name), "embedding V=%d N=%d C=%d", V, N, C);
    size_t nc = (size_t)N * C, vc = (size_t)V * C;
    int32_t *tokens = check_random_ints((size_t)N, 0, V);
    float *table = check_random(vc, -1, 1), *dout = check_random(nc, -1, 1), *dtable = check_random(vc, -1, 1);
    int32_t *d_tokens = check_ints_to_device(tokens, (size_t)N);
    float *d_table = check_to_device(table, vc), *d_dout = check_to_device(dout, nc);
    float *d_dtable = check_to_device(dtable, vc), *d_out = check_device_nan(nc);

    float *out = check_random(nc, 0, 1);
    cpu()->embedding_forward(out, tokens, table, N, C);
    cpu()->embedding_backward(dtable, dout, tokens, N, C);

    under()->embedding_forward(d_out, d_tokens, d_table, N, C);
    under()->embedding_backward(d_dtable, d_dout, d_tokens, N, C);

    check_compare(name, "out", out, d_out, nc, TOL_FP32);
    check_compare(name, "dtable", dtable, d_dtable, vc, TOL_FP32);
    check_free_all();
}

// ---- RMSNorm ------------------------------------------------------------------------------------

// x stored as x_store (bf16: the residual stream under --bf16) for the backend under test, the cpu
// reading fp32 storage of the same values.
static void check_rmsnorm(int N, int C, Storage x_store) {
    char name[96];
    snprintf(name, sizeof(name), "rmsnorm N=%d C=%d%s", N, C, x_store == STORE_BF16 ? " x stored bf16" : "");
    size_t nc = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = check_random(nc, -2, 2), *w = check_random((size_t)C, 0.5f, 1.5f), *dy = check_random(nc, -1, 1);
    float *dx = check_random(nc, -1, 1), *dw = check_random((size_t)C, -1, 1);
    void *d_x = check_stored_to_device(x, nc, x_store);  // x now holds the values stored
    float *d_w = check_to_device(w, (size_t)C), *d_dy = check_to_device(dy, nc);
    float *d_dx = check_to_device(dx, nc), *d_dw = check_to_device(dw, (size_t)C);
    float *d_y = check_device_nan(nc), *d_rstd = check_device_nan((size_t)N);

    float *y = check_random(nc, 0, 1), *rstd = check_random((size_t)N, 0, 1);
    cpu()->rmsnorm_forward(y, STORE_FP32, rstd, x, STORE_FP32, w, N, C, eps);
    cpu()->rmsnorm_backward(dx, dw, dy, x, STORE_FP32, w, rstd, N, C);

    under()->rmsnorm_forward(d_y, STORE_FP32, d_rstd, d_x, x_store, d_w, N, C, eps);
    // the backward reads the cpu's rstd, so that it is checked on its own
    under()->rmsnorm_backward(d_dx, d_dw, d_dy, d_x, x_store, d_w, check_to_device(rstd, (size_t)N), N, C);

    // y stored as bf16 (gemm.h STORE_BF16, what --bf16 keeps of ln1): the fp32 y rounded as bf16_pack
    // rounds, exactly on the cpu; one bf16 step where another backend's fp32 values differ in the last bits
    float *d_y16 = check_device_nan((nc + 1) / 2), *d_rstd16 = check_device_nan((size_t)N);
    under()->rmsnorm_forward(d_y16, STORE_BF16, d_rstd16, d_x, x_store, d_w, N, C, eps);
    float *y_rounded = check_host_copy(y, nc);
    for (size_t i = 0; i < nc; i++) y_rounded[i] = bf16_to_float(bf16_from_float_flushed(y[i]));
    int on_cpu = check_backend() == &check_backend_cpu;

    check_compare(name, "y", y, d_y, nc, TOL_FP32);
    check_compare(name, "y stored bf16", y_rounded, check_widened_from_device(d_y16, nc, STORE_BF16), nc,
                  on_cpu ? 0 : TOL_BF16);
    check_compare(name, "rstd", rstd, d_rstd, (size_t)N, TOL_FP32);
    check_compare(name, "rstd (y stored bf16)", rstd, d_rstd16, (size_t)N, TOL_FP32);
    check_compare(name, "dx", dx, d_dx, nc, TOL_FP32);
    check_compare(name, "dw", dw, d_dw, (size_t)C, TOL_FP32);
    check_free_all();
}

// ---- softmax -------------------------------------------------------------------------------------

static void check_softmax(int N, int C) {
    char name[96];
    snprintf(name, sizeof(name), "softmax N=%d C=%d", N, C);
    size_t nc = (size_t)N * C;
    float *x = check_random(nc, -6, 6), *dy = check_random(nc, -1, 1), *dx = check_random(nc, -1, 1);
    float *d_x = check_to_device(x, nc), *d_dy = check_to_device(dy, nc), *d_dx = check_to_device(dx, nc);
    float *d_y = check_device_nan(nc);

    float *y = check_random(nc, 0, 1);
    cpu()->softmax_forward(y, x, N, C);
    cpu()->softmax_backward(dx, y, dy, N, C);

    under()->softmax_forward(d_y, d_x, N, C);
    under()->softmax_backward(d_dx, check_to_device(y, nc), d_dy, N, C);

    check_compare(name, "y", y, d_y, nc, TOL_FP32);
    check_compare(name, "dx", dx, d_dx, nc, TOL_FP32);
    check_free_all();
}

// ---- SwiGLU --------------------------------------------------------------------------------------

// scaled: a row_scale; want_ds: a drow_scale output (the backward); gate and up stored as gu_store
// (the backend under test reads bf16 values, the cpu reference their fp32 copies)
static void check_swiglu(int M, int I, int scaled, int want_ds, Storage gu_store) {
    char name[112];
    snprintf(name, sizeof(name), "swiglu%s%s%s M=%d I=%d", scaled ? " row_scale" : "", want_ds ? " drow_scale" : "",
             gu_store == STORE_BF16 ? " gate/up bf16-stored" : "", M, I);
    size_t mi = (size_t)M * I;
    float *gate = check_random(mi, -4, 4), *up = check_random(mi, -2, 2), *dact = check_random(mi, -1, 1);
    float *row_scale = scaled ? check_random((size_t)M, 0, 1) : NULL;
    void *d_gate = check_stored_to_device(gate, mi, gu_store), *d_up = check_stored_to_device(up, mi, gu_store);
    float *d_dact = check_to_device(dact, mi);
    float *d_row_scale = scaled ? check_to_device(row_scale, (size_t)M) : NULL;
    float *d_act = check_device_nan(mi), *d_dgate = check_device_nan(mi), *d_dup = check_device_nan(mi);
    float *d_ds = want_ds ? check_device_nan((size_t)M) : NULL;

    float *act = check_random(mi, 0, 1), *dgate = check_random(mi, 0, 1), *dup = check_random(mi, 0, 1);
    float *ds = want_ds ? check_random((size_t)M, 0, 1) : NULL;
    cpu()->swiglu_forward(act, STORE_FP32, gate, up, STORE_FP32, row_scale, M, I);
    cpu()->swiglu_backward(dgate, dup, STORE_FP32, ds, dact, gate, up, STORE_FP32, row_scale, M, I);

    under()->swiglu_forward(d_act, STORE_FP32, d_gate, d_up, gu_store, d_row_scale, M, I);
    under()->swiglu_backward(d_dgate, d_dup, STORE_FP32, d_ds, d_dact, d_gate, d_up, gu_store, d_row_scale, M, I);
    // dgate and dup stored as bf16, rounded as bf16_pack rounds (drow_scale as with fp32 outputs)
    void *d_dgate16 = check_device_nan((mi + 1) / 2), *d_dup16 = check_device_nan((mi + 1) / 2);
    float *d_ds16 = want_ds ? check_device_nan((size_t)M) : NULL;
    under()->swiglu_backward(d_dgate16, d_dup16, STORE_BF16, d_ds16, d_dact, d_gate, d_up, gu_store, d_row_scale, M,
                             I);
    float *d_dgate_widened = check_widened_from_device(d_dgate16, mi, STORE_BF16);
    float *d_dup_widened = check_widened_from_device(d_dup16, mi, STORE_BF16);
    // act stored as bf16 (gemm.h STORE_BF16): each value rounded as bf16_pack rounds, read back
    // through bf16_unpack; one bf16 step apart at most where the fp32 values differ in the last bits
    float *d_act16 = check_device_nan((mi + 1) / 2), *d_act_widened = check_device_nan(mi);
    under()->swiglu_forward(d_act16, STORE_BF16, d_gate, d_up, gu_store, d_row_scale, M, I);
    under()->bf16_unpack(d_act_widened, d_act16, mi);
    float *act_rounded = check_host_copy(act, mi);
    for (size_t i = 0; i < mi; i++) act_rounded[i] = bf16_to_float(bf16_from_float_flushed(act[i]));

    // on the cpu, bf16-stored gate and up give the bits of their fp32 copies
    int on_cpu = check_backend() == &check_backend_cpu;
    double tol = gu_store == STORE_BF16 && on_cpu ? 0 : TOL_FP32;
    check_compare(name, "act", act, d_act, mi, tol);
    check_compare(name, "act stored bf16", act_rounded, d_act_widened, mi, on_cpu ? 0 : TOL_BF16);
    check_compare(name, "dgate", dgate, d_dgate, mi, tol);
    check_compare(name, "dup", dup, d_dup, mi, tol);
    if (want_ds) check_compare(name, "drow_scale", ds, d_ds, (size_t)M, tol);
    float *dgate_rounded = check_host_copy(dgate, mi), *dup_rounded = check_host_copy(dup, mi);
    for (size_t i = 0; i < mi; i++) {
        dgate_rounded[i] = bf16_to_float(bf16_from_float_flushed(dgate[i]));
        dup_rounded[i] = bf16_to_float(bf16_from_float_flushed(dup[i]));
    }
    check_compare(name, "dgate stored bf16", dgate_rounded, d_dgate_widened, mi, on_cpu ? 0 : TOL_BF16);
    check_compare(name, "dup stored bf16", dup_rounded, d_dup_widened, mi, on_cpu ? 0 : TOL_BF16);
    if (want_ds) check_compare(name, "drow_scale (bf16 dgate, dup)", ds, d_ds16, (size_t)M, tol);
    check_free_all();
}

// ---- RoPE ----------------------------------------------------------------------------------------

// explicit: positions and key_start given (random), else NULL with pos0 > 0
static void check_rope(const char *layout_name, RopeLayout l, int B, int T, int explicit_positions) {
    enum { MAX_POS = 64, POS0 = 5 };
    char name[128];
    snprintf(name, sizeof(name), "rope %s%s B=%d T=%d", layout_name, explicit_positions ? " positions" : "", B, T);
    int N = B * T;
    size_t n = (size_t)N * l.row_stride;
    float *cos_sin = check_random((size_t)MAX_POS * l.dim, 0, 1);  // overwritten by rope_table
    rope_table(cos_sin, MAX_POS, l.dim, 10000.0);
    float *x = check_random(n, -2, 2), *dx = check_random(n, -2, 2);
    int32_t *positions = explicit_positions ? check_random_ints((size_t)N, 0, MAX_POS) : NULL;
    int32_t *key_start = explicit_positions ? check_random_ints((size_t)N, 0, T) : NULL;
    float *d_cos_sin = check_to_device(cos_sin, (size_t)MAX_POS * l.dim);
    float *d_x = check_to_device(x, n), *d_dx = check_to_device(dx, n);
    TokenLayout host = {.B = B, .T = T, .pos0 = POS0, .positions = positions, .key_start = key_start};
    TokenLayout device = host;
    if (explicit_positions) {
        device.positions = check_ints_to_device(positions, (size_t)N);
        device.key_start = check_ints_to_device(key_start, (size_t)N);
    }

    cpu()->rope_forward(x, cos_sin, &host, &l);
    cpu()->rope_backward(dx, cos_sin, &host, &l);
    under()->rope_forward(d_x, d_cos_sin, &device, &l);
    under()->rope_backward(d_dx, d_cos_sin, &device, &l);

    // the whole rows: elements outside the rotated pairs must come back unchanged
    check_compare(name, "x", x, d_x, n, TOL_FP32);
    check_compare(name, "dx", dx, d_dx, n, TOL_FP32);
    check_free_all();
}

static void check_rope_layouts(void) {
    // rotate-half over whole heads (Hugging Face)
    RopeLayout heads = rope_layout_heads(4, 16);
    // rotate-half over the first 8 of 24-wide heads, rows padded by 5
    RopeLayout partial = {.heads = 3, .dim = 8, .head_stride = 24, .row_stride = 3 * 24 + 5, .interleaved = 0};
    // interleaved pairs (DeepSeek-V3's MLA), strided heads and rows
    RopeLayout mla = {.heads = 3, .dim = 8, .head_stride = 24, .row_stride = 3 * 24 + 7, .interleaved = 1};
    // one shared interleaved rope key per row inside a wider row
    RopeLayout mla_key = {.heads = 1, .dim = 64, .head_stride = 64, .row_stride = 100, .interleaved = 1};
    const struct {
        const char *name;
        RopeLayout l;
    } layouts[] = {{"heads", heads}, {"rotate-half strided", partial}, {"interleaved", mla}, {"interleaved key", mla_key}};
    const int shapes[][2] = {{1, 1}, {2, 7}, {3, 19}};
    for (int i = 0; i < COUNT(layouts); i++)
        for (int s = 0; s < COUNT(shapes); s++)
            for (int explicit_positions = 0; explicit_positions <= 1; explicit_positions++)
                check_rope(layouts[i].name, layouts[i].l, shapes[s][0], shapes[s][1], explicit_positions);
}

// ---- cross-entropy ---------------------------------------------------------------------------------

static void check_cross_entropy(int N, int V) {
    char name[96];
    snprintf(name, sizeof(name), "cross_entropy N=%d V=%d", N, V);
    size_t nv = (size_t)N * V;
    float *logits = check_random(nv, -8, 8), *weight = check_random((size_t)N, 0.1f, 2);
    for (int n = 1; n < N; n += 3) weight[n] = 0;  // masked rows: their gradient is 0
    int32_t *targets = check_random_ints((size_t)N, 0, V);
    float *d_logits = check_to_device(logits, nv), *d_weight = check_to_device(weight, (size_t)N);
    int32_t *d_targets = check_ints_to_device(targets, (size_t)N);
    float *d_losses = check_device_nan((size_t)N), *d_lse = check_device_nan((size_t)N);
    float *d_dlogits = check_device_nan(nv);

    float *losses = check_random((size_t)N, 0, 1), *lse = check_random((size_t)N, 0, 1);
    float *dlogits = check_random(nv, 0, 1);
    cpu()->cross_entropy_forward(losses, lse, logits, targets, N, V);
    cpu()->cross_entropy_backward(dlogits, logits, lse, targets, weight, N, V);

    under()->cross_entropy_forward(d_losses, d_lse, d_logits, d_targets, N, V);
    // the backward reads the cpu's lse, so that it is checked on its own
    under()->cross_entropy_backward(d_dlogits, d_logits, check_to_device(lse, (size_t)N), d_targets, d_weight, N, V);

    check_compare(name, "losses", losses, d_losses, (size_t)N, TOL_FP32);
    check_compare(name, "lse", lse, d_lse, (size_t)N, TOL_FP32);
    check_compare(name, "dlogits", dlogits, d_dlogits, nv, TOL_FP32);
    check_free_all();
}

// ---- AdamW -------------------------------------------------------------------------------------------

static void check_adamw(size_t n, int decay, long step) {
    char name[96];
    snprintf(name, sizeof(name), "adamw%s n=%zu step=%ld", decay ? " decay" : "", n, step);
    AdamWStep h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
    float *p = check_random(n, -1, 1), *g = check_random(n, -1, 1);
    float *m = check_random(n, -0.1f, 0.1f), *v = check_random(n, 0, 0.01f);
    float *d_p = check_to_device(p, n), *d_g = check_to_device(g, n);
    float *d_m = check_to_device(m, n), *d_v = check_to_device(v, n);

    cpu()->adamw_update(p, g, m, v, n, decay, &h);
    under()->adamw_update(d_p, d_g, d_m, d_v, n, decay, &h);

    check_compare(name, "p", p, d_p, n, TOL_FP32);
    check_compare(name, "m", m, d_m, n, TOL_FP32);
    check_compare(name, "v", v, d_v, n, TOL_FP32);
    check_free_all();
}

// AdamW with narrow moments (adamw_update_scaled): a few steps from zero moments, so the
// scales come from the op itself; the stored moments are compared decoded, within a
// few units of their type's last place (a rounding that lands the other side of a
// boundary on the backend under test changes one element by one such unit).
static const char *const MOMENT_NAMES[MOMENT_DTYPES] = {"fp32", "bf16", "fp16", "fp8"};
static const double MOMENT_TOL[MOMENT_DTYPES] = {TOL_FP32, 1.0 / 64, 1.0 / 512, 1.0 / 4};

static float *decoded_moment(const void *data, MomentDtype d, float scale, size_t n) {
    float *out = check_random(n, 0, 1);  // freed with the check's buffers
    MomentFactors f = moment_factors(d, scale);
    for (size_t i = 0; i < n; i++) out[i] = moment_load(data, i, d, f);
    return out;
}

static void check_adamw_scaled(size_t n, MomentDtype dm, MomentDtype dv, int decay) {
    char name[96];
    snprintf(name, sizeof(name), "adamw_scaled m=%s v=%s%s n=%zu", MOMENT_NAMES[dm], MOMENT_NAMES[dv],
             decay ? " decay" : "", n);
    MomentDtype dtype[ADAMW_MOMENTS] = {dm, dv};
    float *p = check_random(n, -1, 1), *g = check_random(n, -1, 1);
    void *m = calloc(n, moment_bytes(dm)), *v = calloc(n, moment_bytes(dv));
    MomentScales s = {{1, 1}, {0, 0}};
    float *d_p = check_to_device(p, n), *d_g = check_to_device(g, n);
    void *d_m = check_device_bytes(m, n * moment_bytes(dm)), *d_v = check_device_bytes(v, n * moment_bytes(dv));
    MomentScales *d_s = check_device_bytes(&s, sizeof(s));
    for (long step = 1; step <= 3; step++) {
        AdamWStep h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
        cpu()->adamw_update_scaled(p, g, m, v, &s, n, decay, &h, dtype);
        under()->adamw_update_scaled(d_p, d_g, d_m, d_v, d_s, n, decay, &h, dtype);
    }
    check_finish();
    MomentScales test_s;
    check_download(&test_s, d_s, sizeof(test_s));
    void *test_m = malloc(n * moment_bytes(dm)), *test_v = malloc(n * moment_bytes(dv));
    check_download(test_m, d_m, n * moment_bytes(dm));
    check_download(test_v, d_v, n * moment_bytes(dv));
    // a moment element rounded the other way changes its parameter's next updates by up to lr
    check_compare(name, "p", p, d_p, n, dm == MOMENT_FP32 && dv == MOMENT_FP32 ? TOL_FP32 : 5e-3);
    check_compare_double(name, "scale m", s.scale[0], test_s.scale[0], TOL_FP32);
    check_compare_double(name, "scale v", s.scale[1], test_s.scale[1], TOL_FP32);
    check_compare(name, "m", decoded_moment(m, dm, s.scale[0], n),
                  check_to_device(decoded_moment(test_m, dm, test_s.scale[0], n), n), n, MOMENT_TOL[dm]);
    check_compare(name, "v", decoded_moment(v, dv, s.scale[1], n),
                  check_to_device(decoded_moment(test_v, dv, test_s.scale[1], n), n), n, MOMENT_TOL[dv]);
    free(m), free(v), free(test_m), free(test_v);
    check_free_all();
}

// ---- all -------------------------------------------------------------------------------------------

void check_elementwise_ops(void) {
    const size_t lengths[] = {1, 3, 257, 4097, 3000001};  // the last spans many blocks of the sum
    for (int i = 0; i < COUNT(lengths); i++) {
        check_vectors(lengths[i]);
        check_clamp(lengths[i]);
    }
    for (int r = 0; r < COUNT(ROWS); r++)
        for (int c = 0; c < COUNT(COLS); c++) {
            int N = ROWS[r], C = COLS[c];
            check_embedding(N, C, 1000);
            check_embedding(N, C, 50);  // many repeated tokens
            check_rmsnorm(N, C, STORE_FP32);
            check_rmsnorm(N, C, STORE_BF16);
            check_softmax(N, C);
            check_cross_entropy(N, C);
            for (int variant = 0; variant < 8; variant++)
                check_swiglu(N, C, variant & 1, (variant >> 1) & 1, variant >> 2 ? STORE_BF16 : STORE_FP32);
        }
    check_dropout(1, 1, 0.5);
    check_dropout(257, 4097, 0.1);
    check_dropout(3, 64, 0.9);
    check_embedding(4099, 64, 1);       // one run of every token: the unrolled loads and a tail
    check_embedding(1000, 3, 262144);   // a large vocabulary, mostly unique tokens
    check_embedding(20000, 130, 7);     // a few very long runs
    check_rmsnorm(5000, 64, STORE_FP32);  // many row chunks in the dw sum
    check_rmsnorm(5000, 64, STORE_BF16);
    check_cross_entropy(5, 50000);      // a large vocabulary
    check_cross_entropy(2, 262144);
    check_rope_layouts();
    // more rows than a grid's y extent (65535): the row loops of the column-tile kernels
    check_embedding(70000, 2, 1000);
    check_swiglu(70000, 3, 1, 1, STORE_FP32);
    check_swiglu(300, 600, 1, 1, STORE_BF16);  // rows longer than the cpu's chunks
    check_cross_entropy(70000, 3);
    check_rope("heads", rope_layout_heads(1, 4), 700, 100, 1);
    for (int i = 0; i < COUNT(lengths); i++)
        for (int decay = 0; decay <= 1; decay++) {
            check_adamw(lengths[i], decay, 1);
            check_adamw(lengths[i], decay, 1000);
        }
    const MomentDtype pairs[][ADAMW_MOMENTS] = {{MOMENT_FP32, MOMENT_FP32}, {MOMENT_BF16, MOMENT_BF16},
                                                {MOMENT_FP16, MOMENT_FP16}, {MOMENT_FP8, MOMENT_FP8},
                                                {MOMENT_FP8, MOMENT_FP16}, {MOMENT_FP32, MOMENT_BF16}};
    for (int i = 0; i < COUNT(lengths); i++)
        for (int k = 0; k < COUNT(pairs); k++) check_adamw_scaled(lengths[i], pairs[k][0], pairs[k][1], k & 1);
}
