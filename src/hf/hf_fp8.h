// hf_fp8.h — DeepSeek-V3-style FP8 weights in a Hugging Face model directory
// (--ckpt-dtype fp8 writes them, hf_weights.c reads them): a weight matrix stored as
// F8_E4M3 with a companion "<name>_scale_inv" F32 tensor holding one dequantization factor
// per 128×128 block, [ceil(rows/128), ceil(cols/128)] row-major; value = code · scale_inv of
// its block. config.json says so with "quantization_config" {"quant_method": "fp8", "fmt":
// "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}.
#pragma once
#include "core/tensor_table.h"

enum { HF_FP8_BLOCK = 128 };
#define HF_FP8_SCALE_SUFFIX "_scale_inv"

// The tensors --ckpt-dtype fp8 stores in FP8, as DeepSeek-V3's checkpoint does: the weight
// matrices of the linear layers inside the decoder layers (attention projections, dense,
// routed-expert and shared-expert MLPs). Embeddings, lm_head, norms, the router, the expert
// bias and the shared-expert gate are not.
int hf_fp8_quantized(const TensorDesc *d);

// The block grid of a [rows, cols] matrix: out = {ceil(rows/128), ceil(cols/128)}; returns
// out[0] · out[1].
int64_t hf_fp8_scale_shape(const int64_t *shape, int64_t out[2]);

// 1 when every side of shape is at most 128 or a multiple of 128: the grid alone then
// gives the block size, which transformers' dequantizing load (on CPU) assumes (it divides
// each side by its number of blocks); moetron reads any shape.
int hf_fp8_sides_aligned(const int64_t *shape);

// x (rows × cols, row-major) as E4M3 codes and the block factors scale_inv (the grid above),
// with the arithmetic of the Float8BlockScaling quantizer (ops/quantize_math.h) with
// power-of-2 scales off, as DeepSeek-V3's checkpoint and transformers' Fp8Quantize: per
// block scale = 448 / amax (1 for a block of zeros), code = saturating E4M3 of x · scale,
// scale_inv = 1 / scale. So |x − code · scale_inv| ≤ 2^-4 · amax of the block (E4M3 keeps
// 3 mantissa bits; the subnormal codes are finer still).
void hf_fp8_quantize(uint8_t *codes, float *scale_inv, const real *x, int64_t rows, int64_t cols);
