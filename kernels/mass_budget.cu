// IKV_TOPK_MASS's budget per (sequence, kv-head), the stage of
// kernels/score_topk.cu between the scores and the select.
#include <cuda_runtime.h>
#include <math.h>

#include <algorithm>

#include "block_reduce.cuh"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "topk_shared.cuh"
#include "topk_stages.hpp"

namespace ikv {
namespace cuda {
namespace {

using namespace topk;

// IKV_TOPK_MASS, one block per (kv-head, sequence): the candidates' weights
// n_i * exp(scale * (s_i - max s)) in double; the smallest order key K whose
// candidates (keys <= K, i.e. scores >= the K-th) reach mass_share of the
// total, by radix select over the 32-bit key (4 passes of 8 bits, weights in
// fixed point; at mass_share 1 by bisection on double sums; the weights are
// computed once into p.weights); then, as the CPU takes candidates one by one
// in rank order (ties: candidate order), the candidates of key K are taken in
// candidate order by a block-wide scan while the weight before each is short
// of the share (the hybrid score makes ties common: every query head's best
// page scores 0).
// The budget is the mandatory tokens plus the candidates taken, clamped to
// [min_tokens, token_budget or unlimited].
// 1024 threads, each holding its candidates (c = thread + k * 1024) in
// registers from one load: at B = 1 there are only n_kv_heads blocks, and 256
// threads walked their candidates through memory in every pass. (At B = 1, 8K
// the kernel still takes ~36 us on the H100: bench/RESULTS.md 6z.)
constexpr int kMassThreads = 1024;
constexpr int kMassPer = int(kMaxTopkCandidates) / kMassThreads;
__global__ void __launch_bounds__(kMassThreads) mass_budget_kernel(const TopkParams p, uint32_t fused_rows) {
    __shared__ double dsum[32];
    __shared__ float fmax_sh[32];
    __shared__ uint32_t usum[32];
    const uint32_t head = blockIdx.x, seq = blockIdx.y, Hkv = p.shape.n_kv_heads;
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t count = p.candidates.counts[seq];
    const DevPage *cands = p.candidates.pages + uint64_t(seq) * p.candidates.stride;
    float *scores = p.scores + (uint64_t(seq) * Hkv + head) * p.max_candidates;
    auto at = [&](int k) { return tid + uint32_t(k) * kMassThreads; };
    // Steps k that hold candidates at all (block-uniform): the loops below are
    // unrolled over kMassPer; skipping the empty steps took the kernel from
    // ~41 to ~36 us at B = 1, 8K (H100, ncu).
    const int kn = int((count + kMassThreads - 1) / kMassThreads);
    float sc[kMassPer];
    uint32_t tk[kMassPer];  // tokens of a candidate (0: mandatory or absent)
    uint32_t mand = 0, cand_tokens = 0;
#pragma unroll
    for (int k = 0; k < kMassPer; ++k) {
        if (k >= kn) break;
        sc[k] = 0.0f, tk[k] = 0;
        if (at(k) >= count) continue;
        const DevPage pg = cands[at(k)];
        const uint32_t n = uint32_t(pg.end) - pg.begin;
        if (pg.flags & IKV_PAGE_MANDATORY) {
            mand += n;
        } else {
            if (fused_rows == 0) sc[k] = scores[at(k)];
            tk[k] = n;
            cand_tokens += n;
        }
    }
    // fused_rows > 0 (IKV_TOPK_SCORE_HYBRID, no feedback prior): the hybrid
    // combine happens here, as hybrid_combine_kernel does it, and the scores are
    // written for the select kernel: one kernel boundary fewer.
    if (fused_rows > 0) {
        __shared__ float part[kMaxFusedRows][32];
        const float *rows = p.rows + (uint64_t(seq) * Hkv + head) * fused_rows * p.max_candidates;
        const float mem_off = hybrid_mem_offset(p, uint64_t(seq) * Hkv + head);
        float m[kMaxFusedRows];
#pragma unroll
        for (uint32_t g = 0; g < kMaxFusedRows; ++g) {
            m[g] = -INFINITY;
#pragma unroll
            for (int k = 0; k < kMassPer; ++k)
                if (k < kn && g < fused_rows && tk[k] != 0) m[g] = fmaxf(m[g], rows[uint64_t(g) * p.max_candidates + at(k)]);
        }
        block_row_max(m, fused_rows, part);
#pragma unroll
        for (int k = 0; k < kMassPer; ++k) {
            if (k >= kn) break;
            if (at(k) >= count) continue;
            sc[k] = tk[k] == 0 ? -INFINITY
                               : hybrid_score(rows, p.max_candidates, at(k), fused_rows, p.n_q_heads / Hkv, mem_off,
                                              [&](uint32_t g) { return part[g][0]; });
            scores[at(k)] = sc[k];
        }
    }
    float top = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMassPer; ++k)
        if (k < kn && tk[k] != 0) top = fmaxf(top, sc[k]);  // NaN never wins
    auto usum_op = [](uint32_t a, uint32_t b) { return a + b; };
    top = block_reduce(top, fmax_sh, [](float a, float b) { return fmaxf(a, b); });
    mand = block_reduce(mand, usum, usum_op);
    cand_tokens = block_reduce(cand_tokens, usum, usum_op);
    const bool inf_top = isinf(top) && top > 0;
    // Each candidate's weight, as decode/selection.cpp's mass_budget computes it
    // (also kept in p.weights for the tie walk below).
    double *weights = p.weights + (uint64_t(seq) * Hkv + head) * p.max_candidates;
    double wt[kMassPer];
    double w = 0.0;
#pragma unroll
    for (int k = 0; k < kMassPer; ++k) {
        if (k >= kn) break;
        const float s = sc[k];
        double wc = 0.0;
        if (tk[k] == 0 || s != s || top == -INFINITY) wc = 0.0;
        else if (inf_top) wc = s == top ? double(tk[k]) : 0.0;
        else wc = double(tk[k]) * exp(double(p.scale) * (double(s) - double(top)));
        wt[k] = wc;
        if (at(k) < count) weights[at(k)] = wc;
        w += wc;
    }
    auto add = [](double a, double b) { return a + b; };
    const double target = double(p.mass_share) * block_reduce(w, dsum, add);
    uint64_t taken = 0;
    if (target > 0.0) {
        // K by radix select on the key, 8 bits a pass (4 passes; a bisection took 32
        // block reductions): each pass adds the weights of the candidates under the
        // digits fixed so far into 256 bins and fixes the first digit whose bins,
        // with everything below, reach the target. The weights are summed as
        // fixed-point integers (w * 2^S, S chosen so that the candidates' tokens,
        // which bound the total, stay below 2^63): integer sums do not depend on
        // the order the atomics land in, so a replay selects what the eager call
        // selected.
        __shared__ unsigned long long hist[256];
        __shared__ uint32_t prefix_sh;
        __shared__ unsigned long long below_sh;
        uint32_t key[kMassPer];
#pragma unroll
        for (int k = 0; k < kMassPer; ++k) {
            if (k >= kn) break;
            key[k] = order_key(sc[k]);
        }
        // mass_share 1 (cover everything): the CPU stops where its running double
        // sum stops growing, which the exact integer sums do not see (they count
        // weights ~1e-16 of the top that doubles drop, and drop below 2^-S ones that
        // doubles keep); there K comes from a bisection on double sums, as before
        // the radix select (32 block reductions, for this one setting).
        const bool cover_all = p.mass_share >= 1.0f;
        uint32_t lo = 1;
        if (cover_all) {
            uint32_t hi = 0xFFFFFFFEu;  // the answer lies in [lo, hi]: all finite keys reach the total
            while (lo < hi) {
                const uint32_t mid = lo + (hi - lo) / 2;
                double sum = 0.0;
#pragma unroll
                for (int k = 0; k < kMassPer; ++k) {
                    if (k >= kn) break;
                    if (tk[k] != 0 && key[k] <= mid) sum += weights[at(k)];
                }
                if (block_reduce(sum, dsum, add) >= target) hi = mid;
                else lo = mid + 1;
            }
        } else {
            const int S = 63 - (64 - __clzll((unsigned long long)cand_tokens + 1));
            unsigned long long fq[kMassPer];
            unsigned long long total_q = 0;
#pragma unroll
            for (int k = 0; k < kMassPer; ++k) {
                if (k >= kn) break;
                fq[k] = tk[k] ? (unsigned long long)(ldexp(wt[k], S)) : 0ull;
                total_q += fq[k];
            }
            total_q = block_reduce(total_q, reinterpret_cast<unsigned long long *>(dsum),
                                   [](unsigned long long a, unsigned long long b) { return a + b; });
            const double tq = ceil(double(p.mass_share) * double(total_q));
            const unsigned long long target_q = tq >= double(total_q) ? total_q : (unsigned long long)tq;
            if (tid == 0) prefix_sh = 0, below_sh = 0;
            for (int shift = 24; shift >= 0; shift -= 8) {
                __syncthreads();  // the last pass's bins are read, its prefix_sh and below_sh written
                for (uint32_t i = tid; i < 256; i += kMassThreads) hist[i] = 0;
                __syncthreads();  // bins cleared
                const uint32_t prefix = prefix_sh;
                // A warp whose candidates all fall into one bin (the first pass, mostly:
                // one step's scores share their top bits) adds them up and makes one
                // shared-memory atomic; 32 atomics on one address serialize (the
                // select kernel below does the same with its token counts).
#pragma unroll
                for (int k = 0; k < kMassPer; ++k) {
                    if (k >= kn) break;
                    const bool under = shift == 24 || (key[k] >> (shift + 8)) == (prefix >> (shift + 8));
                    const uint32_t bin = under && tk[k] != 0 ? (key[k] >> shift) & 255u : 256u;
                    if (__match_any_sync(0xFFFFFFFFu, bin) == 0xFFFFFFFFu) {  // warp-uniform
                        if (bin < 256) {
                            unsigned long long v = fq[k];
                            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                            if (lane == 0) atomicAdd(&hist[bin], v);
                        }
                    } else if (bin < 256) {
                        atomicAdd(&hist[bin], fq[k]);
                    }
                }
                __syncthreads();
                if (warp == 0) {  // the first bin whose running sum reaches the target
                    unsigned long long mine = 0;
                    for (int k = 0; k < 8; ++k) mine += hist[8 * lane + k];
                    unsigned long long scan = mine;  // inclusive over the lanes
                    for (int o = 1; o < 32; o <<= 1) {
                        const unsigned long long n = __shfl_up_sync(0xFFFFFFFFu, scan, o);
                        if (lane >= uint32_t(o)) scan += n;
                    }
                    unsigned long long run = below_sh + (scan - mine);
                    int bin = -1;
                    unsigned long long before = 0;
                    for (int k = 0; k < 8 && bin < 0; ++k) {
                        before = run;
                        run += hist[8 * lane + k];
                        if (run >= target_q) bin = 8 * int(lane) + k;
                    }
                    const uint32_t found = __ballot_sync(0xFFFFFFFFu, bin >= 0);
                    const int first = found ? __ffs(found) - 1 : 31;
                    const int b = __shfl_sync(0xFFFFFFFFu, found ? bin : 255, first);
                    const unsigned long long bb = __shfl_sync(0xFFFFFFFFu, before, first);
                    if (lane == 0) {
                        prefix_sh = prefix | (uint32_t(b) << shift);
                        if (found) below_sh = bb;  // else (never: the keys' bins reach the total) the last bin
                    }
                }
            }
            __syncthreads();
            lo = prefix_sh;
            if (lo == 0) lo = 1;  // keys start at 1 (order_key)
        }
        // Keys below K are all taken; K's candidates while the weight before each is short.
        double wb = 0.0;
        uint32_t t = 0;
#pragma unroll
        for (int k = 0; k < kMassPer; ++k)
            if (k < kn && tk[k] != 0 && key[k] < lo) wb += weights[at(k)], t += tk[k];  // (wt[] is not kept: registers)
        const double before = block_reduce(wb, dsum, add);
        taken = block_reduce(t, usum, usum_op);
        // K's candidates in candidate order while the weight before each is short
        // of the target: an exclusive scan of their weights over the block, in
        // candidate order (at(k) = thread + k * 1024: per k a block scan, carried
        // to the next k), each tie taken iff what precedes it is still short,
        // instead of one warp walking the candidates 32 at a time in turn. k
        // steps without a tie are skipped.
        __shared__ double wscan[32];
        __shared__ double carry_sh;
        double carry = before;
        uint32_t tie_taken = 0;
#pragma unroll
        for (int k = 0; k < kMassPer; ++k) {
            if (k >= kn) break;
            const bool tie = tk[k] != 0 && key[k] == lo;
            if (!__syncthreads_or(tie)) continue;  // block-uniform
            const double wv = tie ? weights[at(k)] : 0.0;
            double incl = wv;  // inclusive scan over the warp
            for (int o = 1; o < 32; o <<= 1) {
                const double n = __shfl_up_sync(0xFFFFFFFFu, incl, o);
                if (lane >= uint32_t(o)) incl += n;
            }
            if (lane == 31) wscan[warp] = incl;
            __syncthreads();
            if (warp == 0) {  // the warps' totals, scanned (exclusive), and the step's total
                const double t = wscan[lane];
                double x = t;
                for (int o = 1; o < 32; o <<= 1) {
                    const double n = __shfl_up_sync(0xFFFFFFFFu, x, o);
                    if (lane >= uint32_t(o)) x += n;
                }
                wscan[lane] = x - t;
                if (lane == 31) carry_sh = x;
            }
            __syncthreads();
            const double excl = carry + wscan[warp] + (incl - wv);
            if (tie && excl < target) tie_taken += tk[k];
            carry += carry_sh;
            __syncthreads();  // wscan and carry_sh are rewritten by the next step
        }
        const uint32_t tie_tokens = block_reduce(tie_taken, usum, usum_op);
        taken += tie_tokens;
    }
    uint64_t budget = std::max<uint64_t>(uint64_t(mand) + taken, p.min_tokens);
    if (p.token_budget > 0) budget = std::min<uint64_t>(budget, p.token_budget);
    if (threadIdx.x == 0) p.budgets[uint64_t(seq) * Hkv + head] = uint32_t(budget);
}

}  // namespace

namespace topk {

cudaError_t launch_mass_budget(const TopkParams &p, uint32_t fused_rows, cudaStream_t stream) {
    return launch_pdl(mass_budget_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kMassThreads), size_t(0), stream, p,
                      fused_rows);
}

}  // namespace topk
}  // namespace cuda
}  // namespace ikv
