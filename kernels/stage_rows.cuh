// Staging an append's input rows on the device: the engine's K/V (F32/F16/
// BF16, any ikv_append strides, batch numbering) converted to fp32 rows of a
// (sequence, layer) staging buffer, which quantize-on-write then reads.
// Shared by the finiteness check (append_rows.cu: input addressing) and the
// fused stage + quantize kernel (quantize_pages.cu).
// Conversions are exact (f16/bf16 -> f32 widen; f32 copies), so the staging
// holds the same floats as the host store's staging for the same input.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/quant.hpp"
#include "ikv_kernels.h"

namespace ikv {
namespace cuda {

// Element offset of row (layer l, token t, head h); t in batch numbering
// (AppendRows::seq_tokens), split with one 32-bit division.
__device__ __forceinline__ int64_t input_offset(const AppendRows &in, uint32_t l, uint32_t t, uint32_t h) {
    const uint32_t seq = t / in.seq_tokens, ts = t - seq * in.seq_tokens;
    return (in.all_layers ? int64_t(l) * in.layer_stride : 0) + int64_t(seq) * in.seq_stride +
           int64_t(ts) * in.token_stride + int64_t(h) * in.head_stride;
}

// F16 or BF16 bits (the low 16) as fp32: exact widening.
__device__ __forceinline__ float widen16(uint32_t b, bool f16) {
    return f16 ? f16_to_f32(uint16_t(b)) : bf16_to_f32(uint16_t(b));
}
// fp32 as F16 or BF16 bits (round to nearest even; finite values saturate): what a 16-bit page stores.
__device__ __forceinline__ uint16_t narrow16(float x, bool f16) { return f16 ? f32_to_f16(x) : f32_to_bf16(x); }

// Element `off` of the input as fp32.
__device__ __forceinline__ float load_input(const void *base, ikv_dtype dt, int64_t off) {
    if (dt == IKV_DTYPE_F32) return static_cast<const float *>(base)[off];
    return widen16(static_cast<const uint16_t *>(base)[off], dt == IKV_DTYPE_F16);
}

// Staging keeps finite values only: a non-finite x becomes 0 and the first
// one found is recorded (element d of row i of job j, K or V). Checked
// appends never get here with one: the host refused them before.
__device__ __forceinline__ float finite_or_record(float x, const AppendJob &j, const AppendRows &in, uint32_t i,
                                                  uint32_t h, uint32_t d, uint32_t which, AppendError *error) {
    if (isfinite(x)) return x;
    if (atomicCAS(&error->claimed, 0u, 1u) == 0u) {
        error->seq = j.seq;
        error->layer = j.layer;
        error->token = (j.token0 + i) % in.seq_tokens;
        error->head = h;
        error->channel = d;
        error->which = which;
        error->is_nan = isnan(x) ? 1u : 0u;
    }
    return 0.0f;
}

// The block's threads stage job j's rows of head h of K (which 0) or V (1).
// kVec = 4: each thread moves 4 consecutive channels (one 8- or 16-byte
// load, one 16-byte store) when the host found the input aligned for it
// (vector_aligned); 1: one element.
template <int kVec>
__device__ __forceinline__ void stage_head(const PageShape &shape, const AppendRows &in, const AppendJob &j,
                                           uint32_t h, uint32_t which, AppendError *error) {
    const uint32_t H = shape.n_kv_heads, D = shape.head_dim;
    const uint64_t head_floats = uint64_t(shape.page_size) * D;
    float *dst = j.stage + uint64_t(which) * H * head_floats + h * head_floats + uint64_t(j.row0) * D;
    const void *base = which == 0 ? in.k : in.v;
    for (uint32_t e = threadIdx.x * kVec; e < j.rows * D; e += blockDim.x * kVec) {
        const uint32_t i = e / D, d = e % D;
        const int64_t off = input_offset(in, j.layer, j.token0 + i, h) + d;
        if constexpr (kVec == 4) {
            float x[4];
            if (in.dtype == IKV_DTYPE_F32) {
                const float4 f = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + off);
                x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
            } else {
                const uint2 w = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + off);
                const bool f16 = in.dtype == IKV_DTYPE_F16;
                x[0] = widen16(w.x, f16), x[1] = widen16(w.x >> 16, f16);
                x[2] = widen16(w.y, f16), x[3] = widen16(w.y >> 16, f16);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) x[c] = finite_or_record(x[c], j, in, i, h, d + c, which, error);
            *reinterpret_cast<float4 *>(dst + e) = make_float4(x[0], x[1], x[2], x[3]);  // staging rows are contiguous
        } else {
            dst[e] = finite_or_record(load_input(base, in.dtype, off), j, in, i, h, d, which, error);
        }
    }
}

// Whether every input row starts on a 16-byte boundary and holds whole
// 16-byte vectors: pointers, strides (elements) and head_dim.
inline bool vector_aligned(const PageShape &shape, const AppendRows &in) {
    const int64_t per = in.dtype == IKV_DTYPE_F32 ? 4 : 8;  // elements per 16 bytes
    return shape.head_dim % per == 0 && in.token_stride % per == 0 && in.head_stride % per == 0 &&
           in.seq_stride % per == 0 && (!in.all_layers || in.layer_stride % per == 0) &&
           (reinterpret_cast<uintptr_t>(in.k) | reinterpret_cast<uintptr_t>(in.v)) % 16 == 0;
}

}  // namespace cuda
}  // namespace ikv
