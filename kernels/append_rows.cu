// Appends from device pointers: the engine's K/V rows never leave the device.
//   find_nonfinite_kernel: the first NaN/inf of the input in the order the
//     host check uses (K before V, layer, token, head, channel), as one
//     64-bit key lowered by atomicMin; the host reads back those 8 bytes.
//   stage_rows_kernel: input rows (F32/F16/BF16, any ikv_append strides)
//     converted to fp32 into the (sequence, layer) staging buffers in device
//     memory; the quantize kernel (quantize_pages.cu) then reads the staging.
// Conversions are exact (f16/bf16 -> f32 widen; f32 copies), so the staging
// holds the same floats as the host store's staging for the same input.
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/quant.hpp"
#include "ikv_kernels.h"

namespace ikv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t input_offset(const AppendRows &in, uint32_t l, uint32_t t, uint32_t h) {
    return (in.all_layers ? int64_t(l) * in.layer_stride : 0) + int64_t(t) * in.token_stride +
           int64_t(h) * in.head_stride;
}

// Raw bits of element `off` (F32: 32 bits; F16/BF16: 16 bits).
__device__ __forceinline__ uint32_t raw_bits(const void *base, ikv_dtype dt, int64_t off) {
    return dt == IKV_DTYPE_F32 ? static_cast<const uint32_t *>(base)[off] : static_cast<const uint16_t *>(base)[off];
}

// Non-finite test of raw bits: 0 finite, 1 NaN, 2 inf.
__device__ __forceinline__ int nonfinite(uint32_t b, ikv_dtype dt) {
    const uint32_t exp = dt == IKV_DTYPE_F32 ? 0x7F800000u : dt == IKV_DTYPE_F16 ? 0x7C00u : 0x7F80u;
    const uint32_t man = dt == IKV_DTYPE_F32 ? 0x007FFFFFu : uint32_t(~exp & 0x7FFFu);
    return (b & exp) != exp ? 0 : (b & man) == 0 ? 2 : 1;
}

constexpr int kRowsPerWarp = 4;  // rows a warp has in flight per iteration
constexpr int kPerLane = 8;      // channels per lane per pass (rows of up to 256 channels in one pass)

// One warp per input row (which, layer, token, head): its lanes read the
// row's D channels, all loads of kRowsPerWarp rows issued before any test.
// The row index is split into (which, layer, token, head) once per row with
// 32-bit divisions, not per element: the per-element 64-bit divisions of the
// first version made this check take 0.78 ms for a 2048-token, 32-layer
// append (ncu: 10% of DRAM bandwidth, 69% SM busy), the largest part of that
// append's 3.95 ms; per row with 64-bit divisions it took 0.33 ms.
__global__ void find_nonfinite_kernel(PageShape shape, AppendRows in, uint32_t l0, uint32_t n_layers,
                                      uint32_t n_tokens, unsigned long long *first) {
    const uint32_t H = shape.n_kv_heads, D = shape.head_dim, lane = threadIdx.x % 32;
    const uint64_t rows = 2 * uint64_t(n_layers) * n_tokens * H;
    const uint64_t warps = uint64_t(gridDim.x) * (blockDim.x / 32);
    for (uint64_t r0 = (uint64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * kRowsPerWarp; r0 < rows;
         r0 += warps * kRowsPerWarp) {
        const void *base[kRowsPerWarp];
        int64_t off[kRowsPerWarp];
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
            const uint64_t row = r0 + k < rows ? r0 + k : r0;  // a missing row repeats r0 (tested once)
            uint32_t h, t, wl;  // 32-bit divisions when the row count allows (always, in practice)
            if (rows <= 0xFFFFFFFFull) {
                const uint32_t r = uint32_t(row), lt = r / H;  // lt = (which * n_layers + layer) * n_tokens + token
                h = r - lt * H, t = lt % n_tokens, wl = lt / n_tokens;
            } else {
                const uint64_t lt = row / H;
                h = uint32_t(row % H), t = uint32_t(lt % n_tokens), wl = uint32_t(lt / n_tokens);
            }
            base[k] = wl >= n_layers ? in.v : in.k;
            off[k] = input_offset(in, l0 + (wl >= n_layers ? wl - n_layers : wl), t, h);
        }
        for (uint32_t d0 = 0; d0 < D; d0 += 32 * kPerLane) {
            uint32_t b[kRowsPerWarp][kPerLane];
#pragma unroll
            for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const uint32_t d = d0 + 32 * i + lane;
                    b[k][i] = d < D ? raw_bits(base[k], in.dtype, off[k] + d) : 0u;
                }
#pragma unroll
            for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const uint32_t d = d0 + 32 * i + lane;
                    const int nf = nonfinite(b[k][i], in.dtype);
                    if (d < D && r0 + k < rows && nf != 0)
                        atomicMin(first, (unsigned long long)(((r0 + k) * D + d) * 2 + (nf == 2 ? 1 : 0)));
                }
        }
    }
}

// Element `off` of the input as fp32 (exact widening).
__device__ __forceinline__ float load_input(const void *base, ikv_dtype dt, int64_t off) {
    if (dt == IKV_DTYPE_F32) return static_cast<const float *>(base)[off];
    const uint16_t b = static_cast<const uint16_t *>(base)[off];
    return dt == IKV_DTYPE_F16 ? f16_to_f32(b) : bf16_to_f32(b);
}

// Block x = (job * H + head) * 2 + (K|V), flat (H and the job count may each
// exceed grid y's limit): the job's rows of one head of K or V. kVec = 4: each
// thread moves 4 consecutive channels (one 8- or 16-byte load, one 16-byte
// store) when the host found the input aligned for it; 1: one element.
template <int kVec>
__global__ void stage_rows_kernel(PageShape shape, AppendRows in, const AppendJob *jobs) {
    const uint32_t H = shape.n_kv_heads, which = blockIdx.x % 2, h = blockIdx.x / 2 % H;
    const AppendJob j = jobs[blockIdx.x / 2 / H];
    const uint32_t D = shape.head_dim, P = shape.page_size;
    const uint64_t head_floats = uint64_t(P) * D;
    float *dst = j.stage + uint64_t(which) * H * head_floats + h * head_floats + uint64_t(j.row0) * D;
    const void *base = which == 0 ? in.k : in.v;
    for (uint32_t e = threadIdx.x * kVec; e < j.rows * D; e += blockDim.x * kVec) {
        const uint32_t i = e / D, d = e % D;
        const int64_t off = input_offset(in, j.layer, j.token0 + i, h) + d;
        if constexpr (kVec == 4) {
            float4 x;
            if (in.dtype == IKV_DTYPE_F32) {
                x = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + off);
            } else {
                const uint2 w = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + off);
                const bool f16 = in.dtype == IKV_DTYPE_F16;
                auto cvt = [f16](uint32_t b) { return f16 ? f16_to_f32(uint16_t(b)) : bf16_to_f32(uint16_t(b)); };
                x = make_float4(cvt(w.x & 0xFFFFu), cvt(w.x >> 16), cvt(w.y & 0xFFFFu), cvt(w.y >> 16));
            }
            *reinterpret_cast<float4 *>(dst + e) = x;  // rows of a head are contiguous in staging
        } else {
            dst[e] = load_input(base, in.dtype, off);
        }
    }
}

}  // namespace

cudaError_t launch_find_nonfinite(const PageShape &shape, const AppendRows &in, uint32_t l0, uint32_t n_layers,
                                  uint32_t n_tokens, unsigned long long *first, cudaStream_t stream) {
    const uint64_t rows = 2ull * n_layers * n_tokens * shape.n_kv_heads;
    if (rows == 0) return cudaSuccess;
    const uint64_t per_block = (kThreads / 32) * kRowsPerWarp;
    const uint64_t blocks = (rows + per_block - 1) / per_block;
    const unsigned grid = unsigned(blocks < 4096 ? blocks : 4096);
    find_nonfinite_kernel<<<grid, kThreads, 0, stream>>>(shape, in, l0, n_layers, n_tokens, first);
    return cudaGetLastError();
}

cudaError_t launch_stage_rows(const PageShape &shape, const AppendRows &in, const AppendJob *jobs, uint32_t n_jobs,
                              cudaStream_t stream) {
    if (n_jobs == 0) return cudaSuccess;
    if (2ull * n_jobs * shape.n_kv_heads > 0x7FFFFFFFull) return cudaErrorInvalidValue;
    // Vector path: every row start 4-element aligned (pointers and strides),
    // so each thread's 4 channels are one aligned load (staging rows are).
    const uint64_t esize = in.dtype == IKV_DTYPE_F32 ? 4 : 2;
    const bool vec = shape.head_dim % 4 == 0 && in.token_stride % 4 == 0 && in.head_stride % 4 == 0 &&
                     (!in.all_layers || in.layer_stride % 4 == 0) &&
                     (reinterpret_cast<uintptr_t>(in.k) | reinterpret_cast<uintptr_t>(in.v)) % (4 * esize) == 0;
    const unsigned grid = 2 * n_jobs * shape.n_kv_heads;
    if (vec)
        stage_rows_kernel<4><<<grid, kThreads, 0, stream>>>(shape, in, jobs);
    else
        stage_rows_kernel<1><<<grid, kThreads, 0, stream>>>(shape, in, jobs);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ikv
