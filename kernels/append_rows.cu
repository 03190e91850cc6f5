// Appends from device pointers: the engine's K/V rows never leave the device.
//   find_nonfinite_vec_kernel / find_nonfinite_kernel: the first NaN/inf of
//     the input in the order the host check uses (K before V, layer, token,
//     head, channel), as one 64-bit key lowered by atomicMin; the host reads
//     back those 8 bytes. 16-byte vectors when every row start is aligned
//     for them, else one warp per row.
// Staging the rows (stage_rows.cuh) is fused with quantize-on-write in
// quantize_pages.cu.
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "stage_rows.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

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

// Where vector i of the flattened rows lies (nvec vectors a row; the row
// kernel passes nvec = 1): its row (which, layer, token, head), its index in
// the row, the array (K or V) and the element offset of the row's start.
struct Located {
    uint64_t row;
    uint32_t vi;
    const void *base;
    int64_t off;
};

// I = uint32_t when the count allows (always, in practice): 32-bit divisions.
template <class I>
__device__ __forceinline__ Located locate_as(I i, uint32_t nvec, uint32_t H, const AppendRows &in, uint32_t l0,
                                             uint32_t n_layers, uint32_t n_tokens) {
    const I r = i / nvec, lt = r / H;  // lt = (which * n_layers + layer) * n_tokens + token
    const uint32_t h = uint32_t(r - lt * H), t = uint32_t(lt % n_tokens), wl = uint32_t(lt / n_tokens);
    const bool is_v = wl >= n_layers;
    return Located{uint64_t(r), uint32_t(i - r * nvec), is_v ? in.v : in.k,
                   input_offset(in, l0 + (is_v ? wl - n_layers : wl), t, h)};
}

__device__ __forceinline__ Located locate(uint64_t i, uint64_t total, uint32_t nvec, uint32_t H, const AppendRows &in,
                                          uint32_t l0, uint32_t n_layers, uint32_t n_tokens) {
    return total <= 0xFFFFFFFFull ? locate_as<uint32_t>(uint32_t(i), nvec, H, in, l0, n_layers, n_tokens)
                                  : locate_as<uint64_t>(i, nvec, H, in, l0, n_layers, n_tokens);
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
        Located at[kRowsPerWarp];
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k)  // a missing row repeats r0 (tested once)
            at[k] = locate(r0 + k < rows ? r0 + k : r0, rows, 1, H, in, l0, n_layers, n_tokens);
        for (uint32_t d0 = 0; d0 < D; d0 += 32 * kPerLane) {
            uint32_t b[kRowsPerWarp][kPerLane];
#pragma unroll
            for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const uint32_t d = d0 + 32 * i + lane;
                    b[k][i] = d < D ? raw_bits(at[k].base, in.dtype, at[k].off + d) : 0u;
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

// The same check over 16-byte vectors (8 F16/BF16 or 4 F32 channels) when
// the host found every row start aligned for them (as the vector staging):
// thread i of the grid reads vector i of the flattened rows, kUnroll vectors
// in flight. The row kernel above read 2 bytes per lane and ran at 29% of
// DRAM bandwidth (0.28 ms for 268 MB of F16 input).
constexpr int kUnroll = 4;

__global__ void find_nonfinite_vec_kernel(PageShape shape, AppendRows in, uint32_t l0, uint32_t n_layers,
                                          uint32_t n_tokens, unsigned long long *first) {
    const uint32_t H = shape.n_kv_heads, D = shape.head_dim;
    const bool f32 = in.dtype == IKV_DTYPE_F32;
    const uint32_t per_vec = f32 ? 4 : 8, nvec = D / per_vec;
    const uint64_t total = 2 * uint64_t(n_layers) * n_tokens * H * nvec;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i0 = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i0 < total; i0 += kUnroll * stride) {
        uint4 w[kUnroll];
        uint64_t row[kUnroll];
        uint32_t vi[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
            const Located at = locate(i0 + k * stride < total ? i0 + k * stride : i0, total, nvec, H, in, l0,
                                      n_layers, n_tokens);
            row[k] = at.row, vi[k] = at.vi;
            const int64_t off = at.off + at.vi * per_vec;
            w[k] = *reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(at.base) + off * (f32 ? 4 : 2));
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
            if (i0 + k * stride >= total) break;
            const uint32_t u[4] = {w[k].x, w[k].y, w[k].z, w[k].w};
#pragma unroll
            for (uint32_t j = 0; j < 8; ++j) {  // the vector's first non-finite element
                if (j >= per_vec) break;
                const uint32_t b = f32 ? u[j & 3] : (u[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
                const int nf = nonfinite(b, in.dtype);
                if (nf != 0) {
                    atomicMin(first, (unsigned long long)((row[k] * D + vi[k] * per_vec + j) * 2 + (nf == 2 ? 1 : 0)));
                    break;
                }
            }
        }
    }
}

}  // namespace

cudaError_t launch_find_nonfinite(const PageShape &shape, const AppendRows &in, uint32_t l0, uint32_t n_layers,
                                  uint32_t n_tokens, unsigned long long *first, cudaStream_t stream) {
    const uint64_t rows = 2ull * n_layers * n_tokens * shape.n_kv_heads;
    if (rows == 0) return cudaSuccess;
    if (vector_aligned(shape, in)) {
        const uint64_t vecs = rows * (shape.head_dim / (in.dtype == IKV_DTYPE_F32 ? 4 : 8));
        const uint64_t blocks = (vecs + kUnroll * kThreads - 1) / (kUnroll * kThreads);
        return launch(find_nonfinite_vec_kernel, dim3(unsigned(blocks < 8192 ? blocks : 8192)), dim3(kThreads), 0,
                      stream, shape, in, l0, n_layers, n_tokens, first);
    }
    const uint64_t per_block = (kThreads / 32) * kRowsPerWarp;
    const uint64_t blocks = (rows + per_block - 1) / per_block;
    const unsigned grid = unsigned(blocks < 4096 ? blocks : 4096);
    return launch(find_nonfinite_kernel, dim3(grid), dim3(kThreads), 0, stream, shape, in, l0, n_layers, n_tokens,
                  first);
}

}  // namespace cuda
}  // namespace ikv
