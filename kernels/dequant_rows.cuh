// One row's channels of a sub-page dequantized to fp32 (every page format):
// the plain loads the kernels off the decode's hot path share (the
// multi-token path's key tiles, attention feedback). The fused decode has its
// own staged, pipelined loads (decode_attention.cu).
#pragma once

#include "common/page_format.hpp"
#include "decode_formats.cuh"

namespace ikv {
namespace cuda {

// 8 channels [8c, 8c+8) of row `row` of K (IsK) or V of a sub-page, dequantized.
template <int D, int F, bool IsK>
__device__ __forceinline__ void dequant8(const uint8_t *sub, uint32_t P, uint32_t row, uint32_t c, float x[8]) {
    const SubpageLayout L = subpage_layout(ikv_format(F), P, uint32_t(D));
    constexpr uint32_t kRow = uint32_t(row_bytes(ikv_format(F), D)), kLane = kRow / (D / 8);
    dec::raw8<F>(sub + (IsK ? L.k : L.v) + uint64_t(row) * kRow + c * kLane, x);
    const float *sc = reinterpret_cast<const float *>(sub + (IsK ? L.k_scale : L.v_scale));
    const __half *sch = reinterpret_cast<const __half *>(sub + (IsK ? L.k_scale : L.v_scale));  // INT4: halves
    const __half *mnh = reinterpret_cast<const __half *>(sub + (IsK ? L.k_min : L.v_min));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const uint32_t d = 8 * c + j;
        if (F == IKV_FMT_FP8_E4M3) x[j] *= sc[0];
        if (F == IKV_FMT_INT8) x[j] *= IsK ? sc[d] : sc[row];
        if (F == IKV_FMT_INT4) {
            const uint32_t i = IsK ? d : row * int4_v_groups(D) + d / kInt4VGroup;
            x[j] = x[j] * __half2float(sch[i]) + __half2float(mnh[i]);
        }
    }
}

}  // namespace cuda
}  // namespace ikv
