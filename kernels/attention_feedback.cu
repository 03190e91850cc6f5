// Attention feedback on the device (ikv_page_feedback): after a decode, the
// share of the softmax each list entry received, as decode/cpu_decode.cpp's
// feed_back measures it on the CPU: sum over the entry's tokens and the
// (sequence, kv-head)'s R = T * G query rows of exp(logit - lse_row), divided
// by R, where the logit is the scaled (and softcapped) q . k of the stored
// key, rows see only keys at positions <= their own, and a row whose lse is
// -inf (it read nothing) adds nothing.
//
// Why read the keys again instead of keeping the decode's per-chunk sums:
// the fused decode's chunks are not pages (a split covers many pages, a
// chunk 16 rows of one), and recording per-page partials would put work on
// the hot path that only feedback steps want. Feedback is opt-in and costs
// one more read of the keys the step read (the CPU path does the same).
//
// One warp per list entry: D/8 lanes per key row (8 channels each), 32 / (D/8)
// rows at once; a block's warps share one (sequence, kv-head), whose R scaled
// query rows it stages in shared memory first (when they fit in 48 KB; else
// they are read from global memory); grid (entries / warps, kv-heads,
// sequences). Only enqueues (the host copies the shares back).
// Measured first with the queries read from global memory for every key row
// and 64 blocks per list: 4.1-5.8x a dense step (bench/RESULTS.md 6y).
#include <math.h>

#include "dequant_rows.cuh"
#include "ikv_kernels.h"
#include "load_elem.cuh"
#include "launch_pdl.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kFeedbackWarps = 4;

// Query element (row r, channel d) of (b, h), scaled: from the staged copy or global memory.
struct Queries {
    const float *staged;  // [R][D] or nullptr
    __device__ __forceinline__ float at(const DecodeParams &p, uint32_t b, uint32_t h, uint32_t r, uint32_t d) const {
        if (staged) return staged[r * p.shape.head_dim + d];
        const uint32_t G = p.n_q_heads / p.shape.n_kv_heads;
        const uint64_t qi = (uint64_t(b) * p.n_query_tokens + r / G) * p.n_q_heads + h * G + r % G;
        return load_elem(p.q, p.q_dtype, qi * p.shape.head_dim + d) * p.scale;
    }
};

template <int D, int F>
__device__ float entry_share(const DecodeParams &p, const Queries &qs, const DevPage &pg, uint32_t b, uint32_t h,
                             uint32_t lane) {
    constexpr uint32_t kLanes = D / 8, kRows = 32 / kLanes;  // lanes per key row; rows at once
    const uint32_t G = p.n_q_heads / p.shape.n_kv_heads, T = p.n_query_tokens, R = T * G;
    const uint32_t c = lane % kLanes, slot = lane / kLanes;
    const uint8_t *sub = pg.base + subpage_offset(p.shape, ikv_format(F), p.layer, h);
    const uint32_t qpos0 = p.seq_len[b] - T;  // position of query token 0
    float acc = 0.0f;
    for (uint32_t row0 = pg.begin; row0 < pg.end; row0 += kRows) {
        const uint32_t row = row0 + slot;
        const bool valid = row < pg.end;  // lanes past the entry still join the shuffles
        float k[8];
        if (valid)
            dequant8<D, F, true>(sub, p.shape.page_size, row, c, k);
        else
#pragma unroll
            for (int j = 0; j < 8; ++j) k[j] = 0.0f;
        for (uint32_t r = 0; r < R; ++r) {
            const uint32_t t = r / G, g = r % G;
            const uint64_t qi = (uint64_t(b) * T + t) * p.n_q_heads + h * G + g;
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) dot = fmaf(qs.at(p, b, h, r, 8 * c + j), k[j], dot);
            for (uint32_t o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
            const float lse = p.lse[qi];
            if (!valid || c != 0 || pg.pos0 + row > qpos0 + t || lse == -INFINITY) continue;  // in the row's future
            const float logit = p.softcap > 0.0f ? p.softcap * tanhf(dot / p.softcap) : dot;
            acc += expf(logit - lse);
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    return acc / float(R);
}

template <int D>
__global__ void __launch_bounds__(kFeedbackWarps * 32) feedback_kernel(const DecodeParams p, FeedbackOut o, bool stage) {
    extern __shared__ float staged[];  // [R][D] when stage
    const uint32_t h = blockIdx.y, b = blockIdx.z, Hkv = p.shape.n_kv_heads, lane = threadIdx.x % 32;
    const uint32_t list = p.lists.list_heads > 1 ? b * p.lists.list_heads + h : b;
    const uint32_t n = p.lists.counts[list], bh = b * Hkv + h;
    if (blockIdx.x == 0 && threadIdx.x == 0) o.counts[bh] = n;
    if (blockIdx.x * kFeedbackWarps >= n) return;  // uniform over the block
    const Queries direct{nullptr};
    if (stage) {
        const uint32_t R = p.n_query_tokens * (p.n_q_heads / Hkv);
        for (uint32_t e = threadIdx.x; e < R * D; e += blockDim.x) staged[e] = direct.at(p, b, h, e / D, e % D);
        __syncthreads();
    }
    const Queries qs{stage ? staged : nullptr};
    for (uint32_t e = blockIdx.x * kFeedbackWarps + threadIdx.x / 32; e < n; e += gridDim.x * kFeedbackWarps) {
        const DevPage pg = p.lists.pages[uint64_t(list) * p.lists.stride + e];
        float share;
        switch (pg.format) {
            case IKV_FMT_F16: share = entry_share<D, IKV_FMT_F16>(p, qs, pg, b, h, lane); break;
            case IKV_FMT_BF16: share = entry_share<D, IKV_FMT_BF16>(p, qs, pg, b, h, lane); break;
            case IKV_FMT_FP8_E4M3: share = entry_share<D, IKV_FMT_FP8_E4M3>(p, qs, pg, b, h, lane); break;
            case IKV_FMT_INT8: share = entry_share<D, IKV_FMT_INT8>(p, qs, pg, b, h, lane); break;
            default: share = entry_share<D, IKV_FMT_INT4>(p, qs, pg, b, h, lane); break;
        }
        if (lane == 0) {
            o.shares[uint64_t(bh) * o.stride + e] = share;
            o.pages[uint64_t(bh) * o.stride + e] = pg.pos0 / p.shape.page_size;
        }
    }
}

template <int D>
cudaError_t launch_feedback(const DecodeParams &p, const FeedbackOut &o, cudaStream_t stream) {
    // A warp per entry of the longest list (blocks past a list's end leave at once).
    const uint32_t blocks = (p.lists.stride + kFeedbackWarps - 1) / kFeedbackWarps;
    const dim3 grid(blocks, p.shape.n_kv_heads, p.n_seqs);
    const uint64_t rows = uint64_t(p.n_query_tokens) * (p.n_q_heads / p.shape.n_kv_heads);
    const bool stage = rows * D * 4 <= 48 * 1024;
    return launch(feedback_kernel<D>, grid, dim3(kFeedbackWarps * 32), size_t(stage ? rows * D * 4 : 0), stream, p, o,
                  stage);
}

}  // namespace

cudaError_t launch_attention_feedback(const DecodeParams &p, const FeedbackOut &o, cudaStream_t stream) {
    if (p.lse == nullptr || o.stride < p.lists.stride) return cudaErrorInvalidValue;
    switch (p.shape.head_dim) {
        case 32: return launch_feedback<32>(p, o, stream);
        case 64: return launch_feedback<64>(p, o, stream);
        case 128: return launch_feedback<128>(p, o, stream);
        case 256: return launch_feedback<256>(p, o, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace cuda
}  // namespace ikv
