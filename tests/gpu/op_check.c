// op_check.c — the harness of the op checks (op_check.h): the backends under test and the
// counting table over them, random inputs, copies, NaN-poisoned outputs, normwise
// comparison, and the pass/fail count.
#include "op_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/float_formats.h"
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#include "ops/cuda/cuda_ops.h"
#endif

enum { MAX_BLOCKS = 4096 };

static struct {
    void *host[MAX_BLOCKS], *device[MAX_BLOCKS];
    int n_host, n_device;
    uint64_t rng;
} g_buffers = {.rng = 0x9E3779B97F4A7C15ull};

int check_passed, check_failed;

// ---- the backends under test ----------------------------------------------------------------

static void *host_alloc(size_t bytes) { return mt_malloc(bytes ? bytes : 1); }
static void host_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void host_fill(void *dst, int byte, size_t bytes) { memset(dst, byte, bytes); }

const CheckBackend check_backend_cpu = {.name = "cpu", .ops = &ops_cpu_backend, .alloc = host_alloc,
                                        .release = free, .upload = host_copy, .download = host_copy,
                                        .fill = host_fill};

#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
const CheckBackend check_backend_cuda = {.name = "cuda", .ops = &ops_cuda_backend, .alloc = cuda_malloc,
                                         .release = cuda_free, .upload = cuda_memcpy_h2d,
                                         .download = cuda_memcpy_d2h, .fill = cuda_memset,
                                         .set_gemm_inputs = cuda_set_gemm_inputs};
#endif

static const CheckBackend *g_under = &check_backend_cpu;
static long g_calls[OPS_COUNT];  // calls of each op through under()

// The counting table: each entry counts the call and runs the op of the backend under test.
#define COUNTED_CALL_void(name, args) g_under->ops->name args;
#define COUNTED_CALL_double(name, args) return g_under->ops->name args;
#define COUNTED_OP(ret, api, name, params, args) \
    static ret counted_##name params {           \
        g_calls[OP_##name]++;                    \
        COUNTED_CALL_##ret(name, args)           \
    }
MT_OPS(COUNTED_OP)
#define COUNTED_ENTRY(ret, api, name, params, args) .name = counted_##name,
static OpsBackend g_counted = {MT_OPS(COUNTED_ENTRY)};

void check_use(const CheckBackend *b) {
    g_under = b;
    g_counted.name = b->name;
    g_counted.finish = b->ops->finish;
}

const CheckBackend *check_backend(void) { return g_under; }
const OpsBackend *under(void) { return &g_counted; }

void check_finish(void) {
    if (g_under->ops->finish) g_under->ops->finish();
}

void check_download(void *host, const void *src, size_t bytes) {
    check_finish();
    if (bytes) g_under->download(host, src, bytes);
}

int check_has_16bit_gemms(void) { return g_under->set_gemm_inputs != NULL; }

void check_set_gemm_inputs(int inputs) {
    if (g_under->set_gemm_inputs) g_under->set_gemm_inputs(inputs);
    else if (inputs != GEMM_INPUTS_FP32) mt_die("op checks: the %s backend has no 16-bit GEMM inputs", g_under->name);
}

int check_uncovered_ops(void) {
    int uncovered = 0;
    for (int op = 0; op < OPS_COUNT; op++)
        if (g_calls[op] == 0) {
            printf("FAIL %-44s no check calls this op (add one to tests/gpu/check_<family>.c)\n", op_name(op));
            check_failed++;
            uncovered++;
        }
    return uncovered;
}

static uint64_t next_u64(void) {  // xorshift64*: a fixed sequence, so every run checks the same data
    g_buffers.rng ^= g_buffers.rng >> 12;
    g_buffers.rng ^= g_buffers.rng << 25;
    g_buffers.rng ^= g_buffers.rng >> 27;
    return g_buffers.rng * 0x2545F4914F6CDD1Dull;
}

static void *keep_host(void *p) {
    if (g_buffers.n_host == MAX_BLOCKS) mt_die("check harness: more than %d host buffers in one check", MAX_BLOCKS);
    return g_buffers.host[g_buffers.n_host++] = p;
}

static void *keep_device(void *p) {
    if (g_buffers.n_device == MAX_BLOCKS) mt_die("check harness: more than %d device buffers in one check", MAX_BLOCKS);
    return g_buffers.device[g_buffers.n_device++] = p;
}

float *check_random(size_t n, float lo, float hi) {
    float *x = keep_host(mt_malloc((n ? n : 1) * sizeof(float)));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)((next_u64() >> 40) * 0x1p-24);
    return x;
}

int32_t *check_random_ints(size_t n, int32_t lo, int32_t hi) {
    int32_t *x = keep_host(mt_malloc((n ? n : 1) * sizeof(int32_t)));
    for (size_t i = 0; i < n; i++) x[i] = lo + (int32_t)(next_u64() % (uint64_t)(hi - lo));
    return x;
}

float *check_host_copy(const float *src, size_t n) {
    float *x = keep_host(mt_malloc((n ? n : 1) * sizeof(float)));
    memcpy(x, src, n * sizeof(float));
    return x;
}

void *check_device_bytes(const void *host, size_t bytes) {
    void *d = keep_device(g_under->alloc(bytes ? bytes : 1));
    if (bytes) g_under->upload(d, host, bytes);
    return d;
}

float *check_to_device(const float *host, size_t n) { return check_device_bytes(host, n * sizeof(float)); }

void *check_stored_to_device(float *host, size_t n, Storage store) {
    if (store == STORE_FP32) return check_to_device(host, n);
    uint16_t *packed = (uint16_t *)check_random((n + 1) / 2 + 1, 0, 1);
    for (size_t i = 0; i < n; i++) {
        packed[i] = bf16_from_float_flushed(host[i]);
        host[i] = bf16_to_float(packed[i]);
    }
    return check_device_bytes(packed, (n ? n : 1) * sizeof(uint16_t));
}

float *check_widened_from_device(const void *stored, size_t n, Storage store) {
    if (store == STORE_FP32) return (float *)stored;
    float *widened = check_device_nan(n);
    under()->bf16_unpack(widened, stored, n);
    return widened;
}
int32_t *check_ints_to_device(const int32_t *host, size_t n) { return check_device_bytes(host, n * sizeof(int32_t)); }

float *check_device_nan(size_t n) {
    float *d = keep_device(g_under->alloc((n ? n : 1) * sizeof(float)));
    g_under->fill(d, 0xFF, n * sizeof(float));  // all bits set: a NaN in every element
    return d;
}

int32_t *check_device_unset_ints(size_t n) {
    int32_t *d = keep_device(g_under->alloc((n ? n : 1) * sizeof(int32_t)));
    g_under->fill(d, 0xFF, n * sizeof(int32_t));  // all bits set: −1 in every element
    return d;
}

static int report(const char *check, const char *output, double err, double tol, const char *why) {
    int ok = why == NULL && err <= tol;
    printf("%-4s %-44s %-10s err %.3g (tol %.0e)%s%s\n", ok ? "PASS" : "FAIL", check, output, err, tol,
           why ? ": " : "", why ? why : "");
    if (ok) check_passed++;
    else check_failed++;
    return ok;
}

int check_compare(const char *check, const char *output, const float *cpu, const float *test_result, size_t n,
                  double tol) {
    float *gpu = keep_host(mt_malloc((n ? n : 1) * sizeof(float)));
    check_download(gpu, test_result, n * sizeof(float));
    double scale = 1e-30, diff = 0;
    size_t unwritten = 0, first_bad = n;
    for (size_t i = 0; i < n; i++) {
        if (isnan(gpu[i]) && !isnan(cpu[i])) {
            if (unwritten++ == 0) first_bad = i;
            continue;
        }
        scale = fmax(scale, fabs((double)cpu[i]));
        diff = fmax(diff, fabs((double)gpu[i] - (double)cpu[i]));
    }
    char why[128];
    if (unwritten) {
        snprintf(why, sizeof(why), "%zu of %zu elements not written (NaN), the first at %zu", unwritten, n, first_bad);
        return report(check, output, diff / scale, tol, why);
    }
    return report(check, output, diff / scale, tol, NULL);
}

int check_compare_double(const char *check, const char *output, double cpu, double gpu, double tol) {
    check_finish();
    if (isnan(gpu) && !isnan(cpu)) return report(check, output, NAN, tol, "NaN");
    return report(check, output, fabs(gpu - cpu) / fmax(fabs(cpu), 1e-30), tol, NULL);
}

int check_compare_ints(const char *check, const char *output, const int32_t *cpu, const int32_t *test_result,
                       size_t n) {
    int32_t *gpu = keep_host(mt_malloc((n ? n : 1) * sizeof(int32_t)));
    check_download(gpu, test_result, n * sizeof(int32_t));
    size_t differ = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (gpu[i] != cpu[i] && differ++ == 0) first = i;
    if (!differ) return report(check, output, 0, 0, NULL);
    char why[160];
    snprintf(why, sizeof(why), "%zu of %zu differ, the first at %zu: %d, cpu %d", differ, n, first, gpu[first],
             cpu[first]);
    return report(check, output, (double)differ, 0, why);
}

void check_free_all(void) {
    check_finish();
    for (int i = 0; i < g_buffers.n_device; i++) g_under->release(g_buffers.device[i]);
    for (int i = 0; i < g_buffers.n_host; i++) free(g_buffers.host[i]);
    g_buffers.n_device = g_buffers.n_host = 0;
}
