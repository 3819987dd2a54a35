// op_check.h — the op checks: every op of a backend under test against the cpu backend,
// through the op table (src/ops/op_list.h), shared by tests/gpu/check_<family>.c.
//
// Each check runs one op through the cpu backend on host buffers and through the backend
// under test on its own copies of the same inputs (memory that backend's ops address:
// device memory for cuda), and compares every output:
//   * outputs the op overwrites start as NaN on the backend under test, so an element the
//     op does not write shows up as a failure ("not written");
//   * outputs an op accumulates into (+=) start from the same random values on both;
//   * the error is normwise: max |test − cpu| / max(max |cpu|, 1e-30), within tol
//     (TOL_FP32 = 1e-5 for fp32 GEMM and ops, TOL_BF16 = 1e-2 with bf16 GEMM inputs,
//     TOL_FP16 = 2e-3 with fp16 ones: 2.5 rounding units of each, as for bf16).
// The checks call the backend under test through under(), a table that counts the calls
// of each op: an op of the list that no check called is a failure (check_uncovered_ops),
// so a new op cannot be added without its check. The cpu backend under test checks the
// harness and the cpu ops' own contracts (every overwritten output written, bits equal).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"

#define TOL_FP32 1e-5
#define TOL_BF16 1e-2
#define TOL_FP16 2e-3

// A backend under test: its op table and how test code reaches its memory.
typedef struct {
    const char *name;
    const OpsBackend *ops;
    void *(*alloc)(size_t bytes);  // memory its ops read and write (zeroed or not)
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host, size_t bytes);
    void (*download)(void *host, const void *src, size_t bytes);
    void (*fill)(void *dst, int byte, size_t bytes);
    void (*set_gemm_inputs)(int inputs);  // a GemmInputs; NULL: fp32 GEMMs only (the 16-bit checks are skipped)
} CheckBackend;

extern const CheckBackend check_backend_cpu;   // host memory
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
extern const CheckBackend check_backend_cuda;  // device memory (cuda_malloc), needs a GPU
#endif

// Selects the backend under test; its ops are reached through under().
void check_use(const CheckBackend *b);
const CheckBackend *check_backend(void);
const OpsBackend *under(void);
// Waits for the backend under test's queued ops (its finish step).
void check_finish(void);
// Bytes of the backend under test's memory into a host buffer (after its ops finished).
void check_download(void *host, const void *src, size_t bytes);
// Whether the backend under test has 16-bit GEMM inputs; selects a GemmInputs (ops/gemm.h).
int check_has_16bit_gemms(void);
void check_set_gemm_inputs(int inputs);

// Host buffers (malloc'd, freed by check_free_all at the end of each check).
float *check_random(size_t n, float lo, float hi);       // uniform in [lo, hi), seeded per check
int32_t *check_random_ints(size_t n, int32_t lo, int32_t hi);
float *check_host_copy(const float *src, size_t n);
// Buffers of the backend under test (freed by check_free_all too).
float *check_to_device(const float *host, size_t n);     // a copy
int32_t *check_ints_to_device(const int32_t *host, size_t n);
float *check_device_nan(size_t n);                       // n NaNs: for outputs the op overwrites
int32_t *check_device_unset_ints(size_t n);              // n × −1: for integer outputs the op overwrites
void *check_device_bytes(const void *host, size_t bytes);  // a copy of any host block
// n elements for the backend under test stored as `store` (gemm.h): for STORE_BF16 the host
// values are first rounded to bf16 in place (bf16_pack's rounding, so the cpu reference reads the
// same values in fp32) and the copy holds the bf16 array.
void *check_stored_to_device(float *host, size_t n, Storage store);
// An op's output of n elements stored as `store`, as fp32 of the backend under test: itself, or
// its bf16 values widened (bf16_unpack) into a new buffer.
float *check_widened_from_device(const void *stored, size_t n, Storage store);
// Compares a result of the backend under test with the cpu result; prints one line
// (name, error, PASS/FAIL), counts it, and returns 1 when it passed.
int check_compare(const char *check, const char *output, const float *cpu, const float *test_result, size_t n,
                  double tol);
int check_compare_double(const char *check, const char *output, double cpu, double test, double tol);
// Integer outputs must match exactly; the error printed is the number of elements that differ.
int check_compare_ints(const char *check, const char *output, const int32_t *cpu, const int32_t *test_result,
                       size_t n);
void check_free_all(void);
extern int check_passed, check_failed;  // the counts so far
// One failure per op of the list that no check has called through under(); their number.
int check_uncovered_ops(void);

// The families of checks, one file each (tests/gpu/check_<family>.c).
void check_gemm_ops(void);         // gemm, grouped, grouped wgrad, linear (fp32 and bf16)
void check_elementwise_ops(void);  // vec_*, embedding, rmsnorm, rope, clamp, swiglu, softmax, cross-entropy, adamw
void check_attention_ops(void);    // attention forward and backward (GQA, MLA widths, masks, decode,
                                   // ring key blocks at k_pos0), attention_merge
void check_moe_ops(void);          // router logits in double, per-token routing, permute, unpermute
void check_loss_ops(void);       // LM head loss sums and weights, vocab-parallel cross-entropy
void check_router_ops(void);     // router capacity, counts, balancing statistics and losses, router backward
void check_dispatch_ops(void);   // dispatch plan, expert row grouping, EP exchange layouts
void check_parallel_ops(void);   // tensor/context-parallel gathers, slices, partial sums
void check_state_ops(void);      // checkpoint staging, KV cache, sampling, optimizer bookkeeping
void check_quantize_ops(void);   // FP8 per tensor and in tiles, MXFP8, NVFP4, the random Hadamard transform
