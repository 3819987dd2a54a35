// gemm_fp8.cu — the cuda backend's fp8_gemm (contract in ops_quantize.h): cuBLASLt's FP8
// tensor-core GEMM where the device and the call allow it, the emulation elsewhere.
//
// The cuBLASLt call. In cuBLAS's column-major terms (gemm.cu's header) the row-major
// C (M, N) = (sa·A)(sb·B)ᵀ is Cᵀ (N, M) = op(A')·B' with cuBLAS's A' our B read as a
// column-major (K, N) matrix and transposed (CUBLAS_OP_T, ld K), and its B' our A read as a
// column-major (K, M) matrix as it is (CUBLAS_OP_N, ld K): the "TN" layout that Hopper's and
// Ada's FP8 kernels require. Its A_SCALE_POINTER is our b_scale_inv, its B_SCALE_POINTER our
// a_scale_inv (device pointers: no scale ever goes through the host); C and D are our C, fp32,
// with compute and scale type fp32, alpha 1 and beta 0 or 1 on the host.
//
// Precision: CUBLASLT_MATMUL_DESC_FAST_ACCUM off. Hopper's FP8 MMA accumulates at a reduced
// precision (about 14 bits kept, by DeepSeek-V3's measurement); with fast accumulation off
// cuBLASLt promotes the partial sums into fp32 accumulators periodically along K ("split
// accumulator" in Transformer Engine's terms; NVIDIA documents the promotion as periodic, not
// per product), so each sum is fp32 across promotions and about 14 bits within one interval:
// close to the emulation's fp32 sums, not equal to them (tests/gpu/check_quantize.c's bound).
//
// When it runs. The device's compute capability is at least 8.9 (Ada, Hopper and later);
// the formats are not both E5M2 (cuBLASLt has no E5M2 × E5M2 kernel); M, N and K are
// positive multiples of 16 and the three pointers 16-byte aligned (FP8 GEMMs need 16-byte
// aligned rows and pointers; an expert's rows are so under --moe-router-padding-for-
// quantization); and cuBLASLt's heuristic returns an algorithm for the shape with 16-byte
// alignment and the workspace below. Anything else takes the emulation: both operands
// dequantized into work, then an fp32 cuda_gemm (CUBLAS_COMPUTE_32F_PEDANTIC), as the cpu
// backend does.
//
// Plans. A shape's descriptors and algorithm are made once and kept in a small table
// (evicted in turn when full), so a training step queries the heuristic only on its first
// pass. The same plan runs the same algorithm every time: reruns give the same bits.
// cuBLASLt's reduction schemes (none, in place with ordering counters, or in the workspace)
// are all sequential, so no algorithm sums in a varying order.
#include <cublasLt.h>
#include <stdint.h>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_internal.h"

enum {
    FP8_GEMM_ALIGN = 16,                 // elements of M, N, K; bytes of A, B and C
    FP8_LT_MIN_MAJOR = 8,                // compute capability 8.9: the first with FP8 MMA
    FP8_LT_MIN_MINOR = 9,
    FP8_LT_PLANS = 64,                   // shapes kept
    FP8_LT_WORKSPACE = 32 << 20,         // bytes: what cuBLASLt asks for on Hopper
};

typedef struct {
    int M, N, K, accumulate;
    Fp8Format fa, fb;
    int usable;  // the heuristic found an algorithm
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;  // cuBLAS's A' (our B), B' (our A), C = D
    cublasLtMatmulAlgo_t algo;
} LtPlan;

static struct {
    int probed, capable;  // the device has FP8 tensor cores
    cublasLtHandle_t handle;
    CudaScratch workspace;
    LtPlan plans[FP8_LT_PLANS];
    int count, next_evicted;
} lt;

static int device_has_fp8_mma(void) {
    if (!lt.probed) {
        int device, major, minor;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        lt.capable = major > FP8_LT_MIN_MAJOR || (major == FP8_LT_MIN_MAJOR && minor >= FP8_LT_MIN_MINOR);
        if (lt.capable) CUBLAS_CHECK(cublasLtCreate(&lt.handle));
        lt.probed = 1;
    }
    return lt.capable;
}

static int aligned(const void *p) { return (uintptr_t)p % FP8_GEMM_ALIGN == 0; }
static int aligned_extent(int v) { return v > 0 && v % FP8_GEMM_ALIGN == 0; }

static int call_fits_cublaslt(const void *C, const void *A, Fp8Format fa, const void *B, Fp8Format fb, int M, int N,
                              int K) {
    return !(fa == FP8_E5M2 && fb == FP8_E5M2) && aligned_extent(M) && aligned_extent(N) && aligned_extent(K) &&
           aligned(A) && aligned(B) && aligned(C) && device_has_fp8_mma();
}

static cudaDataType_t fp8_type(Fp8Format f) { return f == FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

static void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const void *value, size_t bytes) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, value, bytes));
}

static void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, uint64_t value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// The descriptors of one shape and the heuristic's first algorithm for them.
static void plan_make(LtPlan *p) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t transpose = CUBLAS_OP_T, as_is = CUBLAS_OP_N;
    int8_t fast_accumulation = 0;
    set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
    set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &as_is, sizeof(as_is));
    set_desc(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation, sizeof(fast_accumulation));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, fp8_type(p->fb), p->K, p->N, p->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, fp8_type(p->fa), p->K, p->M, p->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, p->N, p->M, p->N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, FP8_LT_WORKSPACE);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, FP8_GEMM_ALIGN);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, FP8_GEMM_ALIGN);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, FP8_GEMM_ALIGN);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, FP8_GEMM_ALIGN);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt.handle, p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->usable = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.workspaceSize <= FP8_LT_WORKSPACE;
    if (p->usable) p->algo = result.algo;
}

static void plan_destroy(LtPlan *p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->c));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->op));
}

static LtPlan *plan_for(int M, int N, int K, Fp8Format fa, Fp8Format fb, int accumulate) {
    for (int i = 0; i < lt.count; i++) {
        LtPlan *p = &lt.plans[i];
        if (p->M == M && p->N == N && p->K == K && p->fa == fa && p->fb == fb && p->accumulate == accumulate)
            return p;
    }
    LtPlan *p;
    if (lt.count < FP8_LT_PLANS) {
        p = &lt.plans[lt.count++];
    } else {
        p = &lt.plans[lt.next_evicted];
        lt.next_evicted = (lt.next_evicted + 1) % FP8_LT_PLANS;
        plan_destroy(p);
    }
    *p = (LtPlan){.M = M, .N = N, .K = K, .accumulate = accumulate, .fa = fa, .fb = fb};
    plan_make(p);
    return p;
}

// C = (sa·A)(sb·B)ᵀ + beta·C on the FP8 tensor cores; 0 when cuBLASLt has no algorithm.
static int cublaslt_fp8_gemm(float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B,
                             Fp8Format fb, const float *b_scale_inv, int M, int N, int K, float beta) {
    LtPlan *p = plan_for(M, N, K, fa, fb, beta != 0.0f);
    if (!p->usable) return 0;
    set_desc(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(b_scale_inv));
    set_desc(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(a_scale_inv));
    void *workspace = scratch_reserve(&lt.workspace, FP8_LT_WORKSPACE);
    const float one = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt.handle, p->op, &one, B, p->a, A, p->b, &beta, C, p->c, C, p->c, &p->algo,
                                workspace, FP8_LT_WORKSPACE, cuda_stream()));
    return 1;
}

// The emulation: both operands dequantized into work, then one fp32 GEMM.
static void emulated_fp8_gemm(float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B,
                              Fp8Format fb, const float *b_scale_inv, int M, int N, int K, float beta, float *work) {
    float *a = work, *b = work + (size_t)M * K;
    cuda_fp8_dequantize_tensor(a, A, a_scale_inv, (size_t)M * K, fa);
    cuda_fp8_dequantize_tensor(b, B, b_scale_inv, (size_t)N * K, fb);
    int saved = cuda_gemm_inputs();
    cuda_set_gemm_inputs(GEMM_INPUTS_FP32);
    cuda_gemm(0, 1, M, N, K, 1, a, K, b, K, beta, C, N);
    cuda_set_gemm_inputs(saved);
}

void cuda_fp8_gemm(float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B, Fp8Format fb,
                   const float *b_scale_inv, int M, int N, int K, float beta, float *work) {
    quant_check_gemm("fp8_gemm", M, N, K, beta);
    if (call_fits_cublaslt(C, A, fa, B, fb, M, N, K) &&
        cublaslt_fp8_gemm(C, A, fa, a_scale_inv, B, fb, b_scale_inv, M, N, K, beta))
        return;
    emulated_fp8_gemm(C, A, fa, a_scale_inv, B, fb, b_scale_inv, M, N, K, beta, work);
}
