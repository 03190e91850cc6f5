// Device-side query-aware page selection (Quest upper bound + top pages
// within a token budget), producing the work lists the decode kernel reads.
// Two launches for Quest bounds, and the hybrid score's and the mass budget's
// where they need them (hybrid_combine_kernel, mass_budget_kernel, below;
// programmatic dependent launch on sm_90+: kernels/launch_pdl.cuh), no
// allocation, no host synchronization (graph capturable):
//   score_mma_kernel  (sm_80+, up to 8 scored rows per kv-head; else
//                  score_kernel, the SIMT version) the upper bound
//                  max_g sum_d max(q_gd*kmin_d, q_gd*kmax_d) from the page's bf16
//                  key summary (query token 0) as a matrix product on tensor
//                  cores, 16 pages per warp tile (kernels/score_mma.cuh);
//   score_kernel   one block per (8*1024/D candidate pages, kv-head, sequence),
//                  D/32 lanes per page (ScoreGeom): the same bound in fp32 FMAs
//                  (the group's q+ and q- staged in shared memory; k_min/k_max
//                  read once with 16-byte loads);
//   select_kernel  one block per (sequence, kv-head), or a cluster of 8 when
//                  there are at most 16 such pairs with > 4096 candidates
//                  each (B = 1 or 2 beyond 64K tokens): a token-weighted radix
//                  select (4 passes of 8 bits over the order key: bound
//                  descending; warp-aggregated histogram, one warp scans
//                  it) finds where the budget runs out, ties at the
//                  boundary are taken in candidate order by a coalesced scan, then
//                  mandatory pages + the selected prefix are compacted in
//                  candidate order. Same rule as the CPU path: mandatory tokens
//                  count first; the first page (in bound order) that does not
//                  fit ends the selection.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "block_reduce.cuh"
#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "load_elem.cuh"
#include "launch_pdl.cuh"
#include "score_mma.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kScoreWarps = 8;
constexpr uint32_t kScoreBlocks = 1024;  // score grid target: ~4 waves of 2 blocks on 132 SMs
// score_mma_kernel's grid target: about one block per SM on 132 SMs
// (ceil(132 / pairs) blocks per (kv-head, sequence), so 192 at B = 8 with 8
// kv-heads), each walking several page groups where there are more (H100,
// B = 8, 32K: the kernel 34.6 us with this target, 37-40.5 us with 264, 528
// or 1024; the top-k step through the API 0.160 ms against 0.168 with 1024;
// bench/RESULTS.md 6z).
constexpr uint32_t kScoreMmaBlocks = 132;
constexpr int kSelectThreads = 1024;
// Score rows per kv-head up to which the one-block select kernel does the hybrid combine itself.
constexpr uint32_t kMaxFusedRows = 8;
constexpr uint32_t kSelectCluster = 8;          // blocks per (sequence, kv-head) when clustered
constexpr uint32_t kSelectClusterMaxHeads = 16;  // clustered up to this many (sequence, kv-head) pairs: one block per SM each
constexpr uint32_t kSelectClusterMinCandidates = 4097;  // ... with more candidates than this (> 64K tokens at page 16)

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

// The offset of a query memory's rows for pair bh = seq * n_kv_heads + head:
// 0 without a memory, the memory's offset where it recalled a turn, -inf where
// it recalled nothing (those rows never win).
__device__ __forceinline__ float hybrid_mem_offset(const TopkParams &p, uint64_t bh) {
    return p.mem_rows == nullptr ? 0.0f : p.mem_ok[bh] ? p.mem_offset : -INFINITY;
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

// IKV_TOPK_SCORE_HYBRID's shift, shared by the kernels that apply it (the
// combine kernel below, and the select and mass kernels where they do the
// combine themselves), as decode/selection.cpp's combine_rows: row g's offset
// is 0 for the current queries, the memory's offset (or -inf where it recalled
// nothing) for a query memory's rows; candidate i's score is the max over the
// rows of (sum - the row's best + offset), a NaN never winning.
template <class Top>
__device__ __forceinline__ float hybrid_score(const float *rows, uint64_t stride, uint32_t i, uint32_t R, uint32_t G,
                                              float mem_off, Top top) {
    float best = -INFINITY;
    for (uint32_t g = 0; g < R; ++g) {
        const float s = rows[uint64_t(g) * stride + i] - top(g) + (g < G ? 0.0f : mem_off);
        if (s > best) best = s;
    }
    return best;
}
// Each of R (<= kMaxFusedRows) rows' maximum over a 1024-thread block, from
// every thread's m[g]: left at part[g][0] ([rows][warps] scratch). Every
// thread calls it; two barriers.
__device__ __forceinline__ void block_row_max(float (&m)[kMaxFusedRows], uint32_t R, float (*part)[32]) {
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (uint32_t g = 0; g < kMaxFusedRows; ++g) {
        for (int o = 16; o > 0; o >>= 1) m[g] = fmaxf(m[g], __shfl_xor_sync(0xFFFFFFFFu, m[g], o));
        if (lane == 0) part[g][warp] = m[g];
    }
    __syncthreads();
    if (warp < R) {
        float t = part[warp][lane];
        for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xFFFFFFFFu, t, o));
        __syncwarp();  // every lane read its word before lane 0 overwrites the first
        if (lane == 0) part[warp][0] = t;
    }
    __syncthreads();
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

__device__ __forceinline__ uint32_t order_key(float score);

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

// Order key of a non-mandatory candidate: ascending key = bound descending.
// 0 is never used (kept free); NaN bounds sort last.
__device__ __forceinline__ uint32_t order_key(float score) {
    if (score != score) return 0xFFFFFFFFu;
    const uint32_t u = f32_bits(score);
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending float order
    const uint32_t k = ~asc;                                            // descending
    return k == 0 ? 1u : k;
}

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

template <int D, bool kHybrid>
cudaError_t launch_score(const TopkParams &p, const MemoryRecall *mem, bool fuse_select, bool fuse_mass,
                         cudaStream_t stream) {
    const uint32_t rows = p.n_q_heads / p.shape.n_kv_heads * (mem ? 2 : 1);  // the group's queries (+ recalled)
    cudaError_t err = cudaSuccess;
    if (mem)
        err = launch_pdl(memory_recall_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kRecallWarps * 32), size_t(0),
                         stream, p, *mem);
    if (err == cudaSuccess) err = launch_score_kernel<D, kHybrid>(p, rows, stream);
    if (err == cudaSuccess && kHybrid && !fuse_select && !fuse_mass)
        err = launch_pdl(hybrid_combine_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kCombineThreads), size_t(0),
                         stream, p);
    if (err == cudaSuccess && p.prior)
        err = launch_pdl(feedback_prior_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kPriorThreads), size_t(0),
                         stream, p);
    if (err == cudaSuccess && p.budgets)
        err = launch_pdl(mass_budget_kernel, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kMassThreads), size_t(0), stream,
                         p, fuse_mass ? rows : 0u);
    return err;
}

template <int D>
cudaError_t launch_score(const TopkParams &p, const MemoryRecall *mem, bool fuse_select, bool fuse_mass,
                         cudaStream_t stream) {
    return p.hybrid ? launch_score<D, true>(p, mem, fuse_select, fuse_mass, stream)
                    : launch_score<D, false>(p, mem, false, false, stream);
}

// The one-block select kernel (fused_rows: see select_kernel).
cudaError_t launch_select(const TopkParams &p, uint32_t npad, uint32_t fused_rows, cudaStream_t stream) {
    const cudaError_t err = allow_select_smem();
    if (err != cudaSuccess) return err;
    return launch_pdl(select_kernel<1>, dim3(p.shape.n_kv_heads, p.n_seqs), dim3(kSelectThreads), size_t(npad * 6),
                      stream, p, npad, fused_rows);
}

}  // namespace

cudaError_t launch_score_topk(const TopkParams &p, const MemoryRecall *mem, cudaStream_t stream) {
    const uint32_t rows = p.n_q_heads / p.shape.n_kv_heads * (mem ? 2 : 1);
    if (p.max_candidates == 0 || p.max_candidates > kMaxTopkCandidates || p.candidates.list_heads != 1 ||
        (p.hybrid && (p.rows == nullptr || rows > kMaxHybridGroup)) ||
        (p.budgets != nullptr && p.weights == nullptr) || ((p.prior != nullptr) != (p.prior_on != nullptr)) ||
        ((mem != nullptr) != (p.mem_rows != nullptr)) || (mem && (p.mem_ok == nullptr || p.n_seqs > kMaxMemorySeqs)))
        return cudaErrorInvalidValue;
    uint32_t npad = 1;
    while (npad < p.max_candidates) npad <<= 1;
    const uint32_t D = p.shape.head_dim;
    const bool clusters = select_on_clusters(p);
    // The one-block select does the hybrid combine itself when nothing reads the
    // scores in between (no feedback prior, no mass budget) and the rows fit.
    const bool fuse = p.hybrid && !clusters && p.prior == nullptr && p.budgets == nullptr && rows <= kMaxFusedRows;
    // ... or, with a mass budget, the mass kernel does it (it reads every score first).
    const bool fuse_mass = p.hybrid && p.prior == nullptr && p.budgets != nullptr && rows <= kMaxFusedRows;
    cudaError_t err = D == 32    ? launch_score<32>(p, mem, fuse, fuse_mass, stream)
                      : D == 64  ? launch_score<64>(p, mem, fuse, fuse_mass, stream)
                      : D == 128 ? launch_score<128>(p, mem, fuse, fuse_mass, stream)
                      : D == 256 ? launch_score<256>(p, mem, fuse, fuse_mass, stream)
                                 : cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    if (clusters) {
        uint32_t share = 1;  // candidates one block of the cluster holds, padded
        while (share < (p.max_candidates + kSelectCluster - 1) / kSelectCluster) share <<= 1;
        return launch_ex(pdl_supported(), kSelectCluster, select_kernel<kSelectCluster>,
                         dim3(p.shape.n_kv_heads * kSelectCluster, p.n_seqs), dim3(kSelectThreads),
                         size_t(share * 6), stream, p, share, 0u);
    }
    return launch_select(p, npad, fuse ? rows : 0u, stream);
}

cudaError_t launch_topk_select(const TopkParams &p, cudaStream_t stream) {
    if (p.max_candidates == 0 || p.max_candidates > kMaxTopkCandidates ||
        p.candidates.list_heads != p.shape.n_kv_heads || p.candidates.stride != p.max_candidates || p.prior != nullptr)
        return cudaErrorInvalidValue;
    uint32_t npad = 1;
    while (npad < p.max_candidates) npad <<= 1;
    return launch_select(p, npad, 0u, stream);
}

}  // namespace cuda
}  // namespace ikv
