// state.cu — the cuda backend's state ops (contracts in ops_state.h): sampling generation's
// next token. One thread walks the vocabulary with the arithmetic of ops/sample_token.h, the
// cpu's own, so the token is the cpu's. One token per generated position: the serial walk
// costs O(top_k·vocab + vocab·log vocab) on one thread.
#include "ops/cuda/cuda_internal.h"
#include "ops/sample_token.h"

__global__ void sample_next_token_kernel(int32_t *token, const float *logits, int vocab, SampleParams p, double *work,
                                         int32_t *order) {
    if (blockIdx.x == 0 && threadIdx.x == 0) token[0] = sample_token(logits, vocab, &p, work, order);
}

void cuda_sample_next_token(int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work,
                            int32_t *order) {
    sample_next_token_kernel<<<1, 1, 0, cuda_stream()>>>(token, logits, vocab, *p, work, order);
    CUDA_CHECK_LAUNCH();
}
