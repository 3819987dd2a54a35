// context.cu — the cuda backend's device, stream, cuBLAS handle and memory.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/cuda/cuda_internal.h"

static struct {
    int ready, device, sm_count, gemm_inputs;
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
void cuda_set_gemm_inputs(int inputs) { ctx.gemm_inputs = inputs; }
int cuda_gemm_inputs(void) { return ctx.gemm_inputs; }
const char *cuda_device_name(void) { return ctx.ready ? ctx.name : "none"; }

double cuda_memory_free_bytes(void) {
    require_ready();
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return (double)free_bytes;
}

// Device memory comes from the device's default memory pool, allocated and freed in the
// stream's order (cudaMallocAsync / cudaFreeAsync): a free never waits for the device,
// and the pool keeps what it was given (release threshold: all of it), so buffers that
// grow or are rebuilt reuse memory without going back to the driver.
static void keep_pool_memory(void) {
    static int done;
    if (done) return;
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ctx.device));
    uint64_t keep_all = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    done = 1;
}

void *cuda_malloc(size_t bytes) {
    require_ready();
    keep_pool_memory();
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMallocAsync(&p, bytes, ctx.stream);
    if (e != cudaSuccess)
        mt_die("out of GPU memory: %.1f MiB of device memory could not be had (%s); use a smaller model, "
               "--micro-batch-size or more GPUs",
               bytes / 1048576.0, cudaGetErrorString(e));
    return p;
}

void *cuda_malloc_zeroed(size_t bytes) {
    void *p = cuda_malloc(bytes);
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, ctx.stream));
    return p;
}

void cuda_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeAsync(p, cuda_stream()));
}

void *cuda_host_calloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        mt_die("out of page-locked host memory: %.1f MiB could not be had (%s); lower --optimizer-offload-fraction",
               bytes / 1048576.0, cudaGetErrorString(e));
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

void cuda_host_free(void *p) {
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // no copy in flight may still read it
    CUDA_CHECK(cudaFreeHost(p));
}

// ---- host staging: pinned memory between host buffers and device memory -------------------
//
// A ring of pinned slots, each with the event of its last copy. An upload copies the host
// bytes into a slot and queues the slot's copy to the device on the stream, so the caller
// may reuse its buffer on return and the device sees the bytes in stream order; a slot is
// written again only after its event. A download queues the copy into a slot, waits for it
// (the step's synchronisation point) and copies the slot out.
enum { STAGING_SLOTS = 8, STAGING_SLOT_BYTES = 4 << 20 };

static struct {
    char *slot[STAGING_SLOTS];
    cudaEvent_t done[STAGING_SLOTS];
    int next;
} staging;

static int staging_take(void) {
    require_ready();
    int i = staging.next;
    staging.next = (i + 1) % STAGING_SLOTS;
    if (!staging.slot[i]) {
        CUDA_CHECK(cudaMallocHost((void **)&staging.slot[i], STAGING_SLOT_BYTES));
        CUDA_CHECK(cudaEventCreateWithFlags(&staging.done[i], cudaEventDisableTiming));
    } else {
        CUDA_CHECK(cudaEventSynchronize(staging.done[i]));
    }
    return i;
}

void cuda_upload(void *dst, const void *host, size_t bytes) {
    for (size_t at = 0; at < bytes; at += STAGING_SLOT_BYTES) {
        size_t n = bytes - at < (size_t)STAGING_SLOT_BYTES ? bytes - at : (size_t)STAGING_SLOT_BYTES;
        int i = staging_take();
        memcpy(staging.slot[i], (const char *)host + at, n);
        CUDA_CHECK(cudaMemcpyAsync((char *)dst + at, staging.slot[i], n, cudaMemcpyHostToDevice, ctx.stream));
        CUDA_CHECK(cudaEventRecord(staging.done[i], ctx.stream));
    }
}

void cuda_download(void *host, const void *src, size_t bytes) {
    for (size_t at = 0; at < bytes; at += STAGING_SLOT_BYTES) {
        size_t n = bytes - at < (size_t)STAGING_SLOT_BYTES ? bytes - at : (size_t)STAGING_SLOT_BYTES;
        int i = staging_take();
        CUDA_CHECK(cudaMemcpyAsync(staging.slot[i], (const char *)src + at, n, cudaMemcpyDeviceToHost, ctx.stream));
        CUDA_CHECK(cudaEventRecord(staging.done[i], ctx.stream));
        CUDA_CHECK(cudaEventSynchronize(staging.done[i]));
        memcpy((char *)host + at, staging.slot[i], n);
    }
}

// ---- op timing: events on the stream (--profile) -------------------------------------------
enum { TIMER_MARKS = 8192 };
static struct {
    cudaEvent_t mark[TIMER_MARKS];
    int used;
} timer;

int cuda_timer_mark(void) {
    if (timer.used == TIMER_MARKS) return -1;
    int i = timer.used++;
    if (!timer.mark[i]) CUDA_CHECK(cudaEventCreate(&timer.mark[i]));
    CUDA_CHECK(cudaEventRecord(timer.mark[i], cuda_stream()));
    return i;
}

double cuda_timer_seconds(int from, int to) {
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(timer.mark[to]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, timer.mark[from], timer.mark[to]));
    return ms / 1e3;
}

void cuda_timer_reset(void) { timer.used = 0; }

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

// Whether p is host memory (pageable or pinned) rather than device memory.
static int is_host_memory(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();  // older runtimes: an unregistered host pointer is an error
        return 1;
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

void cuda_copy(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()));
    if (is_host_memory(dst) || is_host_memory(src)) cuda_finish();
}

void cuda_memset(void *dst, int byte, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, cuda_stream()));
    cuda_finish();
}
