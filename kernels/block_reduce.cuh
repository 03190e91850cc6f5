// Block-wide reduction of one value per thread, the result to every thread:
// the top-k kernels' (score_pages.cu, mass_budget.cu) and the keys rerank's (keys_rerank.cu).
#pragma once

#include <cstdint>

namespace ikv {
namespace cuda {

// blockDim.x a multiple of 32, at most 1024; scratch: blockDim.x / 32 slots.
template <class T, class Op>
__device__ T block_reduce(T v, T *scratch, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    __syncthreads();  // earlier readers of scratch are done
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    T r = scratch[0];
    for (uint32_t w = 1; w < blockDim.x / 32; ++w) r = op(r, scratch[w]);
    return r;
}

}  // namespace cuda
}  // namespace ikv
