// gpu_check.c — the harness of the cuda op checks (gpu_check.h): random inputs, device
// copies, NaN-poisoned outputs, normwise comparison, and the pass/fail count.
#include "gpu_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

enum { MAX_BLOCKS = 4096 };

static struct {
    void *host[MAX_BLOCKS], *device[MAX_BLOCKS];
    int n_host, n_device;
    uint64_t rng;
} h = {.rng = 0x9E3779B97F4A7C15ull};

int check_passed, check_failed;

static uint64_t next_u64(void) {  // xorshift64*: a fixed sequence, so every run checks the same data
    h.rng ^= h.rng >> 12;
    h.rng ^= h.rng << 25;
    h.rng ^= h.rng >> 27;
    return h.rng * 0x2545F4914F6CDD1Dull;
}

static void *keep_host(void *p) {
    if (h.n_host == MAX_BLOCKS) mt_die("check harness: more than %d host buffers in one check", MAX_BLOCKS);
    return h.host[h.n_host++] = p;
}

static void *keep_device(void *p) {
    if (h.n_device == MAX_BLOCKS) mt_die("check harness: more than %d device buffers in one check", MAX_BLOCKS);
    return h.device[h.n_device++] = p;
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
    void *d = keep_device(cuda_malloc(bytes ? bytes : 1));
    if (bytes) cuda_memcpy_h2d(d, host, bytes);
    return d;
}

float *check_to_device(const float *host, size_t n) { return check_device_bytes(host, n * sizeof(float)); }
int32_t *check_ints_to_device(const int32_t *host, size_t n) { return check_device_bytes(host, n * sizeof(int32_t)); }

float *check_device_nan(size_t n) {
    float *d = keep_device(cuda_malloc((n ? n : 1) * sizeof(float)));
    cuda_memset(d, 0xFF, n * sizeof(float));  // all bits set: a NaN in every element
    return d;
}

int32_t *check_device_unset_ints(size_t n) {
    int32_t *d = keep_device(cuda_malloc((n ? n : 1) * sizeof(int32_t)));
    cuda_memset(d, 0xFF, n * sizeof(int32_t));  // all bits set: −1 in every element
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

int check_compare(const char *check, const char *output, const float *cpu, const float *gpu_device, size_t n,
                  double tol) {
    float *gpu = keep_host(mt_malloc((n ? n : 1) * sizeof(float)));
    cuda_finish();
    cuda_memcpy_d2h(gpu, gpu_device, n * sizeof(float));
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
    if (isnan(gpu) && !isnan(cpu)) return report(check, output, NAN, tol, "NaN");
    return report(check, output, fabs(gpu - cpu) / fmax(fabs(cpu), 1e-30), tol, NULL);
}

int check_compare_ints(const char *check, const char *output, const int32_t *cpu, const int32_t *gpu_device,
                       size_t n) {
    int32_t *gpu = keep_host(mt_malloc((n ? n : 1) * sizeof(int32_t)));
    cuda_finish();
    cuda_memcpy_d2h(gpu, gpu_device, n * sizeof(int32_t));
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
    cuda_finish();
    for (int i = 0; i < h.n_device; i++) cuda_free(h.device[i]);
    for (int i = 0; i < h.n_host; i++) free(h.host[i]);
    h.n_device = h.n_host = 0;
}
