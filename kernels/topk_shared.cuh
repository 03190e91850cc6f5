// Device helpers the page-selection kernels share (kernels/score_pages.cu,
// kernels/mass_budget.cu, kernels/select_pages.cu): the hybrid score's shift
// and the order key that ranks candidates.
#pragma once

#include <math.h>

#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "topk_stages.hpp"

namespace ikv {
namespace cuda {
namespace topk {

// The offset of a query memory's rows for pair bh = seq * n_kv_heads + head:
// 0 without a memory, the memory's offset where it recalled a turn, -inf where
// it recalled nothing (those rows never win).
__device__ __forceinline__ float hybrid_mem_offset(const TopkParams &p, uint64_t bh) {
    return p.mem_rows == nullptr ? 0.0f : p.mem_ok[bh] ? p.mem_offset : -INFINITY;
}

// IKV_TOPK_SCORE_HYBRID's shift, shared by the kernels that apply it (the
// combine kernel of score_pages.cu, and the select and mass kernels where they do the
// combine themselves), as decode/selection.cpp's combine_rows: row g's offset
// is 0 for the current queries, the memory's offset (or -inf where it recalled
// nothing) for a query memory's rows; candidate i's score is the max over the
// rows of (sum - the row's best + offset), a NaN never winning.
template <class Top>
__device__ __forceinline__ float hybrid_score(const float *rows, uint64_t stride, uint32_t i, uint32_t R, uint32_t G,
                                              float mem_off, Top top) {
    float best = -INFINITY;
    for (uint32_t g = 0; g < R; ++g) {
        const float s = rows[uint64_t(g) * stride + i] - top(g) + (g < G ? 0.0f : mem_off);
        if (s > best) best = s;
    }
    return best;
}
// Each of R (<= kMaxFusedRows) rows' maximum over a 1024-thread block, from
// every thread's m[g]: left at part[g][0] ([rows][warps] scratch). Every
// thread calls it; two barriers.
__device__ __forceinline__ void block_row_max(float (&m)[kMaxFusedRows], uint32_t R, float (*part)[32]) {
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (uint32_t g = 0; g < kMaxFusedRows; ++g) {
        for (int o = 16; o > 0; o >>= 1) m[g] = fmaxf(m[g], __shfl_xor_sync(0xFFFFFFFFu, m[g], o));
        if (lane == 0) part[g][warp] = m[g];
    }
    __syncthreads();
    if (warp < R) {
        float t = part[warp][lane];
        for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xFFFFFFFFu, t, o));
        __syncwarp();  // every lane read its word before lane 0 overwrites the first
        if (lane == 0) part[warp][0] = t;
    }
    __syncthreads();
}


// Order key of a non-mandatory candidate: ascending key = bound descending.
// 0 is never used (kept free); NaN bounds sort last.
__device__ __forceinline__ uint32_t order_key(float score) {
    if (score != score) return 0xFFFFFFFFu;
    const uint32_t u = f32_bits(score);
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending float order
    const uint32_t k = ~asc;                                            // descending
    return k == 0 ? 1u : k;
}


}  // namespace topk
}  // namespace cuda
}  // namespace ikv
