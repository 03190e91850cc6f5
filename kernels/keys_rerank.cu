// IKV_TOPK_SCORE_KEYS' second pass on the device (the header's
// ikv_topk_score; decode/selection.cpp key_share_scores is the CPU's): each
// non-mandatory candidate of the first pass's lists scored from its keys by
// its share of the attention over the candidates, summed over the scored
// rows. The select kernel then takes the budget among the candidates
// (launch_topk_select).
//
// Two kernels. key_lse_kernel: one warp per candidate entry, reading its keys
// as the attention feedback kernel does (warp_key_dots.cuh); each scored
// row's log-sum-exp over the entry's tokens to lse[bh][entry][row]. The rows
// (the group's query heads at query token 0, scaled, then a query memory's
// recalled rows) are staged in shared memory once per block, and a block
// walks many entries: a first version with a block per 4 entries and one
// butterfly per row ran at a quarter of dense decode's read rate
// (bench/RESULTS.md 6w). key_share_kernel: one block per
// (sequence, kv-head): Z_r = log sum over the candidates of exp(lse_r), then
// each entry's score log sum_r w_r exp(lse_r - Z_r), the sums in double as
// on the CPU.
#include <math.h>

#include "block_reduce.cuh"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "load_elem.cuh"
#include "warp_key_dots.cuh"

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

// One entry's lse per scored row r < R, written to out[r]. qs holds NR >= R
// rows (zeros past R).
template <int D, int F, int NR>
__device__ void entry_lse(const KeysRerankParams &p, const float *qs, uint32_t R, const DevPage &pg, uint32_t h,
                          uint32_t lane, float *out) {
    using W = WarpKeyDots<D, NR>;
    const uint32_t c = lane % W::kLanes;
    const uint8_t *sub = pg.base + subpage_offset(p.shape, ikv_format(F), p.layer, h);
    float m[W::kOut], s[W::kOut];  // the running max and sum of this lane's rows, over its key rows
#pragma unroll
    for (uint32_t i = 0; i < W::kOut; ++i) m[i] = -INFINITY, s[i] = 0.0f;
    for_each_key_dot<D, F, NR>(sub, p.shape.page_size, pg.begin, pg.end, qs, lane, [&](uint32_t, const float *dot) {
#pragma unroll
        for (uint32_t i = 0; i < W::kOut; ++i) {
            const float x = p.softcap > 0.0f ? p.softcap * tanhf(dot[i] / p.softcap) : dot[i];
            if (x == -INFINITY) continue;  // adds nothing, as on the CPU
            if (x != x) {
                m[i] = x;  // NaN: the row's lse becomes NaN below
            } else if (m[i] == m[i]) {
                if (x > m[i]) s[i] = s[i] * expf(m[i] - x) + 1.0f, m[i] = x;
                else s[i] += expf(x - m[i]);
            }
        }
    });
    // Merge the key-row slots' (m, s): lanes kLanes apart hold the same rows.
#pragma unroll
    for (uint32_t i = 0; i < W::kOut; ++i) {
        float mr = m[i], sr = s[i];
        for (uint32_t o = W::kLanes; o < 32; o <<= 1) {
            const float mo = __shfl_xor_sync(0xFFFFFFFFu, mr, o), so = __shfl_xor_sync(0xFFFFFFFFu, sr, o);
            if (mr != mr || mo != mo) {
                mr = NAN;
            } else {
                const float mx = fmaxf(mr, mo);
                sr = (mr == -INFINITY ? 0.0f : sr * expf(mr - mx)) + (mo == -INFINITY ? 0.0f : so * expf(mo - mx));
                mr = mx;
            }
        }
        const uint32_t r = W::row_of(c, i);
        if (lane < W::kLanes && W::leader(c) && r < R)
            out[r] = mr != mr ? NAN : mr == -INFINITY ? -INFINITY : mr + logf(sr);
    }
}

// Grid (blocks per (sequence, kv-head), kv-heads, sequences): few enough
// blocks that each stages its rows once for many entries.
// (At most 64 registers up to 8 rows, so 8 blocks fit an SM: 4-8% faster at
// B >= 8 and 128K than the compiler's own choice of ~80, 6 blocks; RESULTS
// 6v. 16 rows keep 6 blocks: 64 registers spilled there.)
template <int D, int NR>
__global__ void __launch_bounds__(kLseWarps * 32, NR <= 8 ? 8 : 6) key_lse_kernel(const KeysRerankParams p) {
    extern __shared__ float4 qs4[];  // [NR][D]
    float *qs = reinterpret_cast<float *>(qs4);
    const uint32_t h = blockIdx.y, b = blockIdx.z, Hkv = p.shape.n_kv_heads, lane = threadIdx.x % 32;
    const uint32_t bh = b * Hkv + h, G = p.n_q_heads / Hkv;
    pdl_wait();  // the first pass's lists (and a memory's recalled rows) are complete
    pdl_launch_dependents();
    const uint32_t n = p.candidates.counts[bh];
    if (blockIdx.x * kLseWarps >= n) return;  // uniform over the block
    const uint32_t R = p.mem_rows != nullptr && p.mem_ok[bh] ? 2 * G : G;
    for (uint32_t e = threadIdx.x; e < NR * D; e += blockDim.x)
        qs[e] = e / D < R ? scored_row(p, b, h, e / D, e % D) : 0.0f;
    __syncthreads();
    const uint32_t step = gridDim.x * kLseWarps;
    for (uint32_t e = blockIdx.x * kLseWarps + threadIdx.x / 32; e < n; e += step) {
        const DevPage pg = p.candidates.pages[uint64_t(bh) * p.candidates.stride + e];
        if (e + step < n) {  // the warp's next entry on its way while this one is read (warp_key_dots.cuh)
            const DevPage nx = p.candidates.pages[uint64_t(bh) * p.candidates.stride + e + step];
            if (!(nx.flags & IKV_PAGE_MANDATORY))
                prefetch_key_rows<D>(nx.base + subpage_offset(p.shape, ikv_format(nx.format), p.layer, h),
                                     ikv_format(nx.format), nx.begin, nx.end, lane);
        }
        if (pg.flags & IKV_PAGE_MANDATORY) continue;  // warp-uniform
        float *out = p.lse + (uint64_t(bh) * p.candidates.stride + e) * p.lse_rows;
        with_format(pg.format, [&](auto F) { entry_lse<D, F.value, NR>(p, qs, R, pg, h, lane, out); });
    }
}

template <int NR>
__global__ void __launch_bounds__(kShareThreads) key_share_kernel(const KeysRerankParams p) {
    __shared__ double red[kShareThreads / 32];
    __shared__ float z_log[NR];
    const uint32_t h = blockIdx.x, b = blockIdx.y, Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    const uint32_t bh = b * Hkv + h;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t n = p.candidates.counts[bh];
    const bool mem = p.mem_rows != nullptr && p.mem_ok[bh];
    const uint32_t R = mem ? 2 * G : G;
    const DevPage *cand = p.candidates.pages + uint64_t(bh) * p.candidates.stride;
    const float *lse = p.lse + uint64_t(bh) * p.candidates.stride * p.lse_rows;
    // One pass over the candidates: each thread's running max and sum per row
    // (a pass per row and per statistic, as first written, cost 2R + 1 walks).
    double m[NR], sum[NR];
#pragma unroll
    for (uint32_t r = 0; r < NR; ++r) m[r] = -INFINITY, sum[r] = 0.0;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (cand[i].flags & IKV_PAGE_MANDATORY) continue;
        const float *row = lse + uint64_t(i) * p.lse_rows;
#pragma unroll
        for (uint32_t r = 0; r < NR; ++r) {
            if (r >= R) break;
            const double x = row[r];
            if (!(x > -INFINITY)) continue;  // NaN and -inf add nothing
            if (x > m[r]) sum[r] = sum[r] * exp(m[r] - x) + 1.0, m[r] = x;
            else sum[r] += exp(x - m[r]);
        }
    }
#pragma unroll
    for (uint32_t r = 0; r < NR; ++r) {
        if (r >= R) break;
        const double mx = block_reduce(m[r], red, [](double x, double y) { return x > y ? x : y; });
        const double total = block_reduce(m[r] > -INFINITY ? sum[r] * exp(m[r] - mx) : 0.0, red,
                                          [](double x, double y) { return x + y; });
        if (threadIdx.x == 0) z_log[r] = mx > -INFINITY ? float(mx + log(total)) : -INFINITY;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        float score = -INFINITY;
        if (!(cand[i].flags & IKV_PAGE_MANDATORY)) {
            double share = 0.0;
            for (uint32_t r = 0; r < R; ++r) {
                if (!isfinite(z_log[r])) continue;  // no share, or a non-finite query's row (the CPU's rule)
                const double w = r < G ? 0.0 : double(p.mem_log_weight);
                const double x = double(lse[uint64_t(i) * p.lse_rows + r]);
                share += x == -INFINITY ? 0.0 : exp(w + x - double(z_log[r]));  // NaN propagates
            }
            score = float(log(share));
        }
        p.scores[uint64_t(bh) * p.candidates.stride + i] = score;
    }
}

template <int D, int NR>
cudaError_t launch_lse(const KeysRerankParams &p, cudaStream_t stream) {
    const size_t smem = size_t(NR) * D * 4;
    static std::atomic<int> resident{0};
    const dim3 grid(key_walk_blocks(resident_blocks(resident, key_lse_kernel<D, NR>, kLseWarps * 32, smem), p.candidates.stride, kLseWarps, p.shape.n_kv_heads * p.n_seqs, p.n_sms),
                    p.shape.n_kv_heads, p.n_seqs);
    return launch_pdl(key_lse_kernel<D, NR>, grid, dim3(kLseWarps * 32), smem, stream, p);
}

// Both kernels for NR staged rows (the scored rows rounded up).
template <int NR>
cudaError_t launch_rerank(const KeysRerankParams &p, cudaStream_t stream) {
    cudaError_t err = p.shape.head_dim == 32    ? launch_lse<32, NR>(p, stream)
                      : p.shape.head_dim == 64  ? launch_lse<64, NR>(p, stream)
                      : p.shape.head_dim == 128 ? launch_lse<128, NR>(p, stream)
                      : p.shape.head_dim == 256 ? launch_lse<256, NR>(p, stream)
                                                : cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    return launch_pdl(key_share_kernel<NR>, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kShareThreads), size_t(0),
                      stream, p);
}

}  // namespace

cudaError_t launch_keys_rerank(const KeysRerankParams &p, cudaStream_t stream) {
    const uint32_t R = p.n_q_heads / p.shape.n_kv_heads * (p.mem_rows ? 2 : 1);
    if (R > kMaxKeysRows || p.lse_rows < R || p.candidates.list_heads != p.shape.n_kv_heads || (p.mem_rows != nullptr) != (p.mem_ok != nullptr))
        return cudaErrorInvalidValue;
    switch (key_dot_tile_rows(R)) {
        case 4: return launch_rerank<4>(p, stream);
        case 8: return launch_rerank<8>(p, stream);
        default: return launch_rerank<16>(p, stream);
    }
}

}  // namespace cuda
}  // namespace ikv
