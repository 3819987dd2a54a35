// comm_sum.cu — the GPU side of the NCCL data path (comm_nccl.c, C): the ordered sum of
// the blocks a reduce-scatter received, and the compute stream, for C callers.
//
// The sum has to give the bits of comm_sum_in_order on the cpu: element i is
// ((b_0[i] + b_1[i]) + b_2[i]) + ... in the element type. Each thread adds one element's
// blocks in rank order; the additions are written as PTX add.rn (IEEE round to nearest,
// subnormals kept, never fused), so flags such as -ftz=true or --use_fast_math cannot
// change them. (Only NaN payloads may differ from the cpu's: the GPU returns the
// canonical NaN.)
#include "ops/cuda/cuda_internal.h"
#include "parallel/comm_impl.h"

static __device__ __forceinline__ float add_rn(float a, float b) {
    float s;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(s) : "f"(a), "f"(b));
    return s;
}

static __device__ __forceinline__ double add_rn(double a, double b) {
    double s;
    asm("add.rn.f64 %0, %1, %2;" : "=d"(s) : "d"(a), "d"(b));
    return s;
}

template <typename T>
__global__ void sum_blocks_kernel(T *out, const T *blocks, int nparts, size_t count) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        T s = blocks[i];
        for (int q = 1; q < nparts; q++) s = add_rn(s, blocks[(size_t)q * count + i]);
        out[i] = s;
    }
}

extern "C" struct CUstream_st *comm_compute_stream(void) { return cuda_stream(); }

extern "C" void comm_sum_blocks_device(CommType t, void *out, const void *blocks, int nparts, size_t count,
                                       struct CUstream_st *stream) {
    if (count == 0) return;
    const unsigned threads = 256;
    if (t == CT_FLOAT)
        sum_blocks_kernel<<<cuda_blocks(count, threads), threads, 0, stream>>>(
            (float *)out, (const float *)blocks, nparts, count);
    else if (t == CT_DOUBLE)
        sum_blocks_kernel<<<cuda_blocks(count, threads), threads, 0, stream>>>(
            (double *)out, (const double *)blocks, nparts, count);
    else
        mt_die("internal error: an ordered sum of type %d (please report)", (int)t);
    CUDA_CHECK_LAUNCH();
}
