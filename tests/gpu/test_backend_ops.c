// test_backend_ops.c — every op of a backend under test against the cpu backend on random
// inputs (tests/gpu/op_check.h says how they are compared), through the op table.
//
//   test_backend_ops [cpu|cuda]   (default: cuda where built with it, else cpu)
//
// make test runs it for the cpu backend (the harness, and the cpu ops' contracts: every
// output they overwrite written, the same bits on a second run); make check-gpu for the
// cuda backend. Exits 0 when every check passed and every op of the list was checked,
// 1 when one failed, 2 when the backend cannot run here.
#include <stdio.h>
#include <string.h>

#include "op_check.h"
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#include "ops/cuda/cuda_ops.h"
#define DEFAULT_BACKEND "cuda"
#else
#define DEFAULT_BACKEND "cpu"
#endif

// The backend named on the command line, ready to run; NULL (after one line) when it cannot.
static const CheckBackend *backend_named(const char *name) {
    if (strcmp(name, "cpu") == 0) return &check_backend_cpu;
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
    if (strcmp(name, "cuda") == 0) {
        if (cuda_device_count() == 0) {
            fprintf(stderr, "test_backend_ops: no CUDA device is visible; the cuda op checks need a GPU\n");
            return NULL;
        }
        cuda_init(0);
        printf("cuda op checks on %s\n", cuda_device_name());
        return &check_backend_cuda;
    }
#endif
    fprintf(stderr, "test_backend_ops: unknown or unbuilt backend '%s' (this build has: cpu%s)\n", name,
            strcmp(DEFAULT_BACKEND, "cuda") == 0 ? ", cuda" : "");
    return NULL;
}

int main(int argc, char **argv) {
    const CheckBackend *b = backend_named(argc > 1 ? argv[1] : DEFAULT_BACKEND);
    if (!b) return 2;
    check_use(b);
    printf("op checks: the %s backend against the cpu backend\n", b->name);
    check_gemm_ops();
    check_elementwise_ops();
    check_attention_ops();
    check_moe_ops();
    check_loss_ops();
    check_router_ops();
    check_dispatch_ops();
    check_parallel_ops();
    check_state_ops();
    check_quantize_ops();
    check_uncovered_ops();
    printf("%d passed, %d failed\n", check_passed, check_failed);
    if (check_failed) return 1;
    printf("ok test_backend_ops %s: %d checks, every op of the list\n", b->name, check_passed);
    return 0;
}
