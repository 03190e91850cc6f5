// Attention feedback on the device (ikv_page_feedback): after a decode, the
// share of the softmax each list entry received, as decode/cpu_decode.cpp's
// feed_back measures it on the CPU: sum over the entry's tokens and the
// (sequence, kv-head)'s R = T * G query rows of exp(logit - lse_row), divided
// by R, where the logit is the scaled (and softcapped) q . k of the stored
// key, rows see only keys at positions <= their own, and a row whose lse is
// -inf (it read nothing) adds nothing.
//
// Two ways. The fused decode (decode_attention.cu) has feedback variants of
// its kernel that write each 16-row chunk's softmax sum per query row as it
// reads the chunk (a chunk is a page, or a 16-row part of a larger one), and
// feedback_from_chunks_kernel turns those into shares with the rows' lse: no
// second read of the keys (2026-11-27: a feedback step 1.14-1.41x a dense
// one on the H100, was 2.0-2.2x with the kernel below). The multi-token GEMM
// path has no chunks: there feedback_kernel reads the keys again.
//
// One warp per list entry, reading its keys as warp_key_dots.cuh does; a
// block's warps share one (sequence, kv-head) and walk many entries of its
// list, with the R = T * G scaled query rows staged in shared memory 16 at
// a time (a step of many query tokens reads its entries' keys once per 16
// rows); grid (blocks per list, kv-heads, sequences). Only enqueues (the
// host copies the shares back).
// Measured first with the queries read from global memory for every key row
// and 64 blocks per list: 4.1-5.8x a dense step (bench/RESULTS.md 6y).
#include <math.h>

#include <algorithm>

#include "head_dims.cuh"
#include "ikv_kernels.h"
#include "load_elem.cuh"
#include "launch_pdl.cuh"
#include "warp_key_dots.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kFeedbackWarps = 4;

// Scaled query row r (= t * G + g) of (b, h), channel d.
__device__ __forceinline__ float query_row(const DecodeParams &p, uint32_t b, uint32_t h, uint32_t r, uint32_t d) {
    const uint32_t G = p.n_q_heads / p.shape.n_kv_heads;
    const uint64_t qi = (uint64_t(b) * p.n_query_tokens + r / G) * p.n_q_heads + h * G + r % G;
    return load_elem(p.q, p.q_dtype, qi * p.shape.head_dim + d) * p.scale;
}

// The entry's share summed over the staged rows r0 .. r0 + NR - 1 (those < R).
template <int D, int F, int NR>
__device__ float entry_share(const DecodeParams &p, const float *qs, uint32_t r0, const DevPage &pg, uint32_t b,
                             uint32_t h, uint32_t lane) {
    using W = WarpKeyDots<D, NR>;
    const uint32_t G = p.n_q_heads / p.shape.n_kv_heads, T = p.n_query_tokens, R = T * G;
    const uint32_t c = lane % W::kLanes;
    const uint8_t *sub = pg.base + subpage_offset(p.shape, ikv_format(F), p.layer, h);
    const uint32_t qpos0 = p.seq_len[b] - T;  // position of query token 0
    uint32_t last[W::kOut];  // the last key position row i sees (causal), or none
    float lse[W::kOut];
#pragma unroll
    for (uint32_t i = 0; i < W::kOut; ++i) {
        const uint32_t r = r0 + W::row_of(c, i), t = r / G;
        const bool on = r < R && W::leader(c);  // each row's total counted by one lane
        lse[i] = on ? p.lse[(uint64_t(b) * T + t) * p.n_q_heads + h * G + r % G] : -INFINITY;
        last[i] = qpos0 + t;
    }
    float acc = 0.0f;
    for_each_key_dot<D, F, NR>(sub, p.shape.page_size, pg.begin, pg.end, qs, lane, [&](uint32_t row, const float *dot) {
#pragma unroll
        for (uint32_t i = 0; i < W::kOut; ++i) {
            // read nothing (lse -inf), a query holding a NaN or inf (lse NaN: it adds nothing), or the row's future
            if (!(fabsf(lse[i]) < INFINITY) || pg.pos0 + row > last[i]) continue;
            const float logit = p.softcap > 0.0f ? p.softcap * tanhf(dot[i] / p.softcap) : dot[i];
            acc += expf(logit - lse[i]);
        }
    });
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    return acc;
}

template <int D, int NR>
__global__ void __launch_bounds__(kFeedbackWarps * 32) feedback_kernel(const DecodeParams p, FeedbackOut o) {
    extern __shared__ float4 staged4[];  // [NR][D]
    float *qs = reinterpret_cast<float *>(staged4);
    const uint32_t h = blockIdx.y, b = blockIdx.z, Hkv = p.shape.n_kv_heads, lane = threadIdx.x % 32;
    const uint32_t list = p.lists.list_heads > 1 ? b * p.lists.list_heads + h : b;
    const uint32_t n = p.lists.counts[list], bh = b * Hkv + h;
    const uint32_t R = p.n_query_tokens * (p.n_q_heads / Hkv);
    if (blockIdx.x == 0 && threadIdx.x == 0) o.counts[bh] = n;
    if (blockIdx.x * kFeedbackWarps >= n) return;  // uniform over the block
    for (uint32_t r0 = 0; r0 < R; r0 += NR) {
        __syncthreads();  // the previous tile's readers are done
        for (uint32_t e = threadIdx.x; e < NR * D; e += blockDim.x)
            qs[e] = r0 + e / D < R ? query_row(p, b, h, r0 + e / D, e % D) : 0.0f;
        __syncthreads();
        for (uint32_t e = blockIdx.x * kFeedbackWarps + threadIdx.x / 32; e < n; e += gridDim.x * kFeedbackWarps) {
            const DevPage pg = p.lists.pages[uint64_t(list) * p.lists.stride + e];
            float share = 0.0f;
            with_format(pg.format, [&](auto F) { share = entry_share<D, F.value, NR>(p, qs, r0, pg, b, h, lane); });
            if (lane == 0) {  // the same lane sums this entry over every tile
                float *dst = o.shares + uint64_t(bh) * o.stride + e;
                const float total = (r0 == 0 ? 0.0f : *dst) + share;
                *dst = r0 + NR >= R ? total / float(R) : total;
                if (r0 == 0) o.pages[uint64_t(bh) * o.stride + e] = pg.pos0 / p.shape.page_size;
            }
        }
    }
}

template <int D, int NR>
cudaError_t launch_feedback(const DecodeParams &p, const FeedbackOut &o, int n_sms, cudaStream_t stream) {
    const size_t smem = size_t(NR) * D * 4;
    static std::atomic<int> resident{0};
    const dim3 grid(key_walk_blocks(resident_blocks(resident, feedback_kernel<D, NR>, kFeedbackWarps * 32, smem), p.lists.stride, kFeedbackWarps, p.shape.n_kv_heads * p.n_seqs, n_sms),
                    p.shape.n_kv_heads, p.n_seqs);
    return launch(feedback_kernel<D, NR>, grid, dim3(kFeedbackWarps * 32), smem, stream, p, o);
}

template <int D>
cudaError_t launch_feedback_rows(const DecodeParams &p, const FeedbackOut &o, int n_sms, cudaStream_t stream) {
    const uint64_t R = uint64_t(p.n_query_tokens) * (p.n_q_heads / p.shape.n_kv_heads);
    switch (key_dot_tile_rows(R < 16 ? uint32_t(R) : 16u)) {
        case 4: return launch_feedback<D, 4>(p, o, n_sms, stream);
        case 8: return launch_feedback<D, 8>(p, o, n_sms, stream);
        default: return launch_feedback<D, 16>(p, o, n_sms, stream);
    }
}

// Shares from the decode's per-chunk sums (launch_feedback_from_chunks): one
// thread per list entry slot of every (sequence, kv-head); the thread of
// entry 0 also writes the count.
__global__ void __launch_bounds__(256) feedback_from_chunks_kernel(const DecodeParams p, const ChunkSums c,
                                                                   FeedbackOut o) {
    const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv, T = p.n_query_tokens, R = T * G;
    const uint32_t P = p.shape.page_size, cpp = P > 16 ? P / 16 : 1;
    const uint64_t total = uint64_t(p.n_seqs) * Hkv * p.lists.stride;
    constexpr float kLog2e = 1.4426950408889634f;
    for (uint64_t idx = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; idx < total;
         idx += uint64_t(gridDim.x) * blockDim.x) {
        const uint32_t bh = uint32_t(idx / p.lists.stride), e = uint32_t(idx % p.lists.stride);
        const uint32_t b = bh / Hkv, h = bh % Hkv;
        const uint32_t list = p.lists.list_heads > 1 ? b * p.lists.list_heads + h : b;
        const uint32_t n = p.lists.counts[list];
        if (e == 0) o.counts[bh] = n;
        if (e >= n) continue;
        const DevPage pg = p.lists.pages[uint64_t(list) * p.lists.stride + e];
        float share = 0.0f;
        for (uint32_t k = 0; k < cpp; ++k) {
            const float *row = c.sums + ((uint64_t(bh) * c.chunks_per_list + uint64_t(e) * cpp + k) * R) * 2;
            for (uint32_t r = 0; r < R; ++r) {
                const float l = row[2 * r + 1];
                if (!(l > 0.0f)) continue;  // the chunk gave the row nothing
                const float lse = p.lse[(uint64_t(b) * T + r / G) * p.n_q_heads + h * G + r % G];
                if (!(fabsf(lse) < INFINITY)) continue;  // the row read nothing, or its query is not finite
                share += l * exp2f(row[2 * r] - lse * kLog2e);
            }
        }
        o.shares[uint64_t(bh) * o.stride + e] = share / float(R);
        o.pages[uint64_t(bh) * o.stride + e] = pg.pos0 / P;
    }
}

}  // namespace

cudaError_t launch_feedback_from_chunks(const DecodeParams &p, const ChunkSums &c, const FeedbackOut &o,
                                        cudaStream_t stream) {
    if (p.lse == nullptr || o.stride < p.lists.stride) return cudaErrorInvalidValue;
    const uint64_t total = uint64_t(p.n_seqs) * p.shape.n_kv_heads * p.lists.stride;
    const uint32_t blocks = uint32_t(std::min<uint64_t>((total + 255) / 256, 4096));
    return launch(feedback_from_chunks_kernel, dim3(blocks), dim3(256), size_t(0), stream, p, c, o);
}

cudaError_t launch_attention_feedback(const DecodeParams &p, const FeedbackOut &o, int n_sms, cudaStream_t stream) {
    if (p.lse == nullptr || o.stride < p.lists.stride) return cudaErrorInvalidValue;
    return with_head_dim(p.shape.head_dim,
                         [&](auto d) { return launch_feedback_rows<decltype(d)::value>(p, o, n_sms, stream); });
}

}  // namespace cuda
}  // namespace ikv
