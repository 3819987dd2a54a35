// device.c — the device choice, tensor memory and the op backend that goes with them.
//
// The cuda backend is a plugin (libmoetron_cuda.so beside the executable, built with the
// CUDA toolkit): it is loaded only when a run asks for the GPU, or asks for auto on a
// machine with an NVIDIA driver, so cpu runs never pay for loading the CUDA libraries.
#include "core/device.h"

#include <dlfcn.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/strict_memory.h"
#include "ops/backend.h"
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#define DEVICE_HAS_CUDA 1
#include "ops/cuda/cuda_ops.h"
#else
#define DEVICE_HAS_CUDA 0
#endif

static DeviceKind active = DEVICE_CPU;
static size_t live_blocks;  // device_calloc'd and not yet freed: the device cannot change under them

int device_cuda_built(void) { return DEVICE_HAS_CUDA; }

#if DEVICE_HAS_CUDA
#define PLUGIN_FILE "libmoetron_cuda.so"

// The plugin's path: beside the executable (MOETRON_CUDA_PLUGIN overrides).
static void plugin_path(char *path, size_t size) {
    const char *given = getenv("MOETRON_CUDA_PLUGIN");
    if (given && given[0]) {
        snprintf(path, size, "%s", given);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        snprintf(path, size, "%s", PLUGIN_FILE);  // the loader's search path
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) slash[1] = '\0';
    snprintf(path, size, "%s%s", exe, PLUGIN_FILE);
}

// The loaded plugin; NULL with *why set when it cannot be loaded.
static const CudaPlugin *cuda_plugin(const char **why) {
    static const CudaPlugin *plugin;
    static char error[2 * PATH_MAX + 256];
    if (plugin) return plugin;
    char path[PATH_MAX + sizeof(PLUGIN_FILE)];
    plugin_path(path, sizeof(path));
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(error, sizeof(error), "cannot load the cuda backend %s (%s); rebuild with make", path, dlerror());
        *why = error;
        return NULL;
    }
    plugin = dlsym(lib, CUDA_PLUGIN_SYMBOL);
    if (!plugin) {
        snprintf(error, sizeof(error), "%s has no %s; rebuild with make", path, CUDA_PLUGIN_SYMBOL);
        *why = error;
    }
    return plugin;
}

// Whether an NVIDIA driver is present at all (cheap: no library is loaded).
static int nvidia_driver_present(void) { return access("/proc/driver/nvidia/version", R_OK) == 0; }

static const CudaPlugin *require_plugin(void) {
    const char *why = NULL;
    const CudaPlugin *p = cuda_plugin(&why);
    if (!p) mt_die("--device cuda: %s", why);
    return p;
}
#endif

int device_cuda_count(void) {
#if DEVICE_HAS_CUDA
    const char *why = NULL;
    const CudaPlugin *p = nvidia_driver_present() ? cuda_plugin(&why) : NULL;
    return p ? p->device_count() : 0;
#else
    return 0;
#endif
}

int device_name_known(const char *name) {
    return !strcmp(name, "cpu") || !strcmp(name, "cuda") || !strcmp(name, "auto") || !strcmp(name, "cpu-strict");
}

DeviceKind device_parse(const char *name) {
    if (strcmp(name, "cpu") == 0) return DEVICE_CPU;
    if (strcmp(name, "cpu-strict") == 0) return DEVICE_CPU_STRICT;
    if (strcmp(name, "auto") == 0) return device_cuda_count() > 0 ? DEVICE_CUDA : DEVICE_CPU;
    if (strcmp(name, "cuda") != 0) mt_die("--device %s: use %s", name, DEVICE_NAMES);
    if (!device_cuda_built())
        mt_die("--device cuda: this moetron was built without CUDA (install the CUDA toolkit so make finds nvcc, "
               "and build without NO_CUDA=1), or use --device cpu");
#if DEVICE_HAS_CUDA
    if (require_plugin()->device_count() == 0)
        mt_die("--device cuda: no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu");
#endif
    return DEVICE_CUDA;
}

int device_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                                       "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) >= 0) return atoi(v);
    }
    return 0;
}

void device_select(DeviceKind kind, int gemm_inputs) {
    if (live_blocks && kind != active)
        mt_die("internal error: the device changed with %zu tensors allocated (please report)", live_blocks);
    active = kind;
#if DEVICE_HAS_CUDA
    if (kind == DEVICE_CUDA) {
        const CudaPlugin *p = require_plugin();
        p->init(device_local_rank());
        ops_select(p->ops);
        device_set_gemm_inputs(gemm_inputs);
        return;
    }
#endif
    if (kind == DEVICE_CPU_STRICT) strict_memory_enable();
    ops_select(&ops_cpu_backend);
    device_set_gemm_inputs(gemm_inputs);
}

static int gemm_inputs_now = GEMM_INPUTS_FP32;

void device_set_gemm_inputs(int gemm_inputs) {
    gemm_inputs_now = gemm_inputs;
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) {
        require_plugin()->set_gemm_inputs(gemm_inputs);
        return;
    }
#endif
    mt_gemm_set_inputs((GemmInputs)gemm_inputs);
}

int device_gemm_inputs(void) { return gemm_inputs_now; }

DeviceKind device_active(void) { return active; }

const char *device_description(void) {
#if DEVICE_HAS_CUDA
    static char text[300];
    if (active == DEVICE_CUDA) {
        snprintf(text, sizeof(text), "cuda (%s)", require_plugin()->device_name());
        return text;
    }
#endif
    return active == DEVICE_CPU_STRICT ? "cpu (strict memory)" : "cpu";
}

void *device_calloc(size_t count, size_t size) {
    if (count && size > (size_t)-1 / count) mt_die("out of memory: a tensor of %zu x %zu bytes", count, size);
    live_blocks++;
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) return require_plugin()->malloc_zeroed(count * size);
#endif
    if (active == DEVICE_CPU_STRICT) return strict_alloc(count * size);
    return mt_calloc(count ? count : 1, size ? size : 1);
}

void *device_host_calloc(size_t count, size_t size) {
    if (count && size > (size_t)-1 / count) mt_die("out of memory: a host buffer of %zu x %zu bytes", count, size);
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) return require_plugin()->host_calloc(count * size);
#endif
    return mt_calloc(count ? count : 1, size ? size : 1);
}

void device_host_free(void *p) {
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) {
        require_plugin()->host_free(p);
        return;
    }
#endif
    free(p);
}

void device_free(void *p) {
    if (!p) return;
    live_blocks--;
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) {
        require_plugin()->free(p);
        return;
    }
#endif
    if (active == DEVICE_CPU_STRICT) strict_free(p);
    else free(p);
}

void device_access_begin(void) {
    if (active == DEVICE_CPU_STRICT) strict_open();
}

void device_access_end(void) {
    if (active == DEVICE_CPU_STRICT) strict_close();
}

// The explicit copies: on the GPU the plugin's (upload: staged, the host buffer is free again
// at return; download: waits for the ops queued before it; copy: waits when either side is
// host memory), on the cpu devices a memcpy with tensor memory opened.
typedef enum { COPY_UPLOAD, COPY_DOWNLOAD, COPY_ANY } CopyKind;

static void copy_bytes(CopyKind kind, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) {
        const CudaPlugin *p = require_plugin();
        (kind == COPY_UPLOAD ? p->upload : kind == COPY_DOWNLOAD ? p->download : p->copy)(dst, src, bytes);
        return;
    }
#endif
    device_access_begin();
    memcpy(dst, src, bytes);
    device_access_end();
}

void device_upload(void *dst, const void *host, size_t bytes) { copy_bytes(COPY_UPLOAD, dst, host, bytes); }
void device_download(void *host, const void *src, size_t bytes) { copy_bytes(COPY_DOWNLOAD, host, src, bytes); }
void device_copy(void *dst, const void *src, size_t bytes) { copy_bytes(COPY_ANY, dst, src, bytes); }

double device_memory_free_bytes(void) {
#if DEVICE_HAS_CUDA
    if (active == DEVICE_CUDA) return require_plugin()->memory_free_bytes();
#endif
    return -1;
}
