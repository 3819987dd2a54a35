// loss_vocab.cu — the vocab-parallel embedding's and cross-entropy's ops of ops_loss.h for
// the cuda backend, with the arithmetic of src/ops/cpu/loss.c: slice rows and the masked
// fix-up elementwise, the embedding gradient one thread per channel over the tokens in
// order, row maxima (exact) and Σ e^(x − max) in double with one block per row (fixed tree).
#include "ops/cuda/block_reduce.cuh"

constexpr int VOCAB_ELEM_THREADS = 256;
constexpr int VOCAB_ROW_MAX_THREADS = 512;

// The token's row in the slice [first, first + vocab), or −1 when another rank holds it.
__device__ __forceinline__ int32_t slice_row(int first, int vocab, int32_t token) {
    int32_t row = token - first;
    return row >= 0 && row < vocab ? row : -1;
}

__global__ void vocab_slice_rows_kernel(int32_t *rows, const int32_t *tokens, int first, int vocab, int32_t missing,
                                        int N) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        int32_t row = slice_row(first, vocab, tokens[n]);
        rows[n] = row >= 0 ? row : missing;
    }
}

void cuda_vocab_slice_rows(int32_t *rows, const int32_t *tokens, int first, int vocab, int32_t missing, int N) {
    if (N <= 0) return;
    vocab_slice_rows_kernel<<<cuda_blocks((size_t)N, VOCAB_ELEM_THREADS), VOCAB_ELEM_THREADS, 0, cuda_stream()>>>(
        rows, tokens, first, vocab, missing, N);
    CUDA_CHECK_LAUNCH();
}

// thread → channel c; the tokens in order n = 0, 1, ...: each element has one owner
__global__ void vocab_embedding_grad_kernel(float *dtable, const float *dout, const int32_t *rows, int N, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        for (int n = 0; n < N; n++) {
            int32_t row = rows[n];
            if (row >= 0) dtable[(size_t)row * C + c] += dout[(size_t)n * C + c];
        }
}

void cuda_vocab_embedding_grad(real *dtable, const real *dout, const int32_t *rows, int N, int C) {
    if (N <= 0 || C <= 0) return;
    vocab_embedding_grad_kernel<<<cuda_blocks((size_t)C, VOCAB_ELEM_THREADS), VOCAB_ELEM_THREADS, 0,
                                  cuda_stream()>>>(dtable, dout, rows, N, C);
    CUDA_CHECK_LAUNCH();
}

// one block per row: every thread starts from row[0] (as the cpu), the block's max is exact
__global__ void vocab_row_max_kernel(float *maxima, const float *logits, int V) {
    const float *row = logits + (size_t)blockIdx.x * V;
    float mx = row[0];
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = row[v] > mx ? row[v] : mx;
    mx = block_max(mx);
    if (threadIdx.x == 0) maxima[blockIdx.x] = mx;
}

void cuda_vocab_row_max(real *maxima, const real *logits, int N, int V) {
    if (N <= 0 || V <= 0) return;
    vocab_row_max_kernel<<<N, row_threads(V, VOCAB_ROW_MAX_THREADS), 0, cuda_stream()>>>(maxima, logits, V);
    CUDA_CHECK_LAUNCH();
}

// one block per row n: the group's max over every[q·N + n] (q in order, each thread the
// same), then Σ_v e^(x − max) in double through the block's fixed tree
__global__ void vocab_row_stats_kernel(double *stats, float *maxima, const float *every, const float *logits,
                                       const int32_t *targets, int first, int P, int N, int V) {
    int n = blockIdx.x;
    float mx = every[n];
    for (int q = 1; q < P; q++) {
        float e = every[(size_t)q * N + n];
        mx = mx > e ? mx : e;  // MT_MAX(mx, e)
    }
    const float *row = logits + (size_t)n * V;
    double sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(row[v] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        int32_t target = slice_row(first, V, targets[n]);
        maxima[n] = mx;
        stats[n] = sum;
        stats[N + n] = target >= 0 ? (double)row[target] : 0.0;
    }
}

void cuda_vocab_row_stats(double *stats, real *maxima, const real *every, const real *logits, const int32_t *targets,
                          int first, int P, int N, int V) {
    if (N <= 0) return;
    vocab_row_stats_kernel<<<N, row_threads(V, VOCAB_ROW_MAX_THREADS), 0, cuda_stream()>>>(
        stats, maxima, every, logits, targets, first, P, N, V);
    CUDA_CHECK_LAUNCH();
}

__global__ void vocab_ce_finish_kernel(float *losses, float *lse, const float *maxima, const double *stats, int N) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        double row_lse = maxima[n] + log(stats[n]);
        lse[n] = (float)row_lse;
        losses[n] = (float)(row_lse - stats[N + n]);
    }
}

void cuda_vocab_ce_finish(real *losses, real *lse, const real *maxima, const double *stats, int N) {
    if (N <= 0) return;
    vocab_ce_finish_kernel<<<cuda_blocks((size_t)N, VOCAB_ELEM_THREADS), VOCAB_ELEM_THREADS, 0, cuda_stream()>>>(
        losses, lse, maxima, stats, N);
    CUDA_CHECK_LAUNCH();
}

// grid-stride over the rows n; the product rounded on its own (__fmul_rn), as the cpu's
__global__ void vocab_ce_foreign_targets_kernel(float *dlogits, const float *logits, const float *lse,
                                                const int32_t *targets, const float *weight, int first, int N,
                                                int V) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        if (slice_row(first, V, targets[n]) >= 0 || weight[n] == 0) continue;
        size_t at = (size_t)n * V;
        dlogits[at] = __fmul_rn(expf(logits[at] - lse[n]), weight[n]);
    }
}

void cuda_vocab_ce_foreign_targets(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                   const real *weight, int first, int N, int V) {
    if (N <= 0) return;
    vocab_ce_foreign_targets_kernel<<<cuda_blocks((size_t)N, VOCAB_ELEM_THREADS), VOCAB_ELEM_THREADS, 0,
                                      cuda_stream()>>>(dlogits, logits, lse, targets, weight, first, N, V);
    CUDA_CHECK_LAUNCH();
}
