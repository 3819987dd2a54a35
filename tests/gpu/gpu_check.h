// gpu_check.h — shared by the op checks of the cuda backend (make check-gpu).
//
// Each check runs one op through the cpu backend on host buffers and through the cuda
// backend on device copies of the same inputs, and compares every output:
//   * outputs a cuda op overwrites start as NaN on the device, so an element the op
//     does not write shows up as a failure ("not written");
//   * outputs an op accumulates into (+=) start from the same random values on both;
//   * the error is normwise: max |gpu − cpu| / max(max |cpu|, 1e-30), within tol
//     (GPU_TOL_FP32 = 1e-5 for fp32 GEMM and ops, GPU_TOL_BF16 = 1e-2 with --bf16 GEMMs).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/cuda/cuda_ops.h"

#define GPU_TOL_FP32 1e-5
#define GPU_TOL_BF16 1e-2

// Host buffers (malloc'd, freed by check_free_all at the end of each check).
float *check_random(size_t n, float lo, float hi);       // uniform in [lo, hi), seeded per check
int32_t *check_random_ints(size_t n, int32_t lo, int32_t hi);
float *check_host_copy(const float *src, size_t n);
// Device buffers (freed by check_free_all too).
float *check_to_device(const float *host, size_t n);     // a device copy
int32_t *check_ints_to_device(const int32_t *host, size_t n);
float *check_device_nan(size_t n);                       // n NaNs: for outputs the op overwrites
int32_t *check_device_unset_ints(size_t n);              // n × −1: for integer outputs the op overwrites
void *check_device_bytes(const void *host, size_t bytes);  // a device copy of any host block
// Compares a device result with the cpu result; prints one line (name, error, PASS/FAIL),
// counts it, and returns 1 when it passed.
int check_compare(const char *check, const char *output, const float *cpu, const float *gpu_device, size_t n,
                  double tol);
int check_compare_double(const char *check, const char *output, double cpu, double gpu, double tol);
// Integer outputs must match exactly; the error printed is the number of elements that differ.
int check_compare_ints(const char *check, const char *output, const int32_t *cpu, const int32_t *gpu_device,
                       size_t n);
void check_free_all(void);
extern int check_passed, check_failed;  // the counts so far

// The families of checks, one file each (tests/gpu/check_<family>.c).
void check_gemm_ops(void);         // gemm, grouped, grouped wgrad, linear (fp32 and bf16)
void check_elementwise_ops(void);  // vec_*, embedding, rmsnorm, rope, clamp, swiglu, softmax, cross-entropy, adamw
void check_attention_ops(void);    // attention forward and backward (GQA, MLA widths, masks, decode,
                                   // ring key blocks at k_pos0), attention_merge
void check_moe_ops(void);          // router logits in double, per-token routing, permute, unpermute
