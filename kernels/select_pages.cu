// The select stage of kernels/score_topk.cu: the candidates that fit a
// token budget, best score first, by a token-weighted radix select on one
// block per (sequence, kv-head) or on a thread-block cluster of
// kSelectCluster blocks (few pairs with many candidates), compacted in
// candidate order.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "topk_shared.cuh"
#include "topk_stages.hpp"

namespace ikv {
namespace cuda {
namespace {

using namespace topk;

constexpr int kSelectThreads = 1024;
constexpr uint32_t kSelectCluster = 8;          // blocks per (sequence, kv-head) when clustered
constexpr uint32_t kSelectClusterMaxHeads = 16;  // clustered up to this many (sequence, kv-head) pairs: one block per SM each
constexpr uint32_t kSelectClusterMinCandidates = 4097;  // ... with more candidates than this (> 64K tokens at page 16)

// Inclusive scan of v over the warp's lanes.
__device__ __forceinline__ uint32_t warp_scan(uint32_t v, uint32_t lane) {
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t n = __shfl_up_sync(0xFFFFFFFFu, v, o);
        if (lane >= uint32_t(o)) v += n;
    }
    return v;
}

// A scan over the candidates [0, count) in candidate order, coalesced: each
// warp owns a contiguous run (a multiple of 32), sums value(i) over it; one
// warp turns the 32 warp totals into offsets; then each warp walks its run
// again 32 candidates at a time: visit(i, inclusive prefix of value up to i)
// for every i < count. Returns the grand total (to every thread). Three
// barriers whatever the count (the per-1024 block scan it replaced cost five
// per 1024 candidates). All threads of the block must call it.
template <class Value, class Visit>
__device__ uint32_t ordered_scan(uint32_t count, uint32_t *warp_sums, Value value, Visit visit) {
    constexpr uint32_t W = kSelectThreads / 32;
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t per = ((count + W - 1) / W + 31) / 32 * 32;
    const uint32_t b = min(warp * per, count), e = min(b + per, count);
    uint32_t total = 0;
    for (uint32_t i0 = b; i0 < e; i0 += 32) total += __reduce_add_sync(0xFFFFFFFFu, i0 + lane < e ? value(i0 + lane) : 0u);
    __syncthreads();  // earlier readers of warp_sums are done
    if (lane == 0) warp_sums[warp] = total;
    __syncthreads();
    if (warp == 0) {
        const uint32_t own = warp_sums[lane], incl = warp_scan(own, lane);
        warp_sums[lane] = incl - own;
        if (lane == 31) warp_sums[W] = incl;
    }
    __syncthreads();
    uint32_t run = warp_sums[warp];
    for (uint32_t i0 = b; i0 < e; i0 += 32) {
        const uint32_t i = i0 + lane;
        const uint32_t incl = warp_scan(i < e ? value(i) : 0u, lane);
        if (i < e) visit(i, run + incl);
        run += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
    return warp_sums[W];
}

// One warp finds the radix digit where the token budget runs out: the first
// bin b with hist[0] + ... + hist[b] > *rem (bins in ascending key = bound
// descending), *rem reduced by the bins before it; 256 and *rem reduced by all
// bins when everything fits. Each lane sums 8 bins, a warp scan places them:
// a few shuffles instead of one thread walking 256 bins (the profile showed
// that walk, 4 passes, as most of the select kernel's 26 us).
__device__ void find_digit(const uint32_t *hist, uint32_t lane, int64_t *rem_io, uint32_t *digit) {
    const int64_t rem = *rem_io;
    __syncwarp();  // every lane has read *rem_io before one of them writes it
    uint32_t h[8], own = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) own += h[j] = hist[lane * 8 + j];
    uint32_t inc = own;  // tokens in the bins up to this lane's last
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t n = __shfl_up_sync(0xFFFFFFFFu, inc, o);
        if (lane >= uint32_t(o)) inc += n;
    }
    const uint32_t total = __shfl_sync(0xFFFFFFFFu, inc, 31);
    const int64_t before = int64_t(inc) - int64_t(own);
    if (int64_t(inc) > rem && before <= rem) {  // the one lane whose bins hold the crossing
        int64_t r = rem - before;
        uint32_t d = lane * 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (int64_t(h[j]) > r) {
                d = lane * 8 + uint32_t(j);
                break;
            }
            r -= h[j];
        }
        *rem_io = r;
        *digit = d;
    }
    if (lane == 0 && int64_t(total) <= rem) {
        *rem_io = rem - int64_t(total);
        *digit = 256;
    }
}

// Cluster primitives; sm_80 builds compile them out (clusters are never
// launched there: select_on_clusters).
__device__ __forceinline__ uint32_t cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().block_rank();
#else
    return 0;
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __syncthreads();
#endif
}
template <class T>
__device__ __forceinline__ T *cluster_shared(T *local, uint32_t r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(local, r);
#else
    (void)r;
    return local;
#endif
}

// The blocks that select one (sequence, kv-head) together: a thread-block
// cluster of C blocks, each owning a contiguous share of the candidates, that
// sum their histograms and hand each other offsets through distributed
// shared memory; with C == 1 the same code runs on one block.
template <uint32_t C>
struct SelectTeam {
    __device__ static uint32_t rank() { return C == 1 ? 0u : cluster_rank(); }
    // Every block of the team reached this point; their shared memory writes are visible.
    __device__ static void sync() {
        if constexpr (C == 1) __syncthreads();
        else cluster_sync();
    }
    // Team block r's copy of the shared variable at `local`.
    template <class T>
    __device__ static T *at(T *local, uint32_t r) { return C == 1 ? local : cluster_shared(local, r); }
    // Sum over the team blocks before this one (before = true) or all of them.
    __device__ static uint32_t sum(uint32_t *local, bool before) {
        uint32_t s = 0;
        const uint32_t n = before ? rank() : C;
        for (uint32_t r = 0; r < n; ++r) s += *at(local, r);
        return s;
    }
};

// Sum of value(i) over [0, count), to every thread. All threads call it.
template <class Value>
__device__ uint32_t block_sum(uint32_t count, uint32_t *warp_sums, Value value) {
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint32_t v = 0;
    for (uint32_t i = threadIdx.x; i < count; i += kSelectThreads) v += value(i);
    v = __reduce_add_sync(0xFFFFFFFFu, v);
    __syncthreads();  // earlier readers of warp_sums are done
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    uint32_t total = 0;
    for (uint32_t w = 0; w < kSelectThreads / 32; ++w) total += warp_sums[w];
    return total;
}

template <uint32_t C>
__global__ void __launch_bounds__(kSelectThreads, C == 1 ? 2 : 1)
    select_kernel(const TopkParams p, uint32_t npad, uint32_t fused_rows) {
    using Team = SelectTeam<C>;
    extern __shared__ __align__(16) uint8_t smem[];
    uint32_t *keys = reinterpret_cast<uint32_t *>(smem);  // this block's candidates; 0 = mandatory
    uint8_t *tok = smem + npad * 4;
    uint8_t *keep = tok + npad;
    __shared__ uint32_t warp_sums[kSelectThreads / 32 + 1];
    // A pass clears the bins of the pass after it: double-buffered on one
    // block, triple-buffered in a cluster (the team reads a pass's bins until
    // the next pass's team barrier). Static shared memory is kept as small as
    // before clusters for C == 1: at B = 1, 32K one more KB took the kernel
    // past the 16 KB shared-memory carveout the score kernel runs with, and
    // the step lost 4.5 us (bench/RESULTS.md 1i).
    constexpr uint32_t kHistBufs = C == 1 ? 2 : 3;
    __shared__ uint32_t hist[kHistBufs][256];
    __shared__ uint32_t team_hist[C == 1 ? 1 : 256];  // the team's histogram of the pass
    __shared__ uint32_t digit_sh;
    __shared__ int64_t rem_sh;
    __shared__ uint32_t mand_sh, ties_sh, kept_sh;  // this block's totals, read by the team

    const uint32_t head = blockIdx.x / C, seq = blockIdx.y, Hkv = p.shape.n_kv_heads;
    pdl_wait();  // the scores are complete and visible
    pdl_launch_dependents();  // the decode's CTAs may take the slots these few blocks leave free
    const uint32_t list = p.candidates.list_heads > 1 ? seq * Hkv + head : seq;  // per sequence, or per (seq, head)
    const uint32_t count_all = p.candidates.counts[list], per = (count_all + C - 1) / C;
    const uint32_t lo = min(Team::rank() * per, count_all), count = min(lo + per, count_all) - lo;
    const DevPage *cand = p.candidates.pages + uint64_t(list) * p.candidates.stride + lo;
    const float *scores = p.scores + (uint64_t(seq) * Hkv + head) * p.max_candidates + lo;
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // fused_rows > 0 (one block, IKV_TOPK_SCORE_HYBRID with nothing between the
    // score and this kernel): the hybrid combine is done here, as
    // hybrid_combine_kernel does it (same operations, same scores), one kernel
    // boundary fewer. Each row's largest sum over the non-mandatory candidates
    // goes through the second histogram buffer ([8 rows][32 warps]; warp g
    // then leaves row g's maximum in its first word), which the first pass
    // clears after the barriers below.
    const float *rows = p.rows + (uint64_t(seq) * Hkv + head) * fused_rows * p.max_candidates;
    float(*top)[32] = reinterpret_cast<float(*)[32]>(hist[1]);  // row g's maximum at top[g][0]
    static_assert(kMaxFusedRows * 32 <= 256 && kSelectThreads == 1024, "[8 rows][32 warps] in one buffer");
    const float mem_off = C == 1 && fused_rows > 0 ? hybrid_mem_offset(p, uint64_t(seq) * Hkv + head) : 0.0f;
    if (C == 1 && fused_rows > 0) {
        float m[kMaxFusedRows];
#pragma unroll
        for (uint32_t g = 0; g < kMaxFusedRows; ++g) m[g] = -INFINITY;
        for (uint32_t i = tid; i < count; i += kSelectThreads)
            if (!(cand[i].flags & IKV_PAGE_MANDATORY))
#pragma unroll
                for (uint32_t g = 0; g < kMaxFusedRows; ++g)
                    if (g < fused_rows) m[g] = fmaxf(m[g], rows[uint64_t(g) * p.max_candidates + i]);
        block_row_max(m, fused_rows, top);
    }
    auto score = [&](uint32_t i) {
        if (C != 1 || fused_rows == 0) return scores[i];
        return hybrid_score(rows, p.max_candidates, i, fused_rows, p.n_q_heads / Hkv, mem_off,
                            [&](uint32_t g) { return top[g][0]; });
    };
    uint32_t my_mand = 0;
    for (uint32_t i = tid; i < count; i += kSelectThreads) {
        const DevPage pg = cand[i];
        const bool mandatory = pg.flags & IKV_PAGE_MANDATORY;
        keys[i] = mandatory ? 0u : order_key(score(i));
        tok[i] = uint8_t(uint32_t(pg.end) - pg.begin);
        keep[i] = mandatory ? 1 : 0;
        if (mandatory) my_mand += uint32_t(pg.end) - pg.begin;
    }
    for (uint32_t b = tid; b < 256; b += kSelectThreads) hist[0][b] = 0;
    my_mand = __reduce_add_sync(0xFFFFFFFFu, my_mand);
    if (lane == 0) warp_sums[warp] = my_mand;
    __syncthreads();
    if (tid == 0) {
        uint32_t t = 0;
        for (uint32_t w = 0; w < kSelectThreads / 32; ++w) t += warp_sums[w];
        mand_sh = t;
    }
    Team::sync();
    // Tokens left for non-mandatory pages (negative: none fits), in every thread.
    const uint32_t budget = p.budgets ? p.budgets[uint64_t(seq) * Hkv + head] : p.token_budget;
    const uint64_t mand = Team::sum(&mand_sh, false);
    // IKV_TOPK_SCORE_KEYS' first pass: candidates for M + factor * (budget - M) tokens.
    const uint64_t wanted = p.candidate_factor > 1 && budget > mand ? mand + uint64_t(p.candidate_factor) * (budget - mand)
                                                                    : uint64_t(budget);
    const int64_t rem0 = int64_t(wanted) - int64_t(mand);
    if (tid == 0) rem_sh = rem0;  // find_digit's running copy (read after the next barrier)
    // Radix select over the 32-bit key, MSB first: keys < lim are all taken; keys == tie are taken in
    // candidate order while they fit. Every block of the team finds the same digits from the same
    // team histogram.
    uint64_t lim = 0;
    uint32_t prefix = 0, mask = 0;
    bool ties = false;
    if (rem0 >= 0) {
        ties = true;
        for (int pass = 0; pass < 4; ++pass) {
            const int shift = 24 - 8 * pass;
            uint32_t *h = hist[pass % kHistBufs];
            for (uint32_t b = tid; b < 256; b += kSelectThreads) hist[(pass + 1) % kHistBufs][b] = 0;
            // Token histogram of the digit. A warp whose candidates all fall into one bin
            // (common in the first pass: scores of one layer share their top bits) adds
            // them up first and makes one shared-memory atomic; otherwise each lane adds
            // its own tokens. (Adding up per bin with a redux over each lane's match mask
            // ran once per distinct bin, ~7 times a warp on real scores: the kernel's
            // hottest code; bench/RESULTS.md 1i measures the choice.)
            for (uint32_t base = 0; base < count; base += kSelectThreads) {  // warp-uniform trip count
                const uint32_t i = base + tid;
                const uint32_t k = i < count ? keys[i] : 0u;
                const bool in = k != 0 && (k & mask) == prefix;
                const uint32_t bin = in ? (k >> shift) & 255u : 256u;
                if (__match_any_sync(0xFFFFFFFFu, bin) == 0xFFFFFFFFu) {  // warp-uniform
                    const uint32_t sum = __reduce_add_sync(0xFFFFFFFFu, in ? uint32_t(tok[i]) : 0u);
                    if (in && lane == 0) atomicAdd(&h[bin], sum);
                } else if (in) {
                    atomicAdd(&h[bin], uint32_t(tok[i]));
                }
            }
            Team::sync();
            const uint32_t *th = h;
            if constexpr (C > 1) {
                for (uint32_t b = tid; b < 256; b += kSelectThreads) {
                    uint32_t t = 0;
                    for (uint32_t r = 0; r < C; ++r) t += Team::at(h, r)[b];
                    team_hist[b] = t;
                }
                __syncthreads();
                th = team_hist;
            }
            if (warp == 0) find_digit(th, lane, &rem_sh, &digit_sh);
            __syncthreads();
            const uint32_t d = digit_sh;
            if (d == 256) {  // everything under this prefix fits
                lim = uint64_t(prefix) + (uint64_t(1) << (shift + 8));
                ties = false;
                break;
            }
            prefix |= d << shift;
            mask |= 255u << shift;
            lim = prefix;
        }
    }
    const int64_t rem = ties ? rem_sh : rem0;  // rem_sh is only shared after a pass's barriers
    // Mark the strict prefix.
    for (uint32_t i = tid; i < count; i += kSelectThreads)
        if (keys[i] != 0 && uint64_t(keys[i]) < lim) keep[i] = 1;
    // Ties at the boundary key, in candidate order (the team's earlier blocks first), while they fit.
    auto is_tie = [&](uint32_t i) { return keys[i] == prefix && keys[i] != 0; };
    auto tie_tokens = [&](uint32_t i) { return is_tie(i) ? uint32_t(tok[i]) : 0u; };
    if (ties) {  // team-uniform (derived from the same shared values in every block)
        uint32_t before = 0;
        if constexpr (C > 1) {
            const uint32_t mine = block_sum(count, warp_sums, tie_tokens);
            if (tid == 0) ties_sh = mine;
            Team::sync();
            before = Team::sum(&ties_sh, true);
        }
        ordered_scan(count, warp_sums, tie_tokens, [&](uint32_t i, uint32_t run) {
            if (is_tie(i) && int64_t(before) + run <= rem) keep[i] = 1;
        });
    }
    __syncthreads();  // keep[] of the strict prefix came from other threads
    // Stable compaction in candidate order, after the team's earlier blocks.
    uint32_t before = 0, total = 0;
    if constexpr (C > 1) {
        const uint32_t mine = block_sum(count, warp_sums, [&](uint32_t i) { return uint32_t(keep[i]); });
        if (tid == 0) kept_sh = mine;
        Team::sync();
        before = Team::sum(&kept_sh, true);
        total = Team::sum(&kept_sh, false);
    }
    DevPage *out = p.out_pages + (uint64_t(seq) * Hkv + head) * p.max_candidates + before;
    const uint32_t mine = ordered_scan(
        count, warp_sums, [&](uint32_t i) { return uint32_t(keep[i]); },
        [&](uint32_t i, uint32_t pos) {
            if (keep[i]) out[pos - 1] = cand[i];
        });
    if constexpr (C == 1) total = mine;
    if (Team::rank() == 0 && tid == 0) p.out_counts[uint64_t(seq) * Hkv + head] = total;
    if constexpr (C > 1) Team::sync();  // no block leaves while the team may still read its shared memory
}

// Opt in to the select kernel's largest shared memory once per device.
cudaError_t allow_select_smem() {
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint64_t bit = 1ull << (dev & 63);
    if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
    err = cudaFuncSetAttribute(reinterpret_cast<const void *>(select_kernel<1>),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxTopkCandidates * 6));
    if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
    return err;
}

}  // namespace

namespace topk {


// Whether the select of a step runs on clusters of kSelectCluster blocks per
// (sequence, kv-head): when there are few of those (B = 1: 8 blocks on 132
// SMs) and each has many candidates, so the radix passes spread over more
// SMs. Measured (bench/RESULTS.md 1i): B = 1, 128K gains ~7 us; at 32K and
// below the cluster's own cost (8 whole free SMs, team barriers) loses.
// IKV_CUDA_TOPK_CLUSTERS=on|off (read once) forces either way wherever
// clusters can run, so the checks cover both paths.
bool select_on_clusters(const TopkParams &p) {
    static const int forced = [] {
        const char *e = std::getenv("IKV_CUDA_TOPK_CLUSTERS");
        if (e == nullptr) return 0;
        return std::strcmp(e, "on") == 0 ? 1 : std::strcmp(e, "off") == 0 ? -1 : 0;
    }();
    if (forced < 0) return false;
    if (forced == 0 && (p.n_seqs * p.shape.n_kv_heads > kSelectClusterMaxHeads ||
                        p.max_candidates < kSelectClusterMinCandidates))
        return false;
    // Per device, once: sm_90+ and room for at least one cluster of these
    // blocks (a MIG slice or a small GPC may have none).
    static std::atomic<uint64_t> known{0}, yes{0};
    return per_device_flag(known, yes, [](int dev) {
        if (cc_major(dev) < 9) return false;
        cudaLaunchAttribute attr[2];
        const cudaLaunchConfig_t cfg = launch_config(false, kSelectCluster, dim3(kSelectCluster), dim3(kSelectThreads),
                                                     (kMaxTopkCandidates / kSelectCluster) * 6, nullptr, attr);
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, select_kernel<kSelectCluster>, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();  // this query's own error: no clusters
            return false;
        }
        return clusters >= 1;
    });
}

// The one-block select kernel (fused_rows: see select_kernel).
cudaError_t launch_select(const TopkParams &p, uint32_t npad, uint32_t fused_rows, cudaStream_t stream) {
    const cudaError_t err = allow_select_smem();
    if (err != cudaSuccess) return err;
    return launch_pdl(select_kernel<1>, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kSelectThreads), size_t(npad * 6),
                      stream, p, npad, fused_rows);
}

// The clustered select kernel: each block of a cluster holds a padded share of the candidates.
cudaError_t launch_select_clusters(const TopkParams &p, cudaStream_t stream) {
    uint32_t share = 1;
    while (share < (p.max_candidates + kSelectCluster - 1) / kSelectCluster) share <<= 1;
    return launch_ex(pdl_supported(), kSelectCluster, select_kernel<kSelectCluster>,
                     dim3(p.shape.n_kv_heads * kSelectCluster, p.n_seqs), dim3(kSelectThreads), size_t(share * 6),
                     stream, p, share, 0u);
}

}  // namespace topk
}  // namespace cuda
}  // namespace ikv
