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

// Grid-stride over every (which, layer, token, head, channel) element.
__global__ void find_nonfinite_kernel(PageShape shape, AppendRows in, uint32_t l0, uint32_t n_layers,
                                      uint32_t n_tokens, unsigned long long *first) {
    const uint32_t H = shape.n_kv_heads, D = shape.head_dim;
    const uint64_t rows_per_array = uint64_t(n_layers) * n_tokens * H;
    const uint64_t total = 2 * rows_per_array * D;
    for (uint64_t e = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += uint64_t(gridDim.x) * blockDim.x) {
        const uint32_t d = uint32_t(e % D);
        const uint64_t row = e / D;
        const uint32_t which = uint32_t(row / rows_per_array);
        const uint64_t r = row % rows_per_array;
        const uint32_t h = uint32_t(r % H), t = uint32_t(r / H % n_tokens), li = uint32_t(r / H / n_tokens);
        const int64_t off = input_offset(in, l0 + li, t, h) + d;
        const void *base = which == 0 ? in.k : in.v;
        bool bad, inf;
        if (in.dtype == IKV_DTYPE_F32) {
            const uint32_t b = static_cast<const uint32_t *>(base)[off];
            bad = (b & 0x7F800000u) == 0x7F800000u;
            inf = (b & 0x007FFFFFu) == 0;
        } else {
            const uint16_t b = static_cast<const uint16_t *>(base)[off];
            const uint16_t exp = in.dtype == IKV_DTYPE_F16 ? 0x7C00u : 0x7F80u;
            bad = (b & exp) == exp;
            inf = (b & uint16_t(~exp & 0x7FFFu)) == 0;
        }
        if (bad) atomicMin(first, (unsigned long long)(e * 2 + (inf ? 1 : 0)));
    }
}

// Block x = (job * H + head) * 2 + (K|V), flat (H and the job count may each
// exceed grid y's limit): the job's rows of one head of K or V.
__global__ void stage_rows_kernel(PageShape shape, AppendRows in, const AppendJob *jobs) {
    const uint32_t H = shape.n_kv_heads, which = blockIdx.x % 2, h = blockIdx.x / 2 % H;
    const AppendJob j = jobs[blockIdx.x / 2 / H];
    const uint32_t D = shape.head_dim, P = shape.page_size;
    const uint64_t head_floats = uint64_t(P) * D;
    float *dst = j.stage + uint64_t(which) * H * head_floats + h * head_floats + uint64_t(j.row0) * D;
    const void *base = which == 0 ? in.k : in.v;
    for (uint32_t e = threadIdx.x; e < j.rows * D; e += blockDim.x) {
        const uint32_t i = e / D, d = e % D;
        const int64_t off = input_offset(in, j.layer, j.token0 + i, h) + d;
        float x;
        if (in.dtype == IKV_DTYPE_F32)
            x = static_cast<const float *>(base)[off];
        else if (in.dtype == IKV_DTYPE_F16)
            x = f16_to_f32(static_cast<const uint16_t *>(base)[off]);
        else
            x = bf16_to_f32(static_cast<const uint16_t *>(base)[off]);
        dst[e] = x;  // row i, channel d: rows of a head are contiguous in staging
    }
}

}  // namespace

cudaError_t launch_find_nonfinite(const PageShape &shape, const AppendRows &in, uint32_t l0, uint32_t n_layers,
                                  uint32_t n_tokens, unsigned long long *first, cudaStream_t stream) {
    const uint64_t total = 2ull * n_layers * n_tokens * shape.n_kv_heads * shape.head_dim;
    if (total == 0) return cudaSuccess;
    const uint64_t blocks = (total + kThreads - 1) / kThreads;
    const unsigned grid = unsigned(blocks < 4096 ? blocks : 4096);
    find_nonfinite_kernel<<<grid, kThreads, 0, stream>>>(shape, in, l0, n_layers, n_tokens, first);
    return cudaGetLastError();
}

cudaError_t launch_stage_rows(const PageShape &shape, const AppendRows &in, const AppendJob *jobs, uint32_t n_jobs,
                              cudaStream_t stream) {
    if (n_jobs == 0) return cudaSuccess;
    if (2ull * n_jobs * shape.n_kv_heads > 0x7FFFFFFFull) return cudaErrorInvalidValue;
    stage_rows_kernel<<<2 * n_jobs * shape.n_kv_heads, kThreads, 0, stream>>>(shape, in, jobs);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ikv
