// cuda_internal.h — what the cuda backend's .cu files share: error checks, the stream
// and cuBLAS handle of context.cu, launch geometry helpers.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/cuda/cuda_ops.h"

// Every CUDA / cuBLAS call is checked: a failure ends the run with one line naming the
// call, the file and line, and the error text.
#define CUDA_CHECK(call) cuda_check_result((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check_result((call), #call, __FILE__, __LINE__)
// After a kernel launch: the launch error, if any (bad geometry, no device).
#define CUDA_CHECK_LAUNCH() cuda_check_result(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

void cuda_check_result(cudaError_t e, const char *call, const char *file, int line);
void cublas_check_result(cublasStatus_t s, const char *call, const char *file, int line);

cudaStream_t cuda_stream(void);     // every op of the backend runs on this stream
cublasHandle_t cuda_cublas(void);   // bound to cuda_stream()
int cuda_gemm_inputs(void);         // a GemmInputs (ops/gemm.h), set by cuda_set_gemm_inputs
int cuda_sm_count(void);            // multiprocessors of the device, for grid sizing

// Blocks of `threads` covering n items, capped for grid-stride loops.
static inline unsigned cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}
