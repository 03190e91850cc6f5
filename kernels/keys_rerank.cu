// IKV_TOPK_SCORE_KEYS' second pass on the device (the header's
// ikv_topk_score; decode/selection.cpp key_share_scores is the CPU's): each
// non-mandatory candidate of the first pass's lists scored from its keys by
// its share of the attention over the candidates, summed over the scored
// rows. The select kernel then takes the budget among the candidates
// (launch_topk_select).
//
// Two kernels. key_lse_kernel: one warp per candidate entry, D/8 lanes per
// key row (8 channels each, dequant8), 32 / (D/8) rows at once, as the
// attention feedback kernel reads keys; each scored row's log-sum-exp over
// the entry's tokens to lse[bh][entry][row]. The rows (the group's query
// heads at query token 0, scaled, then a query memory's recalled rows) are
// staged in shared memory per block. key_share_kernel: one block per
// (sequence, kv-head): Z_r = log sum over the candidates of exp(lse_r), then
// each entry's score log sum_r w_r exp(lse_r - Z_r), the sums in double as
// on the CPU.
#include <math.h>

#include "block_reduce.cuh"
#include "dequant_rows.cuh"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "load_elem.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kLseWarps = 4;
constexpr int kShareThreads = 256;

// Scored row r of (b, h), scaled: the group's query heads at token 0, then the memory's recalled rows.
__device__ __forceinline__ float scored_row(const KeysRerankParams &p, uint32_t b, uint32_t h, uint32_t r, uint32_t d) {
    const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv, D = p.shape.head_dim;
    if (r < G) {
        const uint64_t qi = uint64_t(b) * p.n_query_tokens * p.n_q_heads + h * G + r;
        return load_elem(p.q, p.q_dtype, qi * D + d) * p.scale;
    }
    return p.mem_rows[((uint64_t(b) * Hkv + h) * G + (r - G)) * D + d] * p.scale;
}

// One entry's lse per scored row (R <= kMaxKeysRows), written by lane 0 to out[r].
template <int D, int F>
__device__ void entry_lse(const KeysRerankParams &p, const float *qs, uint32_t R, const DevPage &pg, uint32_t h,
                          uint32_t lane, float *out) {
    constexpr uint32_t kLanes = D / 8, kRows = 32 / kLanes;  // lanes per key row; rows at once
    const uint32_t c = lane % kLanes, slot = lane / kLanes;
    const uint8_t *sub = pg.base + subpage_offset(p.shape, ikv_format(F), p.layer, h);
    float m[kMaxKeysRows], s[kMaxKeysRows];  // this slot's running max and sum per row (every lane of the slot)
#pragma unroll
    for (uint32_t r = 0; r < kMaxKeysRows; ++r) m[r] = -INFINITY, s[r] = 0.0f;
    for (uint32_t row0 = pg.begin; row0 < pg.end; row0 += kRows) {
        const uint32_t row = row0 + slot;
        const bool valid = row < pg.end;  // lanes past the entry still join the shuffles
        float k[8];
        if (valid)
            dequant8<D, F, true>(sub, p.shape.page_size, row, c, k);
        else
#pragma unroll
            for (int j = 0; j < 8; ++j) k[j] = 0.0f;
#pragma unroll
        for (uint32_t r = 0; r < kMaxKeysRows; ++r) {
            if (r >= R) break;
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) dot = fmaf(qs[r * D + 8 * c + j], k[j], dot);
            for (uint32_t o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
            if (!valid) continue;
            const float x = p.softcap > 0.0f ? p.softcap * tanhf(dot / p.softcap) : dot;
            if (x == -INFINITY) continue;  // adds nothing, as on the CPU
            if (x != x) {
                m[r] = x;  // NaN: the row's lse becomes NaN below
            } else if (m[r] == m[r]) {
                if (x > m[r]) s[r] = s[r] * expf(m[r] - x) + 1.0f, m[r] = x;
                else s[r] += expf(x - m[r]);
            }
        }
    }
    // Merge the slots' (m, s) per row.
#pragma unroll
    for (uint32_t r = 0; r < kMaxKeysRows; ++r) {
        if (r >= R) break;
        float mr = m[r], sr = s[r];
        for (uint32_t o = kLanes; o < 32; o <<= 1) {
            const float mo = __shfl_xor_sync(0xFFFFFFFFu, mr, o), so = __shfl_xor_sync(0xFFFFFFFFu, sr, o);
            if (mr != mr || mo != mo) {
                mr = NAN;
            } else {
                const float mx = fmaxf(mr, mo);
                sr = (mr == -INFINITY ? 0.0f : sr * expf(mr - mx)) + (mo == -INFINITY ? 0.0f : so * expf(mo - mx));
                mr = mx;
            }
        }
        if (lane == 0) out[r] = mr != mr ? NAN : mr == -INFINITY ? -INFINITY : mr + logf(sr);
    }
}

template <int D>
__global__ void __launch_bounds__(kLseWarps * 32) key_lse_kernel(const KeysRerankParams p) {
    extern __shared__ float qs[];  // [R][D]
    const uint32_t h = blockIdx.y, b = blockIdx.z, Hkv = p.shape.n_kv_heads, lane = threadIdx.x % 32;
    const uint32_t bh = b * Hkv + h, G = p.n_q_heads / Hkv;
    pdl_wait();  // the first pass's lists (and a memory's recalled rows) are complete
    pdl_launch_dependents();
    const uint32_t n = p.candidates.counts[bh];
    if (blockIdx.x * kLseWarps >= n) return;  // uniform over the block
    const uint32_t R = p.mem_rows != nullptr && p.mem_ok[bh] ? 2 * G : G;
    for (uint32_t e = threadIdx.x; e < R * D; e += blockDim.x) qs[e] = scored_row(p, b, h, e / D, e % D);
    __syncthreads();
    for (uint32_t e = blockIdx.x * kLseWarps + threadIdx.x / 32; e < n; e += gridDim.x * kLseWarps) {
        const DevPage pg = p.candidates.pages[uint64_t(bh) * p.candidates.stride + e];
        if (pg.flags & IKV_PAGE_MANDATORY) continue;  // warp-uniform
        float *out = p.lse + (uint64_t(bh) * p.candidates.stride + e) * p.lse_rows;
        switch (pg.format) {
            case IKV_FMT_F16: entry_lse<D, IKV_FMT_F16>(p, qs, R, pg, h, lane, out); break;
            case IKV_FMT_BF16: entry_lse<D, IKV_FMT_BF16>(p, qs, R, pg, h, lane, out); break;
            case IKV_FMT_FP8_E4M3: entry_lse<D, IKV_FMT_FP8_E4M3>(p, qs, R, pg, h, lane, out); break;
            case IKV_FMT_INT8: entry_lse<D, IKV_FMT_INT8>(p, qs, R, pg, h, lane, out); break;
            default: entry_lse<D, IKV_FMT_INT4>(p, qs, R, pg, h, lane, out); break;
        }
    }
}

__global__ void __launch_bounds__(kShareThreads) key_share_kernel(const KeysRerankParams p) {
    __shared__ double red[kShareThreads / 32];
    __shared__ float z_log[kMaxKeysRows];
    const uint32_t h = blockIdx.x, b = blockIdx.y, Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    const uint32_t bh = b * Hkv + h;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t n = p.candidates.counts[bh];
    const bool mem = p.mem_rows != nullptr && p.mem_ok[bh];
    const uint32_t R = mem ? 2 * G : G;
    const DevPage *cand = p.candidates.pages + uint64_t(bh) * p.candidates.stride;
    const float *lse = p.lse + uint64_t(bh) * p.candidates.stride * p.lse_rows;
    auto value = [&](uint32_t i, uint32_t r) {  // a candidate's lse for row r; -inf: none (mandatory)
        return (cand[i].flags & IKV_PAGE_MANDATORY) ? -INFINITY : double(lse[uint64_t(i) * p.lse_rows + r]);
    };
    for (uint32_t r = 0; r < R; ++r) {
        double mx = -INFINITY;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const double x = value(i, r);
            if (x > mx) mx = x;  // NaN and -inf add nothing
        }
        mx = block_reduce(mx, red, [](double x, double y) { return x > y ? x : y; });
        double sum = 0.0;
        if (mx > -INFINITY)
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
                const double x = value(i, r);
                if (x > -INFINITY) sum += exp(x - mx);
            }
        sum = block_reduce(sum, red, [](double x, double y) { return x + y; });
        if (threadIdx.x == 0) z_log[r] = mx > -INFINITY ? float(mx + log(sum)) : -INFINITY;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float score = -INFINITY;
        if (!(cand[i].flags & IKV_PAGE_MANDATORY)) {
            double share = 0.0;
            for (uint32_t r = 0; r < R; ++r) {
                if (z_log[r] == -INFINITY) continue;
                const double w = r < G ? 0.0 : double(p.mem_log_weight);
                const double x = double(lse[uint64_t(i) * p.lse_rows + r]);
                share += x == -INFINITY ? 0.0 : exp(w + x - double(z_log[r]));  // NaN propagates
            }
            score = float(log(share));
        }
        p.scores[uint64_t(bh) * p.candidates.stride + i] = score;
    }
}

template <int D>
cudaError_t launch_lse(const KeysRerankParams &p, cudaStream_t stream) {
    const uint32_t R = p.n_q_heads / p.shape.n_kv_heads * (p.mem_rows ? 2 : 1);
    const dim3 grid((p.candidates.stride + kLseWarps - 1) / kLseWarps, p.shape.n_kv_heads, p.n_seqs);
    return launch_pdl(key_lse_kernel<D>, grid, dim3(kLseWarps * 32), size_t(R) * D * 4, stream, p);
}

}  // namespace

cudaError_t launch_keys_rerank(const KeysRerankParams &p, cudaStream_t stream) {
    const uint32_t R = p.n_q_heads / p.shape.n_kv_heads * (p.mem_rows ? 2 : 1);
    if (R > kMaxKeysRows || p.lse_rows < R || p.candidates.list_heads != p.shape.n_kv_heads || (p.mem_rows != nullptr) != (p.mem_ok != nullptr))
        return cudaErrorInvalidValue;
    cudaError_t err = p.shape.head_dim == 32    ? launch_lse<32>(p, stream)
                      : p.shape.head_dim == 64  ? launch_lse<64>(p, stream)
                      : p.shape.head_dim == 128 ? launch_lse<128>(p, stream)
                      : p.shape.head_dim == 256 ? launch_lse<256>(p, stream)
                                                : cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    return launch_pdl(key_share_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kShareThreads), size_t(0), stream, p);
}

}  // namespace cuda
}  // namespace ikv
