// Page scores for query-aware selection (the first stage of
// kernels/score_topk.cu): a query memory's recall, the Quest bound or the
// hybrid score of every candidate page (score_mma_kernel on tensor cores,
// score_kernel in fp32 FMAs), the hybrid shift where the next stage does not
// fuse it, and the attention-feedback prior.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "block_reduce.cuh"
#include "head_dims.cuh"
#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "load_elem.cuh"
#include "score_mma.cuh"
#include "topk_shared.cuh"
#include "topk_stages.hpp"

namespace ikv {
namespace cuda {
namespace {

using namespace topk;

constexpr int kScoreWarps = 8;
constexpr uint32_t kScoreBlocks = 1024;  // score grid target: ~4 waves of 2 blocks on 132 SMs
// score_mma_kernel's grid target: about one block per SM on 132 SMs
// (ceil(132 / pairs) blocks per (kv-head, sequence), so 192 at B = 8 with 8
// kv-heads), each walking several page groups where there are more (H100,
// B = 8, 32K: the kernel 34.6 us with this target, 37-40.5 us with 264, 528
// or 1024; the top-k step through the API 0.160 ms against 0.168 with 1024;
// bench/RESULTS.md 6z).
constexpr uint32_t kScoreMmaBlocks = 132;

// Eight bf16 (little-endian pairs in four words) to fp32: a shift or a mask each.
__device__ __forceinline__ void bf16x8_to_f32(uint4 w, float *out) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
}

// Score kernel geometry for head_dim D: D/32 lanes per page, each holding 32
// channels (four 16-byte vectors of k_min and four of k_max), so a warp scores
// 1024/D pages at once with few shuffles (log2(D/32) per query head) and no
// per-channel select: with q+ = max(q, 0) and q- = min(q, 0) staged once per
// block, max(q*kmin, q*kmax) = q+ * kmax + q- * kmin (kmin <= kmax), two FMAs.
// Measured against the alternatives (ncu, B = 32, 128K, bench/RESULTS.md
// section 1e): one warp per page with 4 channels per lane was issue-bound at
// 42% of DRAM bandwidth (767 us); this layout reaches 59% (545 us), bounded by
// the shared-memory reads of q; lanes across channels with q in registers and
// a warp walking 8 pages avoids shared memory but was latency-bound (660 us
// with 4 pages' loads in flight, 903 us with 8 and fewer resident warps);
// D/16 lanes per page with 2 pages per lane (each q read serving two pages)
// ran 578 us, its shared-memory stalls unchanged.
// B = 1, 32K: 10.1 us here, 12.2 us for the register variant.
// D = 32: one lane per page holds the whole record (4 + 4 vectors: 64 bytes
// of k_min, 64 of k_max), no shuffle; a warp scores 32 pages, a block 256.
template <int D>
struct ScoreGeom {
    static_assert(D % 32 == 0 && D >= 32 && D <= 1024, "32 channels per lane");
    static constexpr int kLanes = D / 32;             // lanes per page: 1, 2, 4, 8
    static constexpr int kPagesPerWarp = 32 / kLanes;  // 32, 16, 8, 4 (D = 32, 64, 128, 256)
    static constexpr int kVec = 4;                    // 8-channel vectors per lane (32 channels)
    static constexpr int kPagesPerBlock = kScoreWarps * kPagesPerWarp;
};

// One lane's share of a page's bound record: kVec 16-byte vectors of k_min
// and of k_max (bf16), and of k_mean for the hybrid score (kHybrid).
template <int D, bool kHybrid>
struct BoundSlice {
    uint4 mn[ScoreGeom<D>::kVec], mx[ScoreGeom<D>::kVec], md[kHybrid ? ScoreGeom<D>::kVec : 1];
};

// Issue the loads of lane part j of candidate pg's record (zeros when !active:
// the lane still joins its page's shuffles).
template <int D, bool kHybrid>
__device__ __forceinline__ void load_slice(const TopkParams &p, const DevPage &pg, bool active, uint32_t head,
                                           uint32_t j, BoundSlice<D, kHybrid> &b) {
    using Geo = ScoreGeom<D>;
    if (active) {
        const uint4 *rec = reinterpret_cast<const uint4 *>(
            pg.base + summary_offset(p.shape, ikv_format(pg.format), p.layer, head));
#pragma unroll
        for (int i = 0; i < Geo::kVec; ++i) {
            b.mn[i] = rec[i * Geo::kLanes + j];
            b.mx[i] = rec[D / 8 + i * Geo::kLanes + j];
            if (kHybrid) b.md[i] = rec[2 * D / 8 + i * Geo::kLanes + j];
        }
    } else {
#pragma unroll
        for (int i = 0; i < Geo::kVec; ++i) {
            b.mn[i] = b.mx[i] = make_uint4(0, 0, 0, 0);
            if (kHybrid) b.md[i] = make_uint4(0, 0, 0, 0);
        }
    }
}

// A query memory's recall, one block per (kv-head, sequence), a warp per
// query head of the group: the remembered turn (newest first, an older one
// only when strictly more similar) whose mean has the largest cosine with
// the head's query token 0, in double as on the host
// (query_memory/query_memory.cpp); a zero vector has cosine 0. Writes the
// recalled rows and mem_ok (0: a null block or nothing kept at this layer;
// the rows are then zeros).
constexpr int kRecallWarps = 4;
__global__ void __launch_bounds__(kRecallWarps * 32) memory_recall_kernel(const TopkParams p, const MemoryRecall m) {
    const uint32_t head = blockIdx.x, seq = blockIdx.y, Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    const uint32_t D = p.shape.head_dim, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint64_t bh = uint64_t(seq) * Hkv + head;
    pdl_wait();  // q comes from earlier work; mem_rows may still be read by the last step's score kernel
    pdl_launch_dependents();
    const uint8_t *block = m.blocks[seq];
    const uint32_t *hdr = reinterpret_cast<const uint32_t *>(block);
    const uint32_t filled = block ? min(hdr[2 * p.layer], m.slots) : 0, next = block ? hdr[2 * p.layer + 1] % m.slots : 0;
    if (threadIdx.x == 0) p.mem_ok[bh] = filled > 0 ? 1u : 0u;
    const uint64_t row = uint64_t(p.n_q_heads) * D;
    const float *slots = block ? reinterpret_cast<const float *>(block + mem_block_header_bytes(m.n_layers)) +
                                     uint64_t(p.layer) * m.slots * row
                               : nullptr;
    for (uint32_t g = warp; g < G; g += kRecallWarps) {
        const uint32_t hq = head * G + g;
        const uint64_t q0 = (uint64_t(seq) * p.n_query_tokens * p.n_q_heads + hq) * D;
        float *out = p.mem_rows + (bh * G + g) * D;
        const float *best = nullptr;
        double best_cos = 0.0;
        for (uint32_t age = 0; age < filled; ++age) {
            const float *mm = slots + uint64_t((next + m.slots - 1 - age) % m.slots) * row + uint64_t(hq) * D;
            double ab = 0.0, aa = 0.0, bb = 0.0;
            for (uint32_t d = lane; d < D; d += 32) {
                // The query as the CPU path holds it (scaled, in float): the same cosines.
                const double a = load_elem(p.q, p.q_dtype, q0 + d) * p.scale, b = mm[d];
                ab += a * b, aa += a * a, bb += b * b;
            }
            for (int o = 16; o > 0; o >>= 1) {
                ab += __shfl_xor_sync(0xFFFFFFFFu, ab, o);
                aa += __shfl_xor_sync(0xFFFFFFFFu, aa, o);
                bb += __shfl_xor_sync(0xFFFFFFFFu, bb, o);
            }
            const double c = aa > 0.0 && bb > 0.0 ? ab / sqrt(aa * bb) : 0.0;
            if (best == nullptr || c > best_cos) best = mm, best_cos = c;
        }
        for (uint32_t d = lane; d < D; d += 32) out[d] = best ? best[d] : 0.0f;
    }
}

// Scored row r's value at channel d for kv-head `head` of sequence `seq`
// (group size G): rows 0..G-1 are the group's query token 0, rows G..2G-1
// the query memory's recalled rows; unscaled (the kernels apply their own factor).
__device__ __forceinline__ float scored_row_value(const TopkParams &p, uint32_t seq, uint32_t head, uint32_t G,
                                                  uint32_t r, uint32_t d) {
    const uint32_t D = p.shape.head_dim;
    const uint64_t bh = uint64_t(seq) * p.shape.n_kv_heads + head;
    return r < G ? load_elem(p.q, p.q_dtype, (uint64_t(seq) * p.n_query_tokens * p.n_q_heads + head * G + r) * D + d)
                 : p.mem_rows[(bh * G + (r - G)) * D + d];
}

// Each block walks page groups blockIdx.x, + gridDim.x, ... of its (kv-head,
// sequence) and keeps the NEXT group's record loads in flight while it
// computes the current one (the candidate entry two groups ahead). Why: with
// one group per block (until 2026-11-24) a warp loaded its 4 KB, waited, then
// computed ~600 instructions with nothing in flight; ncu at B = 32, 128K
// showed 16 resident warps per SM (100 registers) issuing 0.30 per scheduler
// cycle and DRAM at 59%. The q staging is also paid once per block now.
// kHybrid (IKV_TOPK_SCORE_HYBRID): the query is staged halved with a third
// part, q/2 against k_mean, and each head's sum goes to p.rows (the shift
// that makes the score happens in the select or mass kernel, or in
// hybrid_combine_kernel: launch_score_topk).
template <int D, bool kHybrid>
__global__ void __launch_bounds__(kScoreWarps * 32, 2) score_kernel(const TopkParams p) {
    using Geo = ScoreGeom<D>;
    constexpr uint32_t kParts = kHybrid ? 3 : 2;
    extern __shared__ __align__(16) float qs[];  // [R][kParts][D]: q+ then q- (then q) of each scored row
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t j = lane % Geo::kLanes;  // the lane's part of its page
    const uint32_t head = blockIdx.y, seq = blockIdx.z;
    const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    // Rows: the group's query token 0, then with a query memory each head's recalled query.
    const uint32_t R = p.mem_rows ? 2 * G : G;
    const uint32_t in_group = warp * Geo::kPagesPerWarp + lane / Geo::kLanes;  // the lane's page in a group
    pdl_wait();  // q and the candidate lists come from earlier work (kernels/launch_pdl.cuh)
    pdl_launch_dependents();
    const uint32_t count = p.candidates.counts[seq];
    const DevPage *cands = p.candidates.pages + uint64_t(seq) * p.candidates.stride;
    auto cand = [&](uint32_t grp) { return grp * Geo::kPagesPerBlock + in_group; };
    auto entry = [&](uint32_t grp) { return cand(grp) < count ? cands[cand(grp)] : DevPage{}; };

    // The first group's bounds go out before the query is staged. Vector i of
    // lane j is the record's vector i*kLanes + j: a page's lanes read
    // 16*kLanes contiguous bytes per load.
    uint32_t grp = blockIdx.x;
    BoundSlice<D, kHybrid> cur;
    load_slice<D, kHybrid>(p, entry(grp), cand(grp) < count, head, j, cur);
    DevPage next = entry(grp + gridDim.x);
    const float half = kHybrid ? 0.5f : 1.0f;
    const uint64_t bh = uint64_t(seq) * Hkv + head;
    const float mem_off = hybrid_mem_offset(p, bh);
    for (uint32_t e = threadIdx.x; e < R * D; e += blockDim.x) {
        const uint32_t g = e / D, d = e % D;
        const float x = scored_row_value(p, seq, head, G, g, d) * half;
        qs[g * kParts * D + d] = fmaxf(x, 0.0f);
        qs[g * kParts * D + D + d] = fminf(x, 0.0f);
        if (kHybrid) qs[g * kParts * D + 2 * D + d] = x;
    }
    __syncthreads();
    for (; grp * Geo::kPagesPerBlock < count; grp += gridDim.x) {  // uniform over the block
        const uint32_t c = cand(grp), gn = grp + gridDim.x;
        BoundSlice<D, kHybrid> nxt;
        load_slice<D, kHybrid>(p, next, cand(gn) < count, head, j, nxt);
        next = entry(gn + gridDim.x);
        float lo[Geo::kVec * 8], hi[Geo::kVec * 8], mid[kHybrid ? Geo::kVec * 8 : 1];
#pragma unroll
        for (int i = 0; i < Geo::kVec; ++i) {
            bf16x8_to_f32(cur.mn[i], lo + 8 * i);
            bf16x8_to_f32(cur.mx[i], hi + 8 * i);
            if (kHybrid) bf16x8_to_f32(cur.md[i], mid + 8 * i);
        }
        float best = -INFINITY;
        for (uint32_t g = 0; g < R; ++g) {
            const float *qp = qs + g * kParts * D, *qn = qp + D;
            float acc[Geo::kVec];
#pragma unroll
            for (int i = 0; i < Geo::kVec; ++i) {
                const uint32_t ch = (i * Geo::kLanes + j) * 8;
                const float4 p0 = *reinterpret_cast<const float4 *>(qp + ch), p1 = *reinterpret_cast<const float4 *>(qp + ch + 4);
                const float4 n0 = *reinterpret_cast<const float4 *>(qn + ch), n1 = *reinterpret_cast<const float4 *>(qn + ch + 4);
                const float *h = hi + 8 * i, *l = lo + 8 * i;
                float a = p0.x * h[0];
                a = fmaf(p0.y, h[1], a), a = fmaf(p0.z, h[2], a), a = fmaf(p0.w, h[3], a);
                a = fmaf(p1.x, h[4], a), a = fmaf(p1.y, h[5], a), a = fmaf(p1.z, h[6], a), a = fmaf(p1.w, h[7], a);
                a = fmaf(n0.x, l[0], a), a = fmaf(n0.y, l[1], a), a = fmaf(n0.z, l[2], a), a = fmaf(n0.w, l[3], a);
                a = fmaf(n1.x, l[4], a), a = fmaf(n1.y, l[5], a), a = fmaf(n1.z, l[6], a), a = fmaf(n1.w, l[7], a);
                if (kHybrid) {
                    const float4 m0 = *reinterpret_cast<const float4 *>(qn + D + ch);
                    const float4 m1 = *reinterpret_cast<const float4 *>(qn + D + ch + 4);
                    const float *m = mid + 8 * i;
                    a = fmaf(m0.x, m[0], a), a = fmaf(m0.y, m[1], a), a = fmaf(m0.z, m[2], a), a = fmaf(m0.w, m[3], a);
                    a = fmaf(m1.x, m[4], a), a = fmaf(m1.y, m[5], a), a = fmaf(m1.z, m[6], a), a = fmaf(m1.w, m[7], a);
                }
                acc[i] = a;
            }
            float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
#pragma unroll
            for (int o = Geo::kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
            if (kHybrid && c < count && j == 0) p.rows[(bh * R + g) * p.max_candidates + c] = s;
            best = fmaxf(best, g < G ? s : s + mem_off);
        }
        if (!kHybrid && c < count && j == 0) p.scores[(uint64_t(seq) * Hkv + head) * p.max_candidates + c] = best;
        cur = nxt;
    }
}

// score_kernel on tensor cores (sm_80+, up to 8 scored rows; kernels/score_mma.cuh):
// each warp scores tiles of 16 candidates (a tile's record loads in flight
// together, up to 12 blocks of 32 channels), a block 128 per page group, and walks the groups
// blockIdx.x, + gridDim.x, ... of its (kv-head, sequence) with the next
// group's entries in flight. Writes what score_kernel writes (p.scores, or
// p.rows with kHybrid), within the tolerance of score_mma.cuh's split.
// (Keeping the next group's records in flight too, in a second set of
// registers, measured slower: 38.2 against 34.6 us at B = 8, 32K; the copy
// into the current tile waits for the loads; bench/RESULTS.md 6z.)
template <int D, bool kHybrid, int RW>
__global__ void __launch_bounds__(kScoreWarps * 32, 2) score_mma_kernel(const TopkParams p) {
    constexpr uint32_t kPagesPerBlock = kScoreWarps * score_tc::kTilePages;
    extern __shared__ __align__(16) uint8_t qsm[];  // score_tc::TileGeom<D, kHybrid, RW>::kSmemBytes
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4;
    const uint32_t head = blockIdx.y, seq = blockIdx.z;
    const uint32_t Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    const uint32_t R = p.mem_rows ? 2 * G : G;  // the group's query token 0, then each head's recalled query
    pdl_wait();  // q and the candidate lists come from earlier work (kernels/launch_pdl.cuh)
    pdl_launch_dependents();
    // The count and the first entries are loaded together (entries past the
    // count, within the list's stride, are loaded but never used).
    const uint32_t count = p.candidates.counts[seq];
    const DevPage *cands = p.candidates.pages + uint64_t(seq) * p.candidates.stride;
    auto cand = [&](uint32_t grp, uint32_t upper) { return grp * kPagesPerBlock + warp * score_tc::kTilePages + gid + 8 * upper; };
    auto entry = [&](uint32_t c) { return c < p.candidates.stride ? cands[c] : DevPage{}; };
    auto record = [&](const DevPage &pg, uint32_t c) {
        return c < count ? reinterpret_cast<const uint4 *>(pg.base + summary_offset(p.shape, ikv_format(pg.format), p.layer, head))
                         : nullptr;
    };
    const uint32_t gx = gridDim.x;
    uint32_t grp = blockIdx.x;
    DevPage e0 = entry(cand(grp, 0)), e1 = entry(cand(grp, 1));  // this group's entries
    DevPage n0 = entry(cand(grp + gx, 0)), n1 = entry(cand(grp + gx, 1));  // the next group's
    const uint64_t bh = uint64_t(seq) * Hkv + head;
    const float half = kHybrid ? 0.5f : 1.0f;
    const float mem_off = kHybrid ? 0.0f : hybrid_mem_offset(p, bh);  // Quest: the recalled rows' offset
    score_tc::stage_rows<D, kHybrid, RW>(
        qsm, R, [&](uint32_t r, uint32_t d) { return scored_row_value(p, seq, head, G, r, d) * half; },
        int(threadIdx.x), int(blockDim.x));
    __syncthreads();
    const int row0 = score_tc::tile_row0<RW>(int(lane));
    for (; grp * kPagesPerBlock < count; grp += gx) {  // uniform over the block
        const uint32_t c0 = cand(grp, 0), c1 = cand(grp, 1);
        const uint4 *r0 = record(e0, c0), *r1 = record(e1, c1);
        e0 = n0, e1 = n1;
        n0 = entry(cand(grp + 2 * gx, 0)), n1 = entry(cand(grp + 2 * gx, 1));
        float s[4];
        score_tc::tile_scores<D, kHybrid, RW>(qsm, r0, r1, int(lane), s);
        if constexpr (kHybrid) {
            if (RW == 8 || (lane & 3) < 2)  // with RW = 4 lanes t and t^2 hold the same rows
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const uint32_t r = uint32_t(row0 + (e & 1)), c = e < 2 ? c0 : c1;
                    if (r < R && c < count) p.rows[(bh * R + r) * p.max_candidates + c] = s[e];
                }
        } else {
            float best[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint32_t r = uint32_t(row0 + (e & 1));
                if (r < R) best[e / 2] = fmaxf(best[e / 2], r < G ? s[e] : s[e] + mem_off);
            }
#pragma unroll
            for (int o = 1; o < (RW == 8 ? 4 : 2); o <<= 1)
                for (int h = 0; h < 2; ++h) best[h] = fmaxf(best[h], __shfl_xor_sync(0xFFFFFFFFu, best[h], o));
            float *out = p.scores + bh * p.max_candidates;
            if ((lane & 3) == 0 && c0 < count) out[c0] = best[0];
            if ((lane & 3) == 0 && c1 < count) out[c1] = best[1];
        }
    }
}

// IKV_TOPK_SCORE_HYBRID's shift, one block per (kv-head, sequence): each
// row's largest sum over the non-mandatory candidates (a NaN never wins:
// fmaxf), then score = max_r (rows_r - top_r + offset_r), as
// decode/selection.cpp's combine_rows computes it on the CPU (offset: 0 for
// the current queries, mem_offset or -inf for a query memory's rows).
constexpr int kCombineThreads = 1024;  // one block per (sequence, kv-head): at B = 1 only n_kv_heads blocks
__global__ void __launch_bounds__(kCombineThreads) hybrid_combine_kernel(const TopkParams p) {
    __shared__ float part[kCombineThreads / 32];
    __shared__ float top[kMaxHybridGroup];
    const uint32_t head = blockIdx.x, seq = blockIdx.y, Hkv = p.shape.n_kv_heads, G = p.n_q_heads / Hkv;
    const uint32_t R = p.mem_rows ? 2 * G : G;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t count = p.candidates.counts[seq];
    const DevPage *cands = p.candidates.pages + uint64_t(seq) * p.candidates.stride;
    const uint64_t bh = uint64_t(seq) * Hkv + head;
    const float *rows = p.rows + bh * R * p.max_candidates;
    const float mem_off = hybrid_mem_offset(p, bh);
    for (uint32_t g = 0; g < R; ++g) {
        float m = -INFINITY;
        for (uint32_t c = threadIdx.x; c < count; c += blockDim.x)
            if (!(cands[c].flags & IKV_PAGE_MANDATORY)) m = fmaxf(m, rows[uint64_t(g) * p.max_candidates + c]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = -INFINITY;
            for (int w = 0; w < kCombineThreads / 32; ++w) t = fmaxf(t, part[w]);
            top[g] = t;
        }
        __syncthreads();
    }
    float *scores = p.scores + (uint64_t(seq) * Hkv + head) * p.max_candidates;
    for (uint32_t c = threadIdx.x; c < count; c += blockDim.x)
        scores[c] = cands[c].flags & IKV_PAGE_MANDATORY
                        ? -INFINITY
                        : hybrid_score(rows, p.max_candidates, c, R, G, mem_off, [&](uint32_t g) { return top[g]; });
}

// The attention-feedback prior, one block per (kv-head, sequence) fed back:
// each non-mandatory candidate's score becomes max(score - best, prior) where
// it has a prior (rel alone where not), best the largest non-mandatory score
// (a NaN never wins: fmaxf), with std::max's NaN behaviour, as
// decode/selection.cpp's apply_feedback_prior on the CPU.
constexpr int kPriorThreads = 256;
__global__ void __launch_bounds__(kPriorThreads) feedback_prior_kernel(const TopkParams p) {
    __shared__ float scratch[32];
    const uint32_t head = blockIdx.x, seq = blockIdx.y, Hkv = p.shape.n_kv_heads;
    const uint64_t bh = uint64_t(seq) * Hkv + head;
    pdl_wait();
    pdl_launch_dependents();
    if (!p.prior_on[bh]) return;  // uniform over the block
    const uint32_t count = p.candidates.counts[seq];
    const DevPage *cands = p.candidates.pages + uint64_t(seq) * p.candidates.stride;
    float *scores = p.scores + bh * p.max_candidates;
    const float *prior = p.prior + bh * p.max_candidates;
    float best = -INFINITY;
    for (uint32_t c = threadIdx.x; c < count; c += blockDim.x)
        if (!(cands[c].flags & IKV_PAGE_MANDATORY)) best = fmaxf(best, scores[c]);
    best = block_reduce(best, scratch, [](float a, float b) { return fmaxf(a, b); });
    for (uint32_t c = threadIdx.x; c < count; c += blockDim.x) {
        if (cands[c].flags & IKV_PAGE_MANDATORY) continue;
        const float rel = best > -INFINITY ? scores[c] - best : scores[c];
        const float lw = prior[c];
        scores[c] = lw > -INFINITY && rel < lw ? lw : rel;  // std::max(rel, lw): a NaN rel stays
    }
}

// Whether page scores run on tensor cores (score_mma_kernel): on sm_80+ for
// up to 8 scored rows per kv-head (the group's heads, twice that with a query
// memory), else on score_kernel. IKV_CUDA_SCORE=simt (read once) forces
// score_kernel, so the checks cover both paths; any other value is the default.
bool scores_on_tensor_cores(uint32_t rows) {
    static const bool simt = [] {
        const char *e = std::getenv("IKV_CUDA_SCORE");
        return e != nullptr && std::strcmp(e, "simt") == 0;
    }();
    if (simt || rows > 8) return false;
    static std::atomic<uint64_t> known{0}, yes{0};
    return per_device_flag(known, yes, [](int dev) { return cc_major(dev) >= 8; });
}

// The score grid: about kScoreBlocks blocks in all, so that a block walks
// several page groups with the next one's loads in flight (B >= 8), but never
// fewer than one group each (B = 1 keeps every SM busy).
dim3 score_grid(const TopkParams &p, uint32_t pages_per_block, uint32_t target) {
    const uint32_t groups = (p.max_candidates + pages_per_block - 1) / pages_per_block;
    const uint32_t heads = p.shape.n_kv_heads * p.n_seqs;
    const uint32_t bx = std::max(1u, std::min(groups, (target + heads - 1) / heads));
    return dim3(bx, p.shape.n_kv_heads, p.n_seqs);
}

template <int D, bool kHybrid>
cudaError_t launch_score_kernel(const TopkParams &p, uint32_t rows, cudaStream_t stream) {
    if (scores_on_tensor_cores(rows)) {
        const dim3 grid = score_grid(p, kScoreWarps * score_tc::kTilePages, kScoreMmaBlocks);
        return rows <= 4 ? launch_pdl(score_mma_kernel<D, kHybrid, 4>, grid, dim3(kScoreWarps * 32),
                                      size_t(score_tc::TileGeom<D, kHybrid, 4>::kSmemBytes), stream, p)
                         : launch_pdl(score_mma_kernel<D, kHybrid, 8>, grid, dim3(kScoreWarps * 32),
                                      size_t(score_tc::TileGeom<D, kHybrid, 8>::kSmemBytes), stream, p);
    }
    const int qbytes = int(rows * D * 4 * (kHybrid ? 3 : 2));  // q+, q- (q) of each row
    if (qbytes > 48 * 1024) {  // very wide groups only
        const cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void *>(score_kernel<D, kHybrid>),
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, qbytes);
        if (err != cudaSuccess) return err;
    }
    return launch_pdl(score_kernel<D, kHybrid>, score_grid(p, ScoreGeom<D>::kPagesPerBlock, kScoreBlocks), dim3(kScoreWarps * 32),
                      size_t(qbytes), stream, p);
}


template <int D>
cudaError_t launch_page_scores_d(const TopkParams &p, const MemoryRecall *mem, bool combine, cudaStream_t stream) {
    const uint32_t rows = p.n_q_heads / p.shape.n_kv_heads * (mem ? 2 : 1);  // the group's queries (+ recalled)
    cudaError_t err = cudaSuccess;
    if (mem)
        err = launch_pdl(memory_recall_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kRecallWarps * 32), size_t(0),
                         stream, p, *mem);
    if (err == cudaSuccess)
        err = p.hybrid ? launch_score_kernel<D, true>(p, rows, stream) : launch_score_kernel<D, false>(p, rows, stream);
    if (err == cudaSuccess && p.hybrid && combine)
        err = launch_pdl(hybrid_combine_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kCombineThreads), size_t(0),
                         stream, p);
    if (err == cudaSuccess && p.prior)
        err = launch_pdl(feedback_prior_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kPriorThreads), size_t(0),
                         stream, p);
    return err;
}

}  // namespace

namespace topk {

cudaError_t launch_page_scores(const TopkParams &p, const MemoryRecall *mem, bool combine, cudaStream_t stream) {
    return with_head_dim(p.shape.head_dim,
                         [&](auto d) { return launch_page_scores_d<decltype(d)::value>(p, mem, combine, stream); });
}

}  // namespace topk
}  // namespace cuda
}  // namespace ikv
