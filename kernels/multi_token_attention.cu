// Device pieces of the multi-token attention path (many query tokens: chunked
// prefill, long speculative verification). The matrix products run in
// cuBLASLt, orchestrated by src/cuda/cuda_multi_token.cpp; these kernels do
// what is around them:
//
//   stage     Q of each (sequence, kv-head) as a contiguous [M = T*G][D]
//             operand matrix (f16, or bf16 when q is bf16), O = 0, m = -inf, l = 0
//   offsets   per work list, the prefix sum of its entries' row counts, so a
//             key tile's token k finds its page by binary search
//   gather    one key tile: tokens [tok0, tok0 + nk) of each list dequantized
//             (every page format, partial bounds) into contiguous K and V
//             operand tiles [nk][D] plus their absolute positions
//   softmax   per query row over one tile of S = scale * Q K^T (fp32, from
//             cuBLASLt): softcap, causal mask (position <= the query's), the
//             running max m and denominator l (exact online log-sum-exp), P
//             written in place over S as operand values, O rescaled by
//             exp(m_old - m_new) so the next GEMM accumulates O += P V
//   finalize  out = O / l in out_dtype, lse = m + log(l) (natural log,
//             scaled-logit domain); out 0 and lse -inf for a row that read nothing
//
// Everything only enqueues on the given stream (capturable).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <cub/block/block_scan.cuh>

#include "decode_formats.cuh"
#include "dequant_rows.cuh"
#include "ikv_kernels.h"
#include "load_elem.cuh"
#include "launch_pdl.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kNoPosition = 0xFFFFFFFFu;  // a tile slot past the list's end: masked

__device__ __forceinline__ uint16_t to_operand(float x, bool bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float from_operand(uint16_t b, bool bf16) {
    return bf16 ? __uint_as_float(uint32_t(b) << 16) : __half2float(__ushort_as_half(b));
}
__device__ __forceinline__ void store_elem(void *base, ikv_dtype dt, uint64_t i, float x) {
    if (dt == IKV_DTYPE_F32)
        static_cast<float *>(base)[i] = x;
    else
        static_cast<uint16_t *>(base)[i] = to_operand(x, dt == IKV_DTYPE_BF16);
}
__device__ __forceinline__ uint32_t list_index(const DevLists &L, uint32_t b, uint32_t h) {
    return L.list_heads > 1 ? b * L.list_heads + h : b;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
    return x;
}

// The query row of this warp in the kernels that take one warp per (bh, row):
// w = bh * M + r, bh = b * Hkv + h, r = t * G + g (M = T * G rows per bh).
struct WarpRow {
    uint64_t w;
    uint64_t qi;  // the row's index in q / out / lse: (b * T + t) * Hq + h * G + g
    uint32_t lane, D;
    bool valid;   // w < n_seqs * Hkv * M
};
__device__ __forceinline__ WarpRow warp_row(const DecodeParams &p) {
    const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv, M = p.n_query_tokens * G;
    WarpRow q{};
    q.w = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    q.lane = threadIdx.x % 32;
    q.D = p.shape.head_dim;
    q.valid = q.w < uint64_t(p.n_seqs) * Hkv * M;
    const uint32_t r = uint32_t(q.w % M), bh = uint32_t(q.w / M), b = bh / Hkv, h = bh % Hkv;
    q.qi = (uint64_t(b) * p.n_query_tokens + r / G) * p.n_q_heads + h * G + r % G;
    return q;
}

// One warp per (bh, row): the query row in operand precision, and the row's
// running state reset.
__global__ void stage_kernel(const DecodeParams p, bool bf16, uint16_t *qs, float *O, float *m, float *l) {
    const WarpRow q = warp_row(p);
    if (!q.valid) return;
    const uint32_t D = q.D, lane = q.lane;
    const uint64_t w = q.w, src = q.qi * D;
    bool finite = true;
    for (uint32_t d = lane; d < D; d += 32) {
        const float x = load_elem(p.q, p.q_dtype, src + d);
        finite &= isfinite(x);
        qs[w * D + d] = to_operand(x, bf16);
        O[w * D + d] = 0.0f;
    }
    // A row holding a NaN or inf becomes all NaN, so that every logit it
    // makes is NaN (an inf alone can make only -inf logits, which read as
    // masked): softmax_kernel then marks it, and its outputs are NaN.
    if (!__all_sync(0xFFFFFFFFu, finite))
        for (uint32_t d = lane; d < D; d += 32) qs[w * D + d] = to_operand(NAN, bf16);
    if (lane == 0) {
        m[w] = -INFINITY;
        l[w] = 0.0f;
    }
}

// One block per list: offsets[list][i] = rows of entries 0..i-1, i <= count.
__global__ void offsets_kernel(const DevLists L, uint32_t *offsets) {
    using Scan = cub::BlockScan<uint32_t, kThreads>;
    __shared__ typename Scan::TempStorage tmp;
    const uint32_t list = blockIdx.x, n = L.counts[list];
    const DevPage *pg = L.pages + uint64_t(list) * L.stride;
    uint32_t *out = offsets + uint64_t(list) * (L.stride + 1);
    uint32_t carry = 0;
    for (uint32_t base = 0; base < n; base += kThreads) {
        const uint32_t i = base + threadIdx.x;
        const uint32_t rows = i < n ? uint32_t(pg[i].end) - pg[i].begin : 0u;
        uint32_t excl, total;
        Scan(tmp).ExclusiveSum(rows, excl, total);
        if (i < n) out[i] = carry + excl;
        carry += total;
        __syncthreads();  // tmp is reused by the next round
    }
    if (threadIdx.x == 0) out[n] = carry;
}

template <int D, int F>
__device__ __forceinline__ void dequant_kv(const uint8_t *sub, uint32_t P, uint32_t row, uint32_t c, float k[8],
                                           float v[8]) {
    dequant8<D, F, true>(sub, P, row, c, k);
    dequant8<D, F, false>(sub, P, row, c, v);
}

__device__ __forceinline__ void store8(uint16_t *dst, const float x[8], bool bf16) {
    uint4 w;
    uint32_t *u = &w.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) u[j] = uint32_t(to_operand(x[2 * j], bf16)) | uint32_t(to_operand(x[2 * j + 1], bf16)) << 16;
    *reinterpret_cast<uint4 *>(dst) = w;
}

// D/8 threads per tile row (8 channels each; D = 32: 4 threads, 64 rows per
// block); grid (row blocks, nbh).
template <int D>
__global__ void gather_kernel(const DecodeParams p, bool bf16, const uint32_t *offsets, uint32_t bh0, uint32_t tok0,
                              uint32_t nk, uint16_t *K, uint16_t *V, uint32_t *pos) {
    constexpr uint32_t kLanes = D / 8, kRowsPerBlock = kThreads / kLanes;
    // 8-channel slices (16-byte operand stores, dec::raw8 loads: INT4's are 4
    // bytes) and whole rows per block; the INT4 V group (32 channels) of a
    // slice is d / 32 (one group at D = 32).
    static_assert(D % 32 == 0 && kThreads % kLanes == 0, "whole rows per block");
    const uint32_t k = blockIdx.x * kRowsPerBlock + threadIdx.x / kLanes, c = threadIdx.x % kLanes;
    if (k >= nk) return;
    const uint32_t Hkv = p.shape.n_kv_heads, P = p.shape.page_size;
    const uint32_t bh = bh0 + blockIdx.y, b = bh / Hkv, h = bh % Hkv;
    const uint32_t list = list_index(p.lists, b, h), n = p.lists.counts[list];
    const uint32_t *off = offsets + uint64_t(list) * (p.lists.stride + 1);
    const uint32_t tok = tok0 + k;
    const uint64_t dst = (uint64_t(blockIdx.y) * nk + k) * D + 8 * c;
    float kx[8], vx[8];
    uint32_t position = kNoPosition;
    if (tok >= off[n]) {
#pragma unroll
        for (int j = 0; j < 8; ++j) kx[j] = vx[j] = 0.0f;
    } else {
        uint32_t lo = 0, hi = n - 1;  // the last entry e with off[e] <= tok
        while (lo < hi) {
            const uint32_t mid = (lo + hi + 1) / 2;
            if (off[mid] <= tok) lo = mid; else hi = mid - 1;
        }
        const DevPage pg = p.lists.pages[uint64_t(list) * p.lists.stride + lo];
        const uint32_t row = pg.begin + (tok - off[lo]);
        const ikv_format f = ikv_format(pg.format);
        const uint8_t *sub = pg.base + subpage_offset(p.shape, f, p.layer, h);
        switch (f) {
            case IKV_FMT_F16: dequant_kv<D, IKV_FMT_F16>(sub, P, row, c, kx, vx); break;
            case IKV_FMT_BF16: dequant_kv<D, IKV_FMT_BF16>(sub, P, row, c, kx, vx); break;
            case IKV_FMT_FP8_E4M3: dequant_kv<D, IKV_FMT_FP8_E4M3>(sub, P, row, c, kx, vx); break;
            case IKV_FMT_INT8: dequant_kv<D, IKV_FMT_INT8>(sub, P, row, c, kx, vx); break;
            default: dequant_kv<D, IKV_FMT_INT4>(sub, P, row, c, kx, vx); break;
        }
        position = pg.pos0 + row;
    }
    store8(K + dst, kx, bf16);
    store8(V + dst, vx, bf16);
    if (c == 0) pos[uint64_t(blockIdx.y) * nk + k] = position;
}

// One warp per (bh, row) of the group bh0 .. bh0 + nbh - 1; nk % 128 == 0.
// S row (fp32, nk values) becomes P (nk operand values) in place: iteration i
// reads floats [128i, 128i+128) and writes 16-bit values [128i, 128i+128),
// i.e. bytes [256i, 256i+256), which no later iteration reads; within an
// iteration __syncwarp orders every lane's load before any lane's store.
__global__ void softmax_kernel(const DecodeParams p, bool bf16, uint32_t bh0, uint32_t nbh, uint32_t nk,
                               const uint32_t *pos, float *S, float *O, float *m, float *l) {
    const uint32_t Hkv = p.shape.n_kv_heads, D = p.shape.head_dim, G = p.n_q_heads / Hkv;
    const uint32_t T = p.n_query_tokens, M = T * G;
    const uint64_t w = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const uint32_t lane = threadIdx.x % 32;
    if (w >= uint64_t(nbh) * M) return;
    const uint32_t r = uint32_t(w % M), lb = uint32_t(w / M), bh = bh0 + lb, b = bh / Hkv;
    const uint32_t qpos = p.seq_len[b] - T + r / G;
    float *s = S + w * nk;
    uint16_t *pv = reinterpret_cast<uint16_t *>(s);
    const uint32_t *ps = pos + uint64_t(lb) * nk;
    const float cap = p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    auto logit = [&](float x, uint32_t position) {
        if (cap > 0.0f) x = (x - x) + cap * tanhf(x * inv_cap);  // x - x: an infinite logit stays NaN (the header)
        return position <= qpos ? x : -INFINITY;  // kNoPosition is never <= qpos
    };
    float mx = -INFINITY;
    for (uint32_t i = 4 * lane; i < nk; i += 128) {
        const float4 x = *reinterpret_cast<const float4 *>(s + i);
        const uint4 q = *reinterpret_cast<const uint4 *>(ps + i);
        mx = fmaxf(mx, fmaxf(fmaxf(logit(x.x, q.x), logit(x.y, q.y)), fmaxf(logit(x.z, q.z), logit(x.w, q.w))));
    }
    mx = warp_max(mx);
    const uint64_t row = uint64_t(bh) * M + r;
    const float m_old = m[row], m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    for (uint32_t i = 4 * lane; i < nk; i += 128) {
        const float4 x = *reinterpret_cast<const float4 *>(s + i);
        const uint4 q = *reinterpret_cast<const uint4 *>(ps + i);
        __syncwarp();
        const float in[4] = {logit(x.x, q.x), logit(x.y, q.y), logit(x.z, q.z), logit(x.w, q.w)};
        uint16_t o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            o[j] = to_operand(in[j] == -INFINITY ? 0.0f : __expf(in[j] - m_new), bf16);
            sum += from_operand(o[j], bf16);  // l sums the weights P V uses
        }
        *reinterpret_cast<uint2 *>(pv + i) = make_uint2(uint32_t(o[0]) | uint32_t(o[1]) << 16,
                                                        uint32_t(o[2]) | uint32_t(o[3]) << 16);
    }
    sum = warp_sum(sum);
    if (m_new == -INFINITY) {  // nothing visible yet: P = 0, state unchanged;
        // or NaN logits only (a query holding a NaN or inf, stage_kernel): l
        // becomes NaN and stays so, and finalize writes NaN
        if (lane == 0 && sum != sum) l[row] = sum;
        return;
    }
    const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
    if (alpha != 1.0f)
        for (uint32_t d = lane; d < D; d += 32) O[row * D + d] *= alpha;
    if (lane == 0) {
        m[row] = m_new;
        l[row] = l[row] * alpha + sum;
    }
}

// One warp per (bh, row).
__global__ void finalize_kernel(const DecodeParams p, const float *O, const float *m, const float *l) {
    const WarpRow q = warp_row(p);
    if (!q.valid) return;
    const uint32_t D = q.D, lane = q.lane;
    const uint64_t w = q.w, oi = q.qi;
    float L = l[w];
    // L NaN: a query holding a NaN or inf read keys (out and lse NaN). L 0:
    // the row read no key, or none of its logits was finite (they overflowed
    // fp32 and read as masked): NaN too where its list holds a token at or
    // before its position (the header). Warp-uniform: L is the row's.
    if (L == 0.0f) {
        const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv, M = p.n_query_tokens * G;
        const uint32_t r = uint32_t(w % M), bh = uint32_t(w / M), b = bh / Hkv, h = bh % Hkv;
        const uint32_t qpos = p.seq_len[b] - p.n_query_tokens + r / G;
        const uint32_t list = list_index(p.lists, b, h), n = p.lists.counts[list];
        const DevPage *pages = p.lists.pages + uint64_t(list) * p.lists.stride;
        bool any = false;
        for (uint32_t e = lane; e < n && !any; e += 32) any = pages[e].pos0 + pages[e].begin <= qpos;
        if (__any_sync(0xFFFFFFFFu, any)) L = NAN;
    }
    const float inv = L > 0.0f ? 1.0f / L : L != L ? NAN : 0.0f;
    for (uint32_t d = lane; d < D; d += 32) store_elem(p.out, p.out_dtype, oi * D + d, O[w * D + d] * inv);
    if (p.lse && lane == 0) p.lse[oi] = L > 0.0f ? m[w] + logf(L) : L != L ? NAN : -INFINITY;
}

uint32_t warp_blocks(uint64_t warps) { return uint32_t((warps * 32 + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t launch_mt_stage(const DecodeParams &p, bool bf16, uint16_t *qs, float *O, float *m, float *l,
                            cudaStream_t stream) {
    const uint64_t rows = uint64_t(p.n_seqs) * p.n_q_heads * p.n_query_tokens;
    return launch(stage_kernel, dim3(warp_blocks(rows)), dim3(kThreads), 0, stream, p, bf16, qs, O, m, l);
}

cudaError_t launch_mt_offsets(const DecodeParams &p, uint32_t n_lists, uint32_t *offsets, cudaStream_t stream) {
    return launch(offsets_kernel, dim3(n_lists), dim3(kThreads), 0, stream, p.lists, offsets);
}

cudaError_t launch_mt_gather(const DecodeParams &p, bool bf16, const uint32_t *offsets, uint32_t bh0, uint32_t nbh,
                             uint32_t tok0, uint32_t nk, uint16_t *K, uint16_t *V, uint32_t *pos,
                             cudaStream_t stream) {
    const uint32_t D = p.shape.head_dim, rows_per_block = kThreads / (D / 8);
    const dim3 grid((nk + rows_per_block - 1) / rows_per_block, nbh);
    const auto kernel = D == 32    ? gather_kernel<32>
                        : D == 64  ? gather_kernel<64>
                        : D == 128 ? gather_kernel<128>
                        : D == 256 ? gather_kernel<256>
                                   : nullptr;
    if (kernel == nullptr) return cudaErrorInvalidValue;
    return launch(kernel, grid, dim3(kThreads), 0, stream, p, bf16, offsets, bh0, tok0, nk, K, V, pos);
}

cudaError_t launch_mt_softmax(const DecodeParams &p, bool bf16, uint32_t bh0, uint32_t nbh, uint32_t nk,
                              const uint32_t *pos, float *S, float *O, float *m, float *l, cudaStream_t stream) {
    if (nk % 128 != 0) return cudaErrorInvalidValue;
    const uint64_t rows = uint64_t(nbh) * p.n_query_tokens * (p.n_q_heads / p.shape.n_kv_heads);
    return launch(softmax_kernel, dim3(warp_blocks(rows)), dim3(kThreads), 0, stream, p, bf16, bh0, nbh, nk, pos, S, O,
                  m, l);
}

cudaError_t launch_mt_finalize(const DecodeParams &p, const float *O, const float *m, const float *l,
                               cudaStream_t stream) {
    const uint64_t rows = uint64_t(p.n_seqs) * p.n_q_heads * p.n_query_tokens;
    return launch(finalize_kernel, dim3(warp_blocks(rows)), dim3(kThreads), 0, stream, p, O, m, l);
}

}  // namespace cuda
}  // namespace ikv
