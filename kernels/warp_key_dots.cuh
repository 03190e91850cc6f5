// A warp's walk over one list entry's key rows, with the dot products of each
// key row and up to 16 query rows staged in shared memory: the kernels that
// read keys off the decode's hot path to score them (attention feedback,
// IKV_TOPK_SCORE_KEYS' lse kernel) share it.
//
// D/8 lanes per key row (8 channels each, dequant8), 32 / (D/8) key rows at
// once. Each lane's NR partial dots are summed across its row's lanes by
// transposition rather than one butterfly per query row: at each xor step
// while a lane holds more than one value, it keeps half of them (which half
// by its lane bit) and adds its partner's copy of that half, so NR = 4 rows
// at D = 128 take 5 shuffles instead of 16, and afterwards each lane holds
// the totals of max(1, NR / (D/8)) distinct rows (row_of). The softmax work
// that follows a dot then runs once per lane instead of NR times.
#pragma once

#include <atomic>
#include <cstdint>

#include "dequant_rows.cuh"

namespace ikv {
namespace cuda {

template <int D, int NR>
struct WarpKeyDots {
    static_assert(NR >= 1 && NR <= 16 && (NR & (NR - 1)) == 0, "NR: a power of two up to 16");
    static constexpr uint32_t kLanes = D / 8;                          // lanes per key row
    static constexpr uint32_t kRows = 32 / kLanes;                     // key rows at once
    static constexpr uint32_t kOut = NR > kLanes ? NR / kLanes : 1;    // totals a lane holds
    static constexpr uint32_t kSpan = NR >= kLanes ? 1 : kLanes / NR;  // lanes holding the same totals

    // The query row of total i in the lane at channel group c.
    __device__ static uint32_t row_of(uint32_t c, uint32_t i) {
        uint32_t row = i, n = NR;
        for (uint32_t o = kLanes / 2; o > 0 && n > 1; o >>= 1) {
            n >>= 1;
            if (c & o) row += n;
        }
        return row;
    }

    // The first lane of each group holding the same totals (to count a total once).
    __device__ static bool leader(uint32_t c) { return c % kSpan == 0; }

    // x[i] = qs[row_of(c, i)] . key row, qs [NR][D] fp32 (16-byte aligned), k this lane's 8 channels.
    __device__ __forceinline__ static void dots(const float *qs, const float k[8], uint32_t c, float x[kOut]) {
        float v[NR];
#pragma unroll
        for (uint32_t r = 0; r < NR; ++r) {
            const float4 *q4 = reinterpret_cast<const float4 *>(qs + r * D + 8 * c);
            const float4 a = q4[0], b = q4[1];
            float d = a.x * k[0];
            d = fmaf(a.y, k[1], d), d = fmaf(a.z, k[2], d), d = fmaf(a.w, k[3], d);
            d = fmaf(b.x, k[4], d), d = fmaf(b.y, k[5], d), d = fmaf(b.z, k[6], d), d = fmaf(b.w, k[7], d);
            v[r] = d;
        }
        reduce<kLanes / 2, NR>(v, c);
#pragma unroll
        for (uint32_t i = 0; i < kOut; ++i) x[i] = v[i];
    }

   private:
    template <uint32_t O, uint32_t N>
    __device__ __forceinline__ static void reduce(float *v, uint32_t c) {
        if constexpr (O > 0) {
            if constexpr (N > 1) {  // transpose: keep half, add the partner's copy of it
                constexpr uint32_t H = N / 2;
                const bool hi = (c & O) != 0;
#pragma unroll
                for (uint32_t i = 0; i < H; ++i) {
                    const float send = hi ? v[i] : v[i + H], keep = hi ? v[i + H] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
                }
                reduce<O / 2, H>(v, c);
            } else {
                v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], O);
                reduce<O / 2, 1>(v, c);
            }
        }
    }
};

// Every key row of [begin, end) of a sub-page: visit(row, x) per lane with x
// its kOut totals (WarpKeyDots::row_of names their query rows). Every lane of
// the warp must call (lanes past the end join the shuffles and visit nothing).
// (Loading 4 key-row groups before using any, for more loads in flight per
// warp, measured 10-16% slower at B = 1 and 3-4% faster at B >= 8 on the
// H100: not kept; bench/RESULTS.md 6v.)
template <int D, int F, int NR, class Visit>
__device__ __forceinline__ void for_each_key_dot(const uint8_t *sub, uint32_t P, uint32_t begin, uint32_t end,
                                                 const float *qs, uint32_t lane, Visit &&visit) {
    using W = WarpKeyDots<D, NR>;
    const uint32_t c = lane % W::kLanes, slot = lane / W::kLanes;
    for (uint32_t row0 = begin; row0 < end; row0 += W::kRows) {
        const uint32_t row = row0 + slot;
        const bool valid = row < end;
        float k[8];
        if (valid)
            dequant8<D, F, true>(sub, P, row, c, k);
        else
#pragma unroll
            for (int j = 0; j < 8; ++j) k[j] = 0.0f;
        float x[W::kOut];
        W::dots(qs, k, c, x);
        if (valid) visit(row, x);
    }
}

// Ask L2 for the key rows [begin, end) of a sub-page (the entry a warp walks
// next), one 128-byte line per lane at a time. A warp walks an entry one key
// row group at a time with one load in flight per lane, so without it each
// group waits a full DRAM round trip; prefetches hold no registers.
template <int D>
__device__ __forceinline__ void prefetch_key_rows(const uint8_t *sub, ikv_format f, uint32_t begin, uint32_t end,
                                                  uint32_t lane) {
    const uint64_t rb = row_bytes(f, D);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(sub + begin * rb) & ~uintptr_t(127);
    const uintptr_t hi = reinterpret_cast<uintptr_t>(sub + end * rb);
    for (uintptr_t a = lo + 128u * lane; a < hi; a += 32u * 128u)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// The tile of query rows a kernel stages: r rows rounded up to 4, 8 or 16.
inline uint32_t key_dot_tile_rows(uint32_t r) { return r <= 4 ? 4 : r <= 8 ? 8 : 16; }

// Blocks of `kernel` one SM keeps resident, remembered in `cache` once the
// occupancy query succeeds (a failed query is asked again on the next
// launch, and counts as 1 meanwhile). One cache per kernel: the launchers'
// function-local statics.
template <class Kernel>
int resident_blocks(std::atomic<int> &cache, Kernel kernel, uint32_t threads, size_t smem) {
    int n = cache.load(std::memory_order_relaxed);
    if (n > 0) return n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, int(threads), smem) == cudaSuccess && n > 0) {
        cache.store(n, std::memory_order_relaxed);
        return n;
    }
    (void)cudaGetLastError();  // leave no sticky error from a failed query
    return 1;
}

// Blocks per list for a kernel whose blocks stage their query rows once and
// walk entries warps_per_block apart: one wave, the `resident` blocks per SM
// shared among all `lists`, and no more than the longest list (`stride`
// entries) needs. A grid of a fixed 8 blocks per SM ran as a full wave and a
// partial one where registers allow 6 (bench/RESULTS.md 6v). n_sms 0: assume
// 132.
inline uint32_t key_walk_blocks(int resident, uint32_t stride, uint32_t warps_per_block, uint32_t lists, int n_sms) {
    const uint64_t want = uint64_t(n_sms > 0 ? n_sms : 132) * uint64_t(resident) / (lists ? lists : 1);
    const uint64_t most = (uint64_t(stride) + warps_per_block - 1) / warps_per_block;
    return uint32_t(want < 1 ? 1 : want < most ? want : most < 1 ? 1 : most);
}

}  // namespace cuda
}  // namespace ikv
