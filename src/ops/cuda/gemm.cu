// gemm.cu — the cuda backend's GEMMs: cuda_gemm, the two grouped GEMMs of the MoE layers
// and the linear layers built on cuda_gemm. Contracts: src/ops/gemm.h and src/ops/ops.h.
// Everything is queued on cuda_stream() through the handle of context.cu.
//
// Row-major data, column-major cuBLAS. A row-major matrix X [r, c] with leading dimension
// ld is, read column-major, Xᵀ [c, r] with the same ld. So the row-major problem
//     C[M,N] = alpha·op(A)[M,K]·op(B)[K,N] + beta·C
// is, for cuBLAS, the column-major problem
//     Cᵀ[N,M] = alpha·op(B)ᵀ[N,K]·op(A)ᵀ[K,M] + beta·Cᵀ
// one call with the operands swapped: cuBLAS's m = N, n = M, k = K, its A is our B (ld ldb),
// its B is our A (ld lda), its C is our C (ld ldc). The transpose flags carry over as they
// are: our B [K,N] (trans_b = 0) reads column-major as [N,K] = op(B)ᵀ, no transpose
// (CUBLAS_OP_N); our B [N,K] (trans_b = 1) reads as [K,N] = op(B), which op(B)ᵀ transposes
// (CUBLAS_OP_T); the same for A. cuBLAS's leading-dimension rules (ld ≥ rows of the stored
// column-major matrix) then are exactly gemm.h's: ldb ≥ N or K, lda ≥ K or M, ldc ≥ N.
//
// Precision. fp32: CUBLAS_COMPUTE_32F_PEDANTIC, fp32 multiplies and fp32 accumulation, never
// TF32, whatever the handle's math mode. After cuda_set_gemm_inputs(GEMM_INPUTS_BF16):
// CUBLAS_COMPUTE_32F_FAST_16BF, cuBLAS rounds the fp32 inputs to bf16 for the tensor cores,
// accumulates in fp32 and stores fp32; GEMM_INPUTS_FP16: CUBLAS_COMPUTE_32F_FAST_16F, the same
// with IEEE half inputs.
//
// gemm.h's edge cases: M == 0 or N == 0 returns before anything is queued; K == 0 or
// alpha == 0 scales C by beta with scale_c_kernel, so A and B are never read (cuBLAS does
// not document that it skips A and B for an alpha of 0, nor what k == 0 does with a beta of
// 0 and NaN in C); beta == 0 with K > 0 is cuBLAS's own: its contract is that C need not
// hold valid values when beta == 0.
//
// Grouped GEMMs (one problem per non-empty expert, groups with counts[g] == 0 skipped):
//   * the rows per group are tensor memory (gemm.h) and cuBLAS takes each problem's m or k
//     on the host: the caller's host_counts (the copy its layer pass downloaded with the
//     dispatch sizes) give them without waiting; without host_counts the call copies the
//     counts into a pinned host block (one cudaMemcpyAsync, then a stream synchronize);
//   * fp32: one cublasGemmGroupedBatchedEx call, one cuBLAS group of group_size 1 per
//     problem (each has its own m or k and its own pointers). Its shape, ld and scalar
//     arrays are host arrays; its A/B/C pointer arrays must be in device memory: they are
//     written to a pinned host staging block and copied with one cudaMemcpyAsync on the
//     stream into a device block (both grown on demand), so the GEMM that reads them is
//     ordered after the copy. The blocks are a ring of slots, each guarded by an event
//     recorded after its copy: a call waits only for its slot's copy of many calls ago. Should a
//     cuBLAS refuse CUBLAS_COMPUTE_32F_PEDANTIC there (CUBLAS_STATUS_NOT_SUPPORTED), the
//     problems run one cublasGemmEx each, the same arithmetic.
//   * bf16 / fp16: one cublasGemmEx per problem. The grouped API's table of supported types has no
//     CUBLAS_COMPUTE_32F_FAST_16BF or _16F (fp32 data: 32F, 32F_PEDANTIC, 32F_FAST_TF32), and
//     cublasGemmEx sees each pointer, so it has no alignment demand on rows that start at
//     any offset.
// Determinism: cuBLAS with atomics disallowed (context.cu) gives the same bits for the same
// call on the same GPU and stream; which path a call takes depends only on its arguments and
// the input-precision switch. The static state here assumes one host thread drives the backend.
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_internal.h"

static_assert(sizeof(real) == sizeof(float), "the cuda backend is built for float only");

enum { SCALE_THREADS = 256 };

// ---- C = beta·C ----------------------------------------------------------------------------

// C[rows, cols] (row-major, leading dimension ldc) = beta·C; beta == 0 writes zeros, so NaN or
// Inf already in C does not survive. Grid-stride loop, thread → element i = r·cols + c.
__global__ void scale_c_kernel(float *C, int rows, int cols, size_t ldc, float beta) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float *c = C + (i / cols) * ldc + i % cols;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

// The K == 0 / alpha == 0 case of gemm.h for one C[M,N]: C = beta·C (beta == 1: nothing to do).
static void scale_c(int M, int N, float beta, float *C, int ldc) {
    if (beta == 1.0f || M == 0 || N == 0) return;
    size_t n = (size_t)M * N;
    scale_c_kernel<<<cuda_blocks(n, SCALE_THREADS), SCALE_THREADS, 0, cuda_stream()>>>(C, M, N, (size_t)ldc, beta);
    CUDA_CHECK_LAUNCH();
}

// ---- one GEMM in cuBLAS's terms -------------------------------------------------------------

// Column-major C'[m,n] = alpha·op(A')[m,k]·op(B')[k,n] + beta·C', as cuBLAS takes it.
typedef struct {
    cublasOperation_t ta, tb;
    int m, n, k;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float *C;
    int ldc;
} ColGemm;

// The row-major gemm.h problem C[M,N] = op(A)[M,K]·op(B)[K,N] as the column-major
// Cᵀ[N,M] = op(B)ᵀ[N,K]·op(A)ᵀ[K,M] (see the top of the file).
static ColGemm col_gemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float *C, int ldc) {
    ColGemm g;
    g.ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
    g.tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's B is our A
    g.m = N;
    g.n = M;
    g.k = K;
    g.A = B;
    g.lda = ldb;
    g.B = A;
    g.ldb = lda;
    g.C = C;
    g.ldc = ldc;
    return g;
}

static cublasComputeType_t gemm_compute_type(void) {
    switch (cuda_gemm_inputs()) {
    case GEMM_INPUTS_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GEMM_INPUTS_FP16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F_PEDANTIC;
    }
}

// One cublasGemmEx (fp32 storage for A, B and C; alpha and beta read from the host).
static void col_gemm_run(const ColGemm *g, float alpha, float beta) {
    CUBLAS_CHECK(cublasGemmEx(cuda_cublas(), g->ta, g->tb, g->m, g->n, g->k, &alpha, g->A, CUDA_R_32F, g->lda, g->B,
                              CUDA_R_32F, g->ldb, &beta, g->C, CUDA_R_32F, g->ldc, gemm_compute_type(),
                              CUBLAS_GEMM_DEFAULT));
}

// gemm.h's checks on the leading dimensions of a problem that reads A and B (K > 0).
static void check_lds(int trans_a, int trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
    MT_ASSERT(ldc >= N);
    MT_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N));
}

// ---- cuda_gemm ------------------------------------------------------------------------------

void cuda_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda, const real *B,
               int ldb, real beta, real *C, int ldc) {
    MT_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    MT_ASSERT(ldc >= N);
    if (K == 0 || alpha == 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    check_lds(trans_a, trans_b, M, N, K, lda, ldb, ldc);
    ColGemm g = col_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
    col_gemm_run(&g, alpha, beta);
}

// ---- the problems of one grouped call, gathered on the host ----------------------------------

// Host arrays grown on demand: the problems (cuBLAS terms) and, for the grouped API, their
// fields one array each (length = problems; every cuBLAS group holds one problem).
static struct {
    int cap;
    ColGemm *gemm;
    cublasOperation_t *ta, *tb;
    int *m, *n, *k, *lda, *ldb, *ldc, *size;
    float *alpha, *beta;
} batch;

static void batch_reserve(int count) {
    if (count <= batch.cap) return;
    int cap = MT_MAX(count, MT_MAX(2 * batch.cap, 64));
    batch.gemm = (ColGemm *)mt_realloc(batch.gemm, (size_t)cap * sizeof(ColGemm));
    batch.ta = (cublasOperation_t *)mt_realloc(batch.ta, (size_t)cap * sizeof(cublasOperation_t));
    batch.tb = (cublasOperation_t *)mt_realloc(batch.tb, (size_t)cap * sizeof(cublasOperation_t));
    int **ints[] = {&batch.m, &batch.n, &batch.k, &batch.lda, &batch.ldb, &batch.ldc, &batch.size};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        *ints[i] = (int *)mt_realloc(*ints[i], (size_t)cap * sizeof(int));
    batch.alpha = (float *)mt_realloc(batch.alpha, (size_t)cap * sizeof(float));
    batch.beta = (float *)mt_realloc(batch.beta, (size_t)cap * sizeof(float));
    batch.cap = cap;
}

// ---- device pointer arrays of cublasGemmGroupedBatchedEx ------------------------------------

// A ring of POINTER_SLOTS slots, each 3·cap pointers on each side: [A' of every problem |
// B' ... | C' ...], packed by the call's count. A slot's `copied` is recorded on the stream
// after the copy out of its host block; a call waits only for the copy of its own slot,
// queued POINTER_SLOTS grouped calls earlier (long done in practice), never for the GEMMs
// just queued — so a grouped call does not stall the host.
enum { POINTER_SLOTS = 16 };
static struct {
    void **host[POINTER_SLOTS];    // pinned staging
    void **device[POINTER_SLOTS];  // what cuBLAS reads
    cudaEvent_t copied[POINTER_SLOTS];
    size_t cap;  // problems per slot
    int next;    // the slot the next call uses
} ptrs;

// Every slot with room for at least `count` problems (rare: the first calls and growth).
static void pointers_grow(int count) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // no queued GEMM still reads an old device block
    size_t cap = MT_MAX((size_t)count, MT_MAX(2 * ptrs.cap, (size_t)64));
    for (int s = 0; s < POINTER_SLOTS; s++) {
        if (ptrs.host[s]) CUDA_CHECK(cudaFreeHost(ptrs.host[s]));
        if (ptrs.device[s]) CUDA_CHECK(cudaFree(ptrs.device[s]));
        if (!ptrs.copied[s]) CUDA_CHECK(cudaEventCreateWithFlags(&ptrs.copied[s], cudaEventDisableTiming));
        CUDA_CHECK(cudaMallocHost((void **)&ptrs.host[s], 3 * cap * sizeof(void *)));
        CUDA_CHECK(cudaMalloc((void **)&ptrs.device[s], 3 * cap * sizeof(void *)));
        CUDA_CHECK(cudaEventRecord(ptrs.copied[s], cuda_stream()));
    }
    ptrs.cap = cap;
}

// The slot for the next `count` problems' pointers, free to write: its previous copy has
// finished, and it holds at least 3·count pointers on each side.
static int pointers_slot(int count) {
    if ((size_t)count > ptrs.cap) pointers_grow(count);
    int s = ptrs.next;
    ptrs.next = (ptrs.next + 1) % POINTER_SLOTS;
    CUDA_CHECK(cudaEventSynchronize(ptrs.copied[s]));
    return s;
}

// Queues the copy of slot s's 3·count staged pointers to its device block and returns that block.
static void **pointers_upload(int s, int count) {
    size_t bytes = 3 * (size_t)count * sizeof(void *);
    CUDA_CHECK(cudaMemcpyAsync(ptrs.device[s], ptrs.host[s], bytes, cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaEventRecord(ptrs.copied[s], cuda_stream()));
    return ptrs.device[s];
}

// ---- running the gathered problems ----------------------------------------------------------

// batch.gemm[0, count) in one cublasGemmGroupedBatchedEx (fp32 only, see the top of the file).
// Returns 0 (nothing run) when cuBLAS refuses the grouped call.
static int batch_run_grouped(int count, float alpha, float beta) {
    int slot = pointers_slot(count);
    void **staged = ptrs.host[slot];
    for (int i = 0; i < count; i++) {
        const ColGemm *g = &batch.gemm[i];
        batch.ta[i] = g->ta;
        batch.tb[i] = g->tb;
        batch.m[i] = g->m;
        batch.n[i] = g->n;
        batch.k[i] = g->k;
        batch.lda[i] = g->lda;
        batch.ldb[i] = g->ldb;
        batch.ldc[i] = g->ldc;
        batch.size[i] = 1;
        batch.alpha[i] = alpha;
        batch.beta[i] = beta;
        staged[i] = (void *)g->A;
        staged[count + i] = (void *)g->B;
        staged[2 * count + i] = g->C;
    }
    void **dev = pointers_upload(slot, count);
    cublasStatus_t status = cublasGemmGroupedBatchedEx(
        cuda_cublas(), batch.ta, batch.tb, batch.m, batch.n, batch.k, batch.alpha, (const void *const *)dev, CUDA_R_32F,
        batch.lda, (const void *const *)(dev + count), CUDA_R_32F, batch.ldb, batch.beta, dev + 2 * count, CUDA_R_32F,
        batch.ldc, count, batch.size, CUBLAS_COMPUTE_32F_PEDANTIC);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return 0;  // a cuBLAS without 32F_PEDANTIC grouped
    CUBLAS_CHECK(status);
    return 1;
}

// batch.gemm[0, count): grouped in fp32, one cublasGemmEx each with 16-bit inputs (and in fp32
// once cuBLAS has refused the grouped call: it would again).
static void batch_run(int count, float alpha, float beta) {
    static int grouped_refused;
    if (count == 0) return;
    if (cuda_gemm_inputs() == GEMM_INPUTS_FP32 && !grouped_refused) {
        if (batch_run_grouped(count, alpha, beta)) return;
        grouped_refused = 1;
    }
    for (int i = 0; i < count; i++) col_gemm_run(&batch.gemm[i], alpha, beta);
}

// ---- operands stored as bf16 (gemm.h Storage) ----------------------------------------------------

// cuBLAS takes A and B of one type, so a bf16-stored operand is widened (exactly) into one of
// these buffers first (A's, B's) and the GEMM runs as on fp32 storage; a bf16-stored C is
// summed into the third and rounded into C after.
static CudaScratch widened_a, widened_b, staged_c;

// Where a GEMM with C stored as c_store (gemm.h: bf16 needs beta 0 and ldc == N) writes its n
// fp32 results: C itself, or the staging block that c_stored_finish rounds into C.
static float *c_fp32(void *C, Storage c_store, size_t n) {
    if (c_store == STORE_FP32) return (float *)C;
    return (float *)scratch_reserve(&staged_c, MT_MAX(n, (size_t)1) * sizeof(float));
}

static void c_stored_finish(void *C, Storage c_store, const float *staged, size_t n) {
    if (c_store == STORE_BF16) cuda_bf16_pack((float *)C, staged, n);
}

// Elements a row-major operand [rows, cols] with leading dimension ld spans (0 when empty).
static size_t operand_extent(size_t rows, size_t cols, size_t ld) { return rows && cols ? (rows - 1) * ld + cols : 0; }

// mt_gemm_stored: each bf16-stored operand widened (only when the GEMM reads them), then cuda_gemm.
void cuda_gemm_stored(int trans_a, int trans_b, int M, int N, int K, real alpha, const void *A_stored, Storage a_store,
                      int lda, const void *B_stored, Storage b_store, int ldb, real beta, void *C_stored,
                      Storage c_store, int ldc) {
    MT_ASSERT(c_store == STORE_FP32 || (beta == 0 && ldc == N));
    int reads = M > 0 && N > 0 && K > 0 && alpha != 0;  // else gemm.h reads neither operand
    size_t a_n = trans_a ? operand_extent(K, M, lda) : operand_extent(M, K, lda);
    size_t b_n = trans_b ? operand_extent(N, K, ldb) : operand_extent(K, N, ldb);
    const float *A = scratch_widened(&widened_a, A_stored, a_store, reads ? a_n : 0);
    const float *B = scratch_widened(&widened_b, B_stored, b_store, reads ? b_n : 0);
    size_t c_n = M > 0 && N > 0 ? (size_t)M * N : 0;
    float *C = c_fp32(C_stored, c_store, c_n);
    cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    c_stored_finish(C_stored, c_store, C, c_n);
}

// Sum of rows[0, groups).
static size_t total_rows(const int32_t *rows, int groups) {
    size_t total = 0;
    for (int g = 0; g < groups; g++) total += (size_t)MT_MAX(rows[g], 0);
    return total;
}

// ---- grouped GEMMs ------------------------------------------------------------------------------

// The rows of each group, copied from tensor memory into a pinned host block (grown on demand)
// once the stream's earlier work (which may write them) is done.
static const int32_t *counts_on_host(const int32_t *counts, int groups) {
    static int32_t *host;
    static int cap;
    if (groups > cap) {
        if (host) CUDA_CHECK(cudaFreeHost(host));
        cap = MT_MAX(groups, MT_MAX(2 * cap, 64));
        CUDA_CHECK(cudaMallocHost((void **)&host, (size_t)cap * sizeof(int32_t)));
    }
    if (groups == 0) return host;
    CUDA_CHECK(cudaMemcpyAsync(host, counts, (size_t)groups * sizeof(int32_t), cudaMemcpyDefault, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return host;
}

// For g with M_g = counts[g] > 0: C_g[M_g, N] = alpha·op(A_g)·op(B + g·b_stride) + beta·C_g, the
// groups' rows back to back from row 0 (gemm.h). Every problem shares N, K, the flags and the
// lds; only M = M_g and the pointers differ.
void cuda_gemm_grouped(int trans_a, int trans_b, int groups, const int32_t *counts, const int32_t *host_counts, int N,
                       int K, real alpha, const void *A_stored, Storage a_store, int lda, const real *B, size_t b_stride,
                       int ldb, real beta, void *C_stored, Storage c_store, int ldc) {
    MT_ASSERT(groups >= 0 && N >= 0 && K >= 0);
    MT_ASSERT(c_store == STORE_FP32 || (beta == 0 && ldc == N));
    if (N == 0 || groups == 0) return;
    const int32_t *rows = host_counts ? host_counts : counts_on_host(counts, groups);
    size_t R = total_rows(rows, groups);
    const float *A =
        scratch_widened(&widened_a, A_stored, a_store, trans_a ? operand_extent(K, R, lda) : operand_extent(R, K, lda));
    float *C = c_fp32(C_stored, c_store, R * N);
    int count = 0;
    size_t first = 0;
    batch_reserve(groups);
    for (int g = 0; g < groups; g++) {
        int m = rows[g];
        MT_ASSERT(m >= 0);
        size_t at = first;
        first += (size_t)m;
        if (m == 0) continue;
        MT_ASSERT(ldc >= N);
        float *C_g = C + at * ldc;
        if (K == 0 || alpha == 0) {  // C_g = beta·C_g, A and B unread
            scale_c(m, N, beta, C_g, ldc);
            continue;
        }
        check_lds(trans_a, trans_b, m, N, K, lda, ldb, ldc);
        batch.gemm[count++] = col_gemm(trans_a, trans_b, m, N, K, A + at * (trans_a ? 1 : (size_t)lda), lda,
                                       B + (size_t)g * b_stride, ldb, C_g, ldc);
    }
    batch_run(count, alpha, beta);
    c_stored_finish(C_stored, c_store, C, R * N);
}

// For g with M_g = counts[g] > 0: W_g[out,in] += alpha·dY_gᵀ[out, M_g]·X_g[M_g, in], i.e. the
// row-major gemm (trans_a = 1, trans_b = 0, M = out, N = in, K = M_g, beta = 1) with dY_g
// [M_g, out] (ld out), X_g [M_g, in] (ld in), W_g = W + g·w_stride [out, in] (ld in). Here K
// differs between problems.
void cuda_gemm_grouped_wgrad(int groups, const int32_t *counts, const int32_t *host_counts, int out, int in,
                             real alpha, const void *dY_stored, Storage dy_store, const void *X_stored,
                             Storage x_store, real *W, size_t w_stride) {
    MT_ASSERT(groups >= 0 && out >= 0 && in >= 0);
    if (out == 0 || in == 0 || alpha == 0 || groups == 0) return;  // W_g = 1·W_g
    const int32_t *rows = host_counts ? host_counts : counts_on_host(counts, groups);
    size_t R = total_rows(rows, groups);
    const float *dY = scratch_widened(&widened_a, dY_stored, dy_store, R * (size_t)out);
    const float *X = scratch_widened(&widened_b, X_stored, x_store, R * (size_t)in);
    int count = 0;
    size_t first = 0;
    batch_reserve(groups);
    for (int g = 0; g < groups; g++) {
        int m = rows[g];
        MT_ASSERT(m >= 0);
        size_t at = first;
        first += (size_t)m;
        if (m == 0) continue;
        batch.gemm[count++] =
            col_gemm(1, 0, out, in, m, dY + at * out, out, X + at * in, in, W + (size_t)g * w_stride, in);
    }
    batch_run(count, alpha, 1.0f);
}

// ---- linear layers (ops.h): y = x·Wᵀ, W [out, in] ------------------------------------------------

// x (N,in), W (out,in) -> y (N,out) = x·Wᵀ (overwritten)
void cuda_linear_forward(real *y, const real *x, const real *W, int N, int in, int out) {
    cuda_gemm(0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

// dx (N,in) += dy (N,out)·W (out,in), skipped when dx is NULL; dW (out,in) += dyᵀ (out,N)·x (N,in)
void cuda_linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in,
                          int out) {
    if (dx) cuda_gemm(0, 0, N, in, out, 1.0f, dy, out, W, in, 1.0f, dx, in);
    if (dW) cuda_gemm(1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}
