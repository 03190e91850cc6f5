// Page scores on tensor cores: one warp scores 16 candidate pages at once
// with mma.sync m16n8k16 (bf16 operands, fp32 accumulation), for the score
// kernel of kernels/score_pages.cu (score_mma_kernel) on sm_80+.
//
// Why: the SIMT score kernel spends ~600 instructions per warp on 8 pages'
// bounds at head_dim 128 (bf16 widening, two FMAs per channel and query head,
// shuffles, shared-memory reads of q) and reached 49% of DRAM bandwidth at
// B = 8, 32K (bench/RESULTS.md 1f). A page's Quest bound is a dot product,
// sum_d q+_d kmax_d + q-_d kmin_d, and the hybrid score adds q_d kmean_d: with
// the record [kmin | kmax (| kmean)] as a row of A (pages are M) and the
// query parts [q- | q+ (| q)] as a column of B (query rows are N), the whole
// record is one matrix product, 16 pages x 16 channels per instruction.
//
// Precision: the records are bf16 already (exact operands). A query value x
// is split into three bf16 parts, hi = bf16(x), mid = bf16(x - hi), lo =
// bf16(x - hi - mid), whose sum is x itself where the parts stay normal (8
// significant bits each), the query an fp32 kernel reads; the products are
// exact and the tensor cores accumulate them at about fp32 precision (their
// rounding is not IEEE's: within 5e-7 of the score's magnitude against
// float64 in gpu_decode_check, the SIMT kernel 1.4e-7). Two parts leave 2^-16
// of each value out (~2e-6 of the magnitude: enough to flip near-ties between
// the CPU's and the GPU's selections). The parts are
// separate B columns, so one instruction serves them together: column
// part * RW + r holds that part of query row r (RW = 4: two n-tiles of 8
// columns, the last 4 zero; RW = 8: three), summed after the products.
//
// Channel order: the k index of A and B runs over the record's channels in
// the permuted order of tc::kchan (decode_mma.cuh), so that a lane's four
// values of two k-steps are 8 contiguous channels: one 16-byte load per page
// row and 32-channel block, one 16-byte shared-memory load of B.
#pragma once

#include <stdint.h>

#include "common/quant.hpp"
#include "decode_mma.cuh"

namespace ikv {
namespace cuda {
namespace score_tc {

constexpr int kTilePages = 16;  // pages per warp tile (the MMA's M)

// RW: query rows per part, 4 (up to 4 rows: one n-tile) or 8 (two n-tiles).
template <int D, bool kHybrid, int RW>
struct TileGeom {
    static_assert(D % 32 == 0 && (RW == 4 || RW == 8), "32-channel blocks; 4 or 8 rows");
    static constexpr int kParts = kHybrid ? 3 : 2;
    static constexpr int kK = kParts * D;      // channels of a record that are scored
    static constexpr int kBlocks = kK / 32;    // 32-channel blocks: one 16-byte load per lane and page row
    static constexpr int kSplit = 3;                    // bf16 parts of each query value
    static constexpr int kNTiles = (kSplit * RW + 7) / 8;
    // Bytes per staged column of B: the two columns a quarter warp reads at
    // once (groupID 2i and 2i+1) then cover all 32 banks.
    static constexpr int kRowBytes = 2 * kK + ((2 * kK) % 128 == 0 ? 64 : 0);
    static constexpr int kSmemBytes = kNTiles * 8 * kRowBytes;
};

// x as hi + mid + lo, all bf16: hi the nearest bf16 (toward zero where that
// would overflow a finite x), mid and lo the nearest bf16 of what remains
// (each remainder exact in fp32); hi + mid + lo == x where the parts stay
// normal. NaN/inf: hi = x, mid = lo = 0.
IKV_HD void split_bf16(float x, uint16_t (&part)[3]) {
    const bool finite = (f32_bits(x) & 0x7FFFFFFFu) < 0x7F800000u;
    uint16_t hi = f32_to_bf16(x);
    if ((hi & 0x7FFFu) == 0x7F80u && finite) hi = uint16_t(f32_bits(x) >> 16);
    part[0] = hi, part[1] = part[2] = 0;
    if (!finite) return;
    const float r1 = x - bf16_to_f32(hi);
    part[1] = f32_to_bf16(r1);
    part[2] = f32_to_bf16(r1 - bf16_to_f32(part[1]));
}

// Stage B in shared memory (qsm, TileGeom::kSmemBytes, 16-byte aligned):
// query row r < R is value(r, d) for channel d (the caller's fp32 query,
// already scaled), as the parts [min(x, 0) | max(x, 0) (| x)] in record order,
// its split part sp in column sp * RW + r; rows R..RW-1 and the columns past
// kSplit * RW are zero. Thread `tid` of `nthreads` stages its share; the
// caller synchronizes before tile_scores reads it.
template <int D, bool kHybrid, int RW, class Value>
__device__ __forceinline__ void stage_rows(uint8_t *qsm, uint32_t R, const Value &value, int tid, int nthreads) {
    using T = TileGeom<D, kHybrid, RW>;
    for (int e = tid; e < RW * T::kK; e += nthreads) {
        const int r = e / T::kK, k = e % T::kK, part = k / D, d = k % D;
        const float x = uint32_t(r) < R ? value(uint32_t(r), uint32_t(d)) : 0.0f;
        const float v = part == 0 ? fminf(x, 0.0f) : part == 1 ? fmaxf(x, 0.0f) : x;
        uint16_t sp[3];
        split_bf16(v, sp);
        for (int i = 0; i < T::kSplit; ++i) reinterpret_cast<uint16_t *>(qsm + (i * RW + r) * T::kRowBytes)[k] = sp[i];
    }
    for (int e = tid; e < (T::kNTiles * 8 - T::kSplit * RW) * T::kK; e += nthreads)  // unused columns
        reinterpret_cast<uint16_t *>(qsm + (T::kSplit * RW + e / T::kK) * T::kRowBytes)[e % T::kK] = 0;
}

// The first of the two query rows whose scores `lane` holds after tile_scores.
template <int RW>
__device__ __forceinline__ int tile_row0(int lane) {
    return RW == 8 ? 2 * (lane & 3) : 2 * (lane & 1);
}

// A lane's vectors of record blocks [kFirst, kFirst + kCount) of the tile's
// two page rows: a[i] of page groupID (= lane / 4), b[i] of page groupID + 8.
template <int kFirst, int kCount>
struct TileSlice {
    uint4 a[kCount], b[kCount];
};

// Issue the loads of a slice: page groupID's record rec0, page groupID + 8's
// rec1 (16-byte aligned bf16 records; nullptr: no page, loaded as zeros).
template <int kFirst, int kCount>
__device__ __forceinline__ void load_slice(const uint4 *rec0, const uint4 *rec1, int lane, TileSlice<kFirst, kCount> &x) {
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
        x.a[i] = rec0 ? rec0[(kFirst + i) * 4 + t] : make_uint4(0, 0, 0, 0);
        x.b[i] = rec1 ? rec1[(kFirst + i) * 4 + t] : make_uint4(0, 0, 0, 0);
    }
}

// acc[n] += the slice's products with n-tile n of the staged query columns.
template <int D, bool kHybrid, int RW, int kFirst, int kCount>
__device__ __forceinline__ void mma_slice(const uint8_t *qsm, const TileSlice<kFirst, kCount> &x, int lane,
                                          float (&acc)[TileGeom<D, kHybrid, RW>::kNTiles][4]) {
    using T = TileGeom<D, kHybrid, RW>;
    const int gid = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < kCount; ++i)
#pragma unroll
        for (int n = 0; n < T::kNTiles; ++n) {
            const uint4 q = *reinterpret_cast<const uint4 *>(qsm + (n * 8 + gid) * T::kRowBytes + (kFirst + i) * 64 + 16 * t);
            tc::mma<true>(acc[n], x.a[i].x, x.b[i].x, x.a[i].y, x.b[i].y, q.x, q.y);  // k-step 2(kFirst+i)
            tc::mma<true>(acc[n], x.a[i].z, x.b[i].z, x.a[i].w, x.b[i].w, q.z, q.w);  // k-step 2(kFirst+i)+1
        }
}

// The scores from the accumulators (every lane calls it): s[0], s[1] are rows
// tile_row0(lane) and +1 of page groupID, s[2], s[3] the same rows of page
// groupID + 8. With RW = 4 lanes 4i+t and 4i+(t^2) hold the same rows (the
// same sum, (lo + hi) + mid; with RW = 8 (lo + mid) + hi).
template <int D, bool kHybrid, int RW>
__device__ __forceinline__ void finish_scores(const float (&acc)[TileGeom<D, kHybrid, RW>::kNTiles][4], int lane,
                                              float (&s)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if constexpr (RW == 8) {
            s[e] = (acc[2][e] + acc[1][e]) + acc[0][e];  // n-tiles 0, 1, 2: hi, mid, lo of rows 2t, 2t+1
        } else {
            // n-tile 0: lanes t < 2 hi of rows 2t, 2t+1, t >= 2 mid of rows 2(t-2)..; n-tile 1: t < 2 lo, t >= 2 zero.
            const float x = acc[1][e] + acc[0][e];  // t < 2: lo + hi, t >= 2: mid
            const float y = __shfl_xor_sync(0xFFFFFFFFu, x, 2);
            s[e] = (lane & 2) ? x + y : y + x;  // (lo + hi) + mid in both lanes (t < 2: x = lo + hi)
        }
    }
}

// Scores of the warp's tile (page groupID has record rec0, groupID + 8 rec1;
// see load_slice and finish_scores), loaded and multiplied in slices of up
// to 12 blocks. Every lane calls it.
template <int D, bool kHybrid, int RW, int kFirst = 0>
__device__ __forceinline__ void tile_scores_from(const uint8_t *qsm, const uint4 *rec0, const uint4 *rec1, int lane,
                                                 float (&acc)[TileGeom<D, kHybrid, RW>::kNTiles][4]) {
    using T = TileGeom<D, kHybrid, RW>;
    constexpr int kCount = T::kBlocks - kFirst < 12 ? T::kBlocks - kFirst : 12;
    TileSlice<kFirst, kCount> x;  // all of the slice's loads in flight before its products
    load_slice(rec0, rec1, lane, x);
    mma_slice<D, kHybrid, RW>(qsm, x, lane, acc);
    if constexpr (kFirst + kCount < T::kBlocks) tile_scores_from<D, kHybrid, RW, kFirst + kCount>(qsm, rec0, rec1, lane, acc);
}
template <int D, bool kHybrid, int RW>
__device__ __forceinline__ void tile_scores(const uint8_t *qsm, const uint4 *rec0, const uint4 *rec1, int lane,
                                            float (&s)[4]) {
    float acc[TileGeom<D, kHybrid, RW>::kNTiles][4] = {};
    tile_scores_from<D, kHybrid, RW>(qsm, rec0, rec1, lane, acc);
    finish_scores<D, kHybrid, RW>(acc, lane, s);
}

}  // namespace score_tc
}  // namespace cuda
}  // namespace ikv
