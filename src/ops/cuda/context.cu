// context.cu — the cuda backend's device, stream, cuBLAS handle and memory.
#include <stdarg.h>
#include <stdio.h>

#include "ops/cuda/cuda_internal.h"

static struct {
    int ready, device, sm_count, gemm_bf16;
    cudaStream_t stream;
    cublasHandle_t cublas;
    char name[256];
} ctx;

void cuda_check_result(cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess) mt_die("CUDA error at %s:%d in %s: %s", file, line, call, cudaGetErrorString(e));
}

void cublas_check_result(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS)
        mt_die("cuBLAS error at %s:%d in %s: %s", file, line, call, cublasGetStatusString(s));
}

int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver or no device: not an error here, the answer is 0
        return 0;
    }
    return n;
}

void cuda_init(int index) {
    if (ctx.ready) return;
    int n = cuda_device_count();
    if (n == 0) mt_die("--device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    ctx.device = index % n;
    CUDA_CHECK(cudaSetDevice(ctx.device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.device));
    ctx.sm_count = prop.multiProcessorCount;
    snprintf(ctx.name, sizeof(ctx.name), "%s", prop.name);
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&ctx.cublas));
    CUBLAS_CHECK(cublasSetStream(ctx.cublas, ctx.stream));
    // Deterministic results: no atomics inside cuBLAS reductions, fp32 math unless --bf16.
    CUBLAS_CHECK(cublasSetAtomicsMode(ctx.cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
    CUBLAS_CHECK(cublasSetMathMode(ctx.cublas, CUBLAS_PEDANTIC_MATH));
    ctx.ready = 1;
}

static void require_ready(void) {
    if (!ctx.ready) mt_die("internal error: the cuda backend was used before cuda_init (please report)");
}

cudaStream_t cuda_stream(void) {
    require_ready();
    return ctx.stream;
}

cublasHandle_t cuda_cublas(void) {
    require_ready();
    return ctx.cublas;
}

int cuda_sm_count(void) {
    require_ready();
    return ctx.sm_count;
}

void cuda_finish(void) { CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); }
void cuda_set_gemm_bf16(int on) { ctx.gemm_bf16 = on != 0; }
int cuda_gemm_bf16(void) { return ctx.gemm_bf16; }
const char *cuda_device_name(void) { return ctx.ready ? ctx.name : "none"; }

double cuda_memory_free_bytes(void) {
    require_ready();
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return (double)free_bytes;
}

void *cuda_malloc_managed(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
    if (e != cudaSuccess)
        mt_die("out of GPU memory: cudaMallocManaged of %.1f MiB failed (%s); use a smaller model, "
               "--micro-batch-size or more GPUs", bytes / 1048576.0, cudaGetErrorString(e));
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    CUDA_CHECK(cudaDeviceSynchronize());
    return p;
}

void *cuda_malloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        mt_die("out of GPU memory: cudaMalloc of %.1f MiB failed (%s)", bytes / 1048576.0, cudaGetErrorString(e));
    return p;
}

void cuda_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));  // cudaFree waits for the work using p
}

// Copies and fills run on the backend's stream and wait for it, so they are ordered
// after the ops queued before them.
void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream()));
    cuda_finish();
}

void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
    cuda_finish();
}

void cuda_memset(void *dst, int byte, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, cuda_stream()));
    cuda_finish();
}
