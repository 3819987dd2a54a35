// check_ops.c — every op of the cuda backend against the cpu backend on random inputs
// (tests/gpu/gpu_check.h says how they are compared). Run by make check-gpu; exits 0
// when every check passed, 1 when one failed, 2 when no GPU is visible.
#include <stdio.h>

#include "gpu_check.h"

int main(void) {
    if (cuda_device_count() == 0) {
        fprintf(stderr, "check_gpu_ops: no CUDA device is visible; the cuda op checks need a GPU\n");
        return 2;
    }
    cuda_init(0);
    printf("cuda op checks on %s\n", cuda_device_name());
    check_gemm_ops();
    check_elementwise_ops();
    check_attention_ops();
    check_moe_ops();
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
