// ops.h — the backend-neutral operations the model is written in.
//
// The dense math of the model goes through these; the cpu backend (src/ops/cpu/)
// implements them with OpenMP, a GPU backend implements the same signatures over device
// pointers. The MoE layer's per-token work (router logits, routing, permute/unpermute)
// is here too; its bookkeeping over tokens (the dispatch plan's counting sort, capacity
// dropping, counts and losses) stays host code in src/moe/. Conventions:
//   * row-major; N = number of tokens in the micro-batch (flattened b*T + t);
//   * *_backward functions ACCUMULATE (+=) into parameter gradients and, unless noted,
//     into input gradients, so that residual branches add up without extra copies;
//   * every reduction has a fixed order: results do not depend on the thread count.
#pragma once
#include "core/common.h"
#include "ops/gemm.h"

// ---- linear layers (no bias): y = x·Wᵀ, W stored [out, in] like Hugging Face -------
// x (N,in), W (out,in) -> y (N,out)
void linear_forward(real *y, const real *x, const real *W, int N, int in, int out);
// dy (N,out): dx (N,in) += dy·W (skipped when dx NULL); dW (out,in) += dyᵀ·x
void linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N,
                     int in, int out);

// ---- elementwise ---------------------------------------------------------------------
void vec_copy(real *dst, const real *src, size_t n);
void vec_zero(real *x, size_t n);
void vec_add(real *y, const real *x, size_t n);            // y += x
void vec_scale(real *x, real s, size_t n);                 // x *= s
double vec_sum_squares(const real *x, size_t n);           // fixed-order double sum
// sum[0] (tensor memory, overwritten) = vec_sum_squares(x, n), bit for bit, left on the device:
// many sums, then one download of them all (the host waits once, not per sum).
void vec_sum_squares_to(double *sum, const real *x, size_t n);
// count[0] (tensor memory, overwritten) = how many of x[0, n) are zero (+0 or −0; NaN is not),
// exact up to 2⁵³ (--log-num-zeros-in-grad).
void vec_count_zeros_to(double *count, const real *x, size_t n);

// ---- bf16 transport: values only bf16-input GEMMs read, moved at half the bytes ----------------
// x (n, n even) -> packed (n/2 reals): element i as bf16 rounded as the cpu GEMM rounds its bf16
// inputs (bf16_from_float_flushed: nearest even, fp32 subnormals ±0), the uint16_t array at
// packed holding element i at index i. The real slots are only moved, never computed on.
void bf16_pack(real *packed, const real *x, size_t n);
// packed (n/2 reals) -> x (n): the values bf16_pack kept, exactly.
void bf16_unpack(real *x, const real *packed, size_t n);

// ---- embedding ------------------------------------------------------------------------
// tokens (N), table (V,C) -> out (N,C)
void embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C);
// dtable (V,C) += scatter of dout (N,C) by token, tokens summed in order
void embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C);

// ---- RMSNorm: y = x · rsqrt(mean(x²) + eps) · w  (statistics in double) ---------------
// x (N,C) stored as x_store (ops/gemm.h Storage: bf16 values read widened, exactly: the residual
// stream under --bf16), w (C) -> y (N,C) stored as y_store (STORE_BF16 rounds each fp32 result
// once, as bf16_pack does: what --bf16 keeps of a norm only GEMMs read), rstd (N)
void rmsnorm_forward(void *y, Storage y_store, real *rstd, const void *x, Storage x_store, const real *w, int N, int C,
                     real eps);
// dx (N,C) += ..., dw (C) += ... ; rows summed in order for dw; x stored as x_store
void rmsnorm_backward(real *dx, real *dw, const real *dy, const void *x, Storage x_store, const real *w,
                      const real *rstd, int N, int C);

// ---- the residual connection: y (n) = x + branch --------------------------------------
// x stored as x_store, y as y_store (ops/gemm.h Storage: bf16 read widened, exactly / written
// rounded once from the fp32 sum, as bf16_pack rounds: the residual stream under --bf16);
// y may be x when both are stored alike.
void residual_add(void *y, Storage y_store, const void *x, Storage x_store, const real *branch, size_t n);

// ---- rotary position embedding ---------------------------------------------------------
// Rotates pairs of every head by angle pos·base^(−2i/dim): pairs (i, i + dim/2) in the
// Hugging Face rotate-half layout, or (2i, 2i + 1) when interleaved (DeepSeek-V3's MLA).
// cos_sin (max_pos, dim/2, 2) precomputed by rope_table.
void rope_table(real *cos_sin, int max_pos, int dim, double base);
// The plain inverse frequencies inv_freq[i] = base^(−2i/dim), i < dim/2 (computed in double,
// rounded to float), and the table of any frequencies (model/rope_scaling.h scales them):
// cos_sin[p][i] = (cos(p·inv_freq[i]), sin(p·inv_freq[i])) · scale, angle and products in float.
void rope_plain_inv_freq(float *inv_freq, int dim, double base);
void rope_table_from(real *cos_sin, int max_pos, int half, const float *inv_freq, float scale);
typedef struct {
    int heads;        // rotated vectors per token row
    int dim;          // rotary width of each (even)
    int head_stride;  // elements between the heads of one row
    int row_stride;   // elements between token rows
    int interleaved;  // pairs (2i, 2i + 1) instead of (i, i + dim/2)
} RopeLayout;
// The layout of x (N, heads, d) fully rotated in rotate-half pairs.
RopeLayout rope_layout_heads(int heads, int head_dim);
// The tokens of a micro-batch: N = B·T, token n in batch row n / T. Its position is
// positions[n] (NULL: pos0 + n % T); it sees the keys of its row from key_start[n] on
// (NULL: 0) — both restart at document boundaries with --reset-position-ids /
// --reset-attention-mask.
typedef struct {
    int B, T, pos0;
    const int32_t *positions, *key_start;
} TokenLayout;
// x: the first rotary element of head 0 of token 0, in place.
void rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
// the inverse rotation applied to the gradient, in place
void rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);

// ---- clamp to [−limit, limit] ---------------------------------------------------------------
// y = clamp(x) (y may be x); backward: dx = dy where −limit ≤ x ≤ limit, else 0 (in place on d)
void clamp_forward(real *y, const real *x, size_t n, real limit);
void clamp_backward(real *d, const real *x, size_t n, real limit);

// ---- dropout: inverted, its mask a hash of the element's coordinates (ops/dropout_math.h) ---
// One site's mask over one micro-batch: element (row, col) is kept when its hash clears
// threshold, and a kept value is multiplied by scale; threshold 0 keeps everything.
typedef struct {
    uint64_t stream;     // the site's stream (model/dropout.c: run, micro-batch, layer, site)
    uint32_t threshold;  // floor(p·2³²)
    real scale;          // (real)(1 / (1 − p))
} DropoutMask;
typedef struct {
    DropoutMask mask;
    int rows, cols;
    int row_first;             // the global row of row 0 (row_index NULL)
    const int32_t *row_index;  // (rows) each row's global row, or NULL
} DropoutShape;
// y (rows, cols) = x ⊙ kept · scale, element (r, c) hashed as (row_index[r] or row_first + r, c);
// y may be x. The same call is its own backward (on the gradient).
void dropout_apply(real *y, const real *x, const DropoutShape *s);

// ---- causal attention, flash style: no (T×T) matrix is kept, only each row's lse -----
// Positions: query t (0 ≤ t < Tq) of batch row b sits at position q_pos0 + t, key j
// (0 ≤ j < Tk) at position k_pos0 + j. The query sees key j when
//     key_start(b, t) ≤ k_pos0 + j ≤ q_pos0 + t,   key_start(b, t) = key_start[b·Tq + t] or 0,
// so key_start is a position (with k_pos0 = 0, the index of the first key the query sees).
// Every caller but context parallelism has k_pos0 = 0; a context-parallel ring gives each
// block of keys its position and merges the blocks' results with attention_merge.
// A query that sees no key of the block gets out = 0 and lse = −∞ and adds nothing to any
// gradient.
typedef struct {
    int B, Tq, Tk;       // batch, query tokens per row, key tokens per row (visible window)
    int q_pos0;          // position of the first query token (Tk − Tq in training: 0)
    int k_pos0;          // position of key 0 of each row (0: keys are their positions)
    int heads, kv_heads; // GQA: query head h uses kv head h / (heads / kv_heads)
    int head_dim;        // width of q and k per head
    int v_head_dim;      // width of v and out per head (0 = head_dim)
    int kv_row_stride;   // rows between batch rows in k/v (Tk in training, cache capacity)
    real scale;          // usually 1/sqrt(head_dim)
    const int32_t *key_start;  // (B·Tq) position of the first key each query may see (NULL: 0)
    // Attention dropout on the probabilities (threshold 0: none): P·V becomes (P ⊙ Z)·V with
    // Z = kept·scale, the lse staying that of the undropped P. The element of query t and key
    // j of batch row b and head h is hashed as row ((b·2¹⁶ + head_first + h)·2³² + q_pos0 + t),
    // column k_pos0 + j: global head and positions, the same under any split of heads or keys.
    DropoutMask dropout;
    int head_first;            // the global index of head 0
    // How q, k and v, and out are stored (gemm.h Storage; left zero: fp32). Stored bf16, q, k
    // and v are read widened, exactly, so that the products (bf16-input GEMMs) are those of the
    // fp32 tensors they were rounded from; a bf16 out is written rounded once as bf16_pack
    // rounds, and the backward's D reads those values (as FlashAttention in bf16 does).
    Storage q_store, kv_store, out_store;
} AttentionShape;
// q (B·Tq, heads, d), k (B·kv_row_stride, kv_heads, d), v (B·kv_row_stride, kv_heads, dv)
// -> out (B·Tq, heads, dv), stored as s says,
// lse (B, heads, Tq) = logsumexp of the scaled scores of each query over the keys it sees
void attention_forward(void *out, real *lse, const void *q, const void *k, const void *v,
                       const AttentionShape *s);
// dq, dk, dv accumulate (+=); deterministic: each kv head's gradients are owned by one thread.
// P = e^(scale·q·k − lse) and D = rowsum(dout ⊙ out): given the out and lse merged over
// every key block (attention_merge), each block's call adds that block's share of dq and
// the block's whole dk, dv, so the sums over the blocks are the unsplit gradients.
// With dropout (out the dropped output): dV += (P⊙Z)ᵀ·dout, dS = P ⊙ (Z ⊙ dout·Vᵀ − D)·scale,
// D = rowsum(dout ⊙ out) still, since Σ_j P_j Z_j (dout·V_j) = dout·out.
void attention_backward(real *dq, real *dk, real *dv, const real *dout, const void *out,
                        const real *lse, const void *q, const void *k, const void *v,
                        const AttentionShape *s);
// Merges the result (out_block, lse_block) of the same queries over another block of keys
// into (out, lse), shapes as attention_forward's out and lse (B, Tq, heads, v_head_dim of s;
// both outs fp32, whatever s->out_store says):
//     lse' = logaddexp(lse, lse_block),  out = e^(lse − lse')·out + e^(lse_block − lse')·out_block
// A side with lse = −∞ (no key seen) has weight 0: out and lse are left as they are when
// lse_block = −∞, and become out_block, lse_block when lse = −∞. Elementwise, so merging
// the blocks in a fixed order gives the same bits every time.
void attention_merge(real *out, real *lse, const real *out_block, const real *lse_block,
                     const AttentionShape *s);

// ---- SwiGLU with an optional per-row scale (the MoE routing prob) --------------------
// gate, up (M,I; both stored as gu_store, gemm.h: bf16 values read widened, exactly, so the result
// is that of their fp32 copies), row_scale (M) or NULL -> act (M,I) = silu(gate) · up · row_scale,
// stored as act_store (STORE_BF16: each value rounded as bf16_pack rounds)
void swiglu_forward(void *act, Storage act_store, const void *gate, const void *up, Storage gu_store,
                    const real *row_scale, int M, int I);
// dact (M,I) -> dgate, dup (M,I) overwritten, stored as d_store (STORE_BF16: each value rounded as
// bf16_pack rounds; what only bf16-input GEMMs read next); drow_scale (M) overwritten when
// non-NULL; gate, up stored as gu_store (as swiglu_forward)
void swiglu_backward(void *dgate, void *dup, Storage d_store, real *drow_scale, const real *dact, const void *gate,
                     const void *up, Storage gu_store, const real *row_scale, int M, int I);

// ---- softmax over the last axis: x (N,C) -> y (N,C) -----------------------------------
void softmax_forward(real *y, const real *x, int N, int C);
// y (N,C) the softmax output, dy (N,C) -> dx (N,C) += y ⊙ (dy − Σ y·dy)
void softmax_backward(real *dx, const real *y, const real *dy, int N, int C);

// ---- cross-entropy ----------------------------------------------------------------------
// logits (N,V), targets (N) -> lse (N) = logsumexp(logits), losses (N) = lse − logits[target]
void cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V);
// dlogits (N,V) = (softmax(logits) − onehot(target)) · weight[n]   (overwritten); lse from forward
void cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                            const real *weight, int N, int V);

// ---- AdamW (decoupled weight decay), one contiguous range --------------------------------
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    long step;  // 1-based, for bias correction
    // Each gradient is first multiplied by this rounded to the compute type (gradient
    // clipping's coefficient: the bits of scaling the gradients in place); 0 (or anything not
    // above 0): not scaled, so a step spelled without it is unscaled.
    double grad_scale;
} AdamWStep;
// p, m, v updated in place from g; weight decay applied only when decay != 0
void adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay,
                  const AdamWStep *h);

// How a moment is stored with --use-precision-aware-optimizer (--exp-avg-dtype,
// --exp-avg-sq-dtype): real (as adamw_update), bfloat16, IEEE half with a scale, or FP8 E4M3
// with a scale (the arithmetic: ops/adamw_moments.h).
typedef enum { MOMENT_FP32, MOMENT_BF16, MOMENT_FP16, MOMENT_FP8, MOMENT_DTYPES } MomentDtype;
enum { ADAMW_MOMENTS = 2 };  // exp_avg, exp_avg_sq
// One contiguous range's scale per moment (tensor memory), as Transformer Engine's FusedAdam
// keeps one per parameter: fp16: the stored values times scale are the moment; fp8: the
// moment times scale is what was stored (the quantizer's scale); 1 otherwise. absmax is the
// op's scratch.
typedef struct {
    float scale[ADAMW_MOMENTS];
    float absmax[ADAMW_MOMENTS];
} MomentScales;
// adamw_update with the moments m, v (n) stored as dtype[0], dtype[1]: each decoded with its
// scale, stepped in the compute type, its new scale taken from the new moment's largest
// magnitude (fp16: |m| max / (65504 / 2); fp8: 448 / |m| max; 1 when every value is 0), and
// stored with it (rounded to nearest even; FP8 saturating). s: tensor memory, updated.
void adamw_update_scaled(real *p, const real *g, void *m, void *v, MomentScales *s, size_t n, int decay,
                         const AdamWStep *h, const MomentDtype dtype[ADAMW_MOMENTS]);

// ---- MoE: router logits, per-token routing, permute / unpermute ---------------------------
// logits (N,E) = x (N,H) · W (E,H)ᵀ, each dot product summed in double over h = 0..H−1 in
// order and stored as real (the router in fp64, --moe-router-dtype fp64)
void moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E);

typedef enum { SCORE_SOFTMAX, SCORE_SIGMOID, SCORE_SQRTSOFTPLUS } ScoreFunction;
// What moe_route_tokens needs of the router's configuration (src/moe/router.h).
typedef struct {
    int E, k;
    ScoreFunction score;
    int pre_softmax;             // softmax: select on softmax(l) instead of l
    double topk_scaling;         // 0 = none
    int num_groups, group_topk;  // 0 = no group limit
    int replay;                  // topk_idx holds the picks already (router replay): no selection
} RouteShape;
// The per-token part of the router, every token on its own, all arithmetic in double
// (src/ops/moe_route.h has the formulas; src/moe/router.h the definitions):
//   scores (N,E)      softmax / sigmoid / sqrtsoftplus of the token's logits
//   aux_scores (N,E)  ŝ: softmax as is, the others divided by (Σ_E s + 1e-20)
//   topk_idx (N,k)    the k experts with the largest selection values, in selection order,
//                     lowest index on ties, within the group_topk best groups when grouped;
//                     selection values: logits (softmax), softmax (pre), s + expert_bias.
//                     With r->replay an input: the picks are kept (k distinct experts each)
//   topk_probs (N,k)  probs of the chosen experts × topk_scaling, before capacity dropping
// logits (N,E), expert_bias (E) or NULL (sigmoid / sqrtsoftplus only).
void moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                      const real *expert_bias, int N, const RouteShape *r);

// Permute (dispatch) with a plan of R rows (src/moe/dispatcher.h):
// x (N,H) stored as x_store (gemm.h; bf16 values read widened, exactly) -> rows (R,H):
// rows[r] = x[token_of_row[r]], zeros where token_of_row[r] = −1 (padding), stored as rows_store
// (STORE_BF16: rounded as bf16_pack rounds); when row_values (R) is non-NULL, row_values[r] = choice_values[n·k + j] for
// the choice with row_of_choice[n·k + j] = r (0 for padding, and for a row of token n no
// choice points at: an aligned plan's padding, ops_dispatch.h). token_of_row (R),
// row_of_choice (N·k) with −1 for dropped choices.
void moe_permute(void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,
                 const real *choice_values, const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k,
                 int H);
// Unpermute (combine): rows (R,H) -> out (N,H), out[n] = Σ_j rows[row_of_choice[n·k + j]]
// over j = 0..k−1 in order, dropped choices (−1) skipped; accumulate: += instead of =.
// When choice_values (N,k) is non-NULL, also choice_values[i] = row_values[row_of_choice[i]]
// (0 when dropped); out may be NULL to gather these alone. No atomics: each token's sum
// has one owner.
void moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                   const int32_t *row_of_choice, int N, int k, int H, int accumulate);
