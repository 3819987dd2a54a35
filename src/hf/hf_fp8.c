// hf_fp8.c — DeepSeek-V3-style FP8 weights (hf_fp8.h): which tensors, their block grid, and
// the host quantizer built from the Float8BlockScaling arithmetic of ops/quantize_math.h.
#include "hf/hf_fp8.h"

#include <string.h>

#include "ops/quantize_math.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int hf_fp8_quantized(const TensorDesc *d) {
    // the shared-expert gate [1, H] is a gate, kept as the router is; a multi-token-prediction
    // depth's eh_proj is BF16 in DeepSeek-V3's file (its MTP layer's decoder matrices are FP8)
    return d->ndim == 2 && d->layer >= 0 && !(d->flags & (TENSOR_ROUTER | TENSOR_NORM | TENSOR_NOT_TRAINED)) &&
           !ends_with(d->name, ".shared_expert_gate.weight") && !ends_with(d->name, ".eh_proj.weight");
}

int64_t hf_fp8_scale_shape(const int64_t *shape, int64_t out[2]) {
    out[0] = quant_blocks((int)shape[0], HF_FP8_BLOCK);
    out[1] = quant_blocks((int)shape[1], HF_FP8_BLOCK);
    return out[0] * out[1];
}

int hf_fp8_sides_aligned(const int64_t *shape) {
    for (int i = 0; i < 2; i++)
        if (shape[i] > HF_FP8_BLOCK && shape[i] % HF_FP8_BLOCK) return 0;
    return 1;
}

// DeepSeek-V3's scales: any fp32 value (no power-of-2 rounding), no amax floor.
static const Fp8BlockParams deepseek_blocks = {FP8_E4M3, HF_FP8_BLOCK, 0, 0.0f};

void hf_fp8_quantize(uint8_t *codes, float *scale_inv, const real *x, int64_t rows, int64_t cols) {
    int64_t grid[2];
    long tiles = (long)hf_fp8_scale_shape((int64_t[]){rows, cols}, grid);
#pragma omp parallel for schedule(static)  // tiles are independent: any thread count, same bytes
    for (long t = 0; t < tiles; t++) {
        QuantTile q = quant_tile(t, (int)rows, (int)cols, HF_FP8_BLOCK, HF_FP8_BLOCK);
        float amax = 0.0f;
        for (int r = q.r0; r < q.r1; r++)
            for (int c = q.c0; c < q.c1; c++) amax = quant_amax_fold(amax, (float)x[(size_t)r * cols + c], AMAX_IGNORE_NAN);
        float scale = fp8_block_scale(amax, &deepseek_blocks);
        scale_inv[t] = fp8_scale_inv(scale);
        for (int r = q.r0; r < q.r1; r++)
            for (int c = q.c0; c < q.c1; c++) {
                size_t i = (size_t)r * cols + c;
                codes[i] = fp8_code(FP8_E4M3, (float)x[i], scale);
            }
    }
}
