// Fused selected-page mixed-precision decode (flash-decoding with split-K).
//
// Grid: x = split (a contiguous slice of the work list, sized from the list's
// own count), y = kv-head x row chunk, z = sequence. 4 warps per CTA; each
// WARP owns a contiguous part of the CTA's slice, in chunks of 16 rows (a page
// of 16, half-used by pages of 8, a piece of larger pages), and streams it
// through its own kStages-deep ring of shared-memory slots with 16-byte
// cp.async copies (only rows inside the page bounds and before the last query
// position; the others are zero-filled without a read) plus the scales its
// format needs. The main loop has no CTA-wide barrier: cp.async.wait_group +
// __syncwarp only; the next work-list entry is loaded one chunk ahead.
//
// Lane mapping (format independent): D/8 lanes per token row, 8 channels each,
// 32/(D/8) rows per warp step (D = 32: 4 lanes per row, 8 rows per step).
// The CTA stages its R query rows (pre-scaled by
// scale*log2(e)) in shared memory once; per chunk a lane loads its 8-channel
// slices into registers with the chunk's K scales folded in (per channel for
// INT8/INT4, per sub-page for FP8; R <= 4), dequantizes its 8 channels of K
// per format (templated, switched once per chunk), and reduces the dots over
// the row's lanes by shuffles (for R = 4 a transposing reduction: 5 shuffles
// instead of 16 at D=128, after which each lane owns one query row's score and
// computes one exp). The online softmax runs in base 2 per query row with a
// warp-uniform max and one rescale check per batch of rows; P.V accumulates
// into R x 8 fp32 registers (V scales folded into the weight per token).
// At the end the warp's row slots are summed by shuffles, the 4 warps are
// merged through shared memory (one barrier), and the CTA writes its split's
// (m, l, acc); the merge kernel does the exact log-sum-exp merge over splits
// and writes out (F32/F16/BF16) and lse. Both launches use programmatic
// dependent launch on sm_90+ (kernels/launch_pdl.cuh), so the merge's CTAs are
// launched while the decode drains. (A merge fused into the last CTA of each
// (sequence, kv-head) was measured slower, bench/RESULTS.md section 1d.)
//
// Occupancy: 2-deep rings (8 KB slots at D=128) and <= 168 registers give 3
// CTAs = 12 warps per SM for the one-token GQA shapes; decode_choose_splits
// asks the occupancy calculator and fills the resident CTA slots.
//
// Templated on head_dim, the row-chunk size R (query rows = tokens x group
// heads per CTA), the compute mode and the page format; one dispatch table.
// Compute modes: the SIMT compute described above (fp32 FMAs), or tensor
// cores for F16/BF16 queries (kernels/decode_mma.cuh: mma.sync m16n8k16,
// 8 or 16 query rows per CTA, the slot's rows stored swizzled), chosen by
// DecodeParams::compute; everything else (ring, lists, split-K, merge) is shared.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "append_f16_rows.cuh"
#include "stage_rows.cuh"
#include "common/quant.hpp"
#include "decode_formats.cuh"
#include "decode_mma.cuh"
#include "ikv_kernels.h"
#include "load_elem.cuh"
#include "launch_pdl.cuh"
#include "room_lists.cuh"

namespace ikv {
namespace cuda {
namespace {

using dec::kChunkRows;

constexpr int kWarps = 4;
constexpr uint32_t kMaxSplits = 8192;  // merge weights in shared memory: 32 KB
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
struct Cfg {
    static constexpr int kLanesPerRow = D / 8;                 // 4, 8, 16, 32 (D = 32, 64, 128, 256)
    static constexpr int kRowsPerStep = 32 / kLanesPerRow;     // 8, 4, 2, 1
    static constexpr int kSteps = kChunkRows / kRowsPerStep;   // 2, 4, 8, 16
    static constexpr int kSlotBytes = kChunkRows * 2 * 2 * D;  // K + V at 2 bytes per value (widest format)
    // Ring depth: 2 (one chunk in flight per warp while it computes another)
    // keeps D <= 128 at 3 CTAs = 12 warps per SM; D = 256 (one CTA) goes 3 deep.
    // D = 32 keeps 2 like D = 64/128: its 2 KB slots are not what limits the
    // CTAs per SM (registers are: they do not depend on D on either path);
    // deeper rings for it were not measured.
    static constexpr int kStages = D >= 256 ? 3 : 2;
    static constexpr int kRingBytes = kStages * kSlotBytes;    // one warp's ring
    // The row's lanes are a power-of-two group of a warp, and the R = 4
    // transposing reduction splits them by two lane bits (kO1, kO2 =
    // kLanesPerRow/2, /4): at least 4 lanes per row, so D >= 32. A 16-row chunk
    // is whole warp steps (kSteps >= 1) at every D up to 256.
    static_assert(kLanesPerRow >= 4 && kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "D/8 lanes per row");
    static_assert(kChunkRows % kRowsPerStep == 0, "whole warp steps per chunk");
    // The slot holds the widest format's rows (F16) and every format's scales
    // (INT8: 16 K+V rows of D bytes + D + 16 floats; INT4: rows of D/2 + 2D +
    // 32G halves); at D = 32: 2048 >= 1216 and 704 bytes.
    static_assert(2 * kChunkRows * D + 4 * (D + kChunkRows) <= kSlotBytes, "INT8 chunk fits a slot");
    static_assert(kChunkRows * D + 2 * (2 * D + 2 * kChunkRows * int((D + 31) / 32)) <= kSlotBytes,
                  "INT4 chunk fits a slot");
};

// What the compute side needs to know about the chunk in a slot.
struct ChunkMeta {
    int r0, r1;    // chunk rows [r0, r1) hold data (r1 <= r0: nothing was copied)
    int format;
    uint32_t pos;  // absolute position of chunk row 0
};

// Shared memory: the warps' rings, the CTA's query rows [R][D] (f32), the slots' metadata.
template <int D, int R>
struct Smem {
    static constexpr int kQOff = kWarps * Cfg<D>::kRingBytes;
    static constexpr int kMetaOff = kQOff + R * D * 4;
    static constexpr int kBytes = kMetaOff + kWarps * Cfg<D>::kStages * int(sizeof(ChunkMeta));
};

// How a CTA computes: fp32 FMAs (F32 queries, or forced), or tensor cores
// with f16 / bf16 operands (F16 / BF16 queries; kernels/decode_mma.cuh).
enum Mode : int { kSimt = 0, kTcF16 = 1, kTcBF16 = 2 };

// CTAs per SM the register budget is sized for (launch bounds): 3 for the
// one-token GQA shapes (SIMT R <= 4, tensor cores R = 8; D <= 128), 2 for
// 16 tensor-core rows at D <= 128, else 1.
template <int D, int R, int kMode>
constexpr int min_blocks() {
    if (D > 128) return 1;
    if (kMode == kSimt) return R <= 4 ? 3 : 1;
    return R <= 8 ? 3 : 2;
}

// 2^x with one MUFU.EX2 (ex2.approx: ~2 ulp; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Per-warp softmax state and the query slices, in registers.
template <int R>
struct WarpState {
    int qpos[R];    // position of the row's query token (-1: padding row, always masked)
    float m[R];     // running max (base-2 domain), identical in every lane
    float l[R];     // sum of weights of this lane's row slot
    float acc[R][8];
};

// One chunk in a slot: scores, online softmax, P.V. Format F, warp-uniform.
// kChunkSum (attention feedback): cl[r] accumulates the lane's part of this
// chunk's softmax sum of row r, rescaled with the running sum, so it ends
// relative to the row's max after the chunk (the caller zeroes it).
template <int D, int R, int F, bool kChunkSum = false>
__device__ __forceinline__ void compute_chunk(const uint8_t *slot, const ChunkMeta mt, const float *Qs, WarpState<R> &w,
                                              int lane, float cap2, float inv_cap2, float *cl = nullptr) {
    using C = Cfg<D>;
    using M = dec::Fmt<D, F>;
    constexpr bool kFold = R <= 4;  // fold per-channel K scales into the query (registers allow it)
    constexpr int kB = R >= 4 ? 4 : 8;  // rows per lane between rescale checks (registers: kB x R scores)
    constexpr int kBatch = C::kSteps < kB ? C::kSteps : kB;
    const int rs = lane / C::kLanesPerRow, d0 = (lane % C::kLanesPerRow) * 8;
    const uint8_t *Kp = slot + d0 * M::kLaneBytes / 8;
    const uint8_t *Vp = Kp + kChunkRows * M::kRowBytes;
    const float *Sc = reinterpret_cast<const float *>(slot + M::kScaleOff);

    // Per-chunk K transform: qk = q * K scale (per channel or per sub-page), INT4 bias q . K min.
    float ks[8], km[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) ks[j] = 1.0f, km[j] = 0.0f;
    if (F == IKV_FMT_FP8_E4M3) {
        const float s = Sc[0];
#pragma unroll
        for (int j = 0; j < 8; ++j) ks[j] = s;
    } else if (F == IKV_FMT_INT8) {
        const float4 a = *reinterpret_cast<const float4 *>(Sc + d0), b = *reinterpret_cast<const float4 *>(Sc + d0 + 4);
        ks[0] = a.x, ks[1] = a.y, ks[2] = a.z, ks[3] = a.w, ks[4] = b.x, ks[5] = b.y, ks[6] = b.z, ks[7] = b.w;
    } else if (F == IKV_FMT_INT4) {  // halves (decode_formats.cuh)
        dec::halves8(slot + M::kScaleOff, d0, ks);
        dec::halves8(slot + M::kScaleOff, M::kInt4KMin + d0, km);
    }
    constexpr bool kScaled = F != IKV_FMT_F16 && F != IKV_FMT_BF16;
    float qk[R][8], kb[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float4 a = *reinterpret_cast<const float4 *>(Qs + r * D + d0),
                     b = *reinterpret_cast<const float4 *>(Qs + r * D + d0 + 4);
        const float q[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        kb[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            qk[r][j] = kScaled && kFold ? q[j] * ks[j] : q[j];
            if (F == IKV_FMT_INT4 && kFold) kb[r] = fmaf(q[j], km[j], kb[r]);
        }
    }
    // V scale per chunk (FP8) or per row (INT8; INT4 per row and 32-channel group).
    const float vs_chunk = F == IKV_FMT_FP8_E4M3 ? Sc[1] : 1.0f;
    const int g = d0 / 32;
    // Transposing reduction (R == 4): lane bits kO1, kO2 of the row's lanes pick the query row rl it ends with.
    constexpr bool kT = R == 4;
    constexpr int kV = kT ? 1 : R;  // scores per lane and row after the reduction
    constexpr int kO1 = C::kLanesPerRow / 2, kO2 = C::kLanesPerRow / 4;
    const bool hb = (lane & kO1) != 0, lb = (lane & kO2) != 0;
    const int rl = (hb ? 2 : 0) + (lb ? 1 : 0);
    int src[4];  // lane of this row slot (and same low bits) holding query row r
#pragma unroll
    for (int r = 0; r < 4; ++r) src[r] = (lane & ~(kO1 | kO2)) | (r & 2 ? kO1 : 0) | (r & 1 ? kO2 : 0);
    const int my_qpos = rl == 0 ? w.qpos[0] : rl == 1 ? w.qpos[1 % R] : rl == 2 ? w.qpos[2 % R] : w.qpos[3 % R];

#pragma unroll
    for (int b0 = 0; b0 < C::kSteps; b0 += kBatch) {
        // Rows of this batch: (b0 .. b0+kBatch-1) * kRowsPerStep + slot; skip a batch with no data (warp-uniform).
        if ((b0 + kBatch) * C::kRowsPerStep <= mt.r0 || b0 * C::kRowsPerStep >= mt.r1) continue;
        float s[kBatch][R];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int row = (b0 + k) * C::kRowsPerStep + rs;
            float x[8];
            dec::raw8<F>(Kp + row * M::kRowBytes, x);
            if (kScaled && !kFold) {
#pragma unroll
                for (int j = 0; j < 8; ++j) x[j] = F == IKV_FMT_INT4 ? fmaf(x[j], ks[j], km[j]) : x[j] * ks[j];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float d = kb[r];
#pragma unroll
                for (int j = 0; j < 8; ++j) d = fmaf(qk[r][j], x[j], d);
                s[k][r] = d;
            }
        }
        // Reduce the dots over the row's lanes. R == 4: a transposing reduction
        // (5 shuffles for D=128 instead of 16) leaves each lane the score of
        // query row rl only; else every lane gets all R scores.
        float sv[kBatch][kV];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            if constexpr (kT) {
                const float send0 = hb ? s[k][0] : s[k][2], send1 = hb ? s[k][1] : s[k][3];
                float keep0 = hb ? s[k][2] : s[k][0], keep1 = hb ? s[k][3] : s[k][1];
                keep0 += __shfl_xor_sync(0xFFFFFFFFu, send0, kO1);
                keep1 += __shfl_xor_sync(0xFFFFFFFFu, send1, kO1);
                float v = (lb ? keep1 : keep0) + __shfl_xor_sync(0xFFFFFFFFu, lb ? keep0 : keep1, kO2);
#pragma unroll
                for (int o = kO2 / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                sv[k][0] = v;
            } else {
#pragma unroll
                for (int r = 0; r < R; ++r) {
#pragma unroll
                    for (int o = C::kLanesPerRow / 2; o > 0; o >>= 1)
                        s[k][r] += __shfl_xor_sync(0xFFFFFFFFu, s[k][r], o);
                    sv[k][r] = s[k][r];
                }
            }
        }
        float mv[kV];
#pragma unroll
        for (int v = 0; v < kV; ++v) mv[v] = -INFINITY;
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int row = (b0 + k) * C::kRowsPerStep + rs;
            const int pos = int(mt.pos) + row;
            const bool valid = row >= mt.r0 && row < mt.r1;
#pragma unroll
            for (int v = 0; v < kV; ++v) {
                float x = sv[k][v];
                if (cap2 > 0.0f) x = (x - x) + cap2 * tanhf(x * inv_cap2);  // x - x: NaN for an infinite logit (a non-finite q)
                x = valid && pos <= (kT ? my_qpos : w.qpos[v]) ? x : -INFINITY;
                sv[k][v] = x;
                mv[v] = fmaxf(mv[v], x);
            }
        }
        float mx[R];
#pragma unroll
        for (int v = 0; v < kV; ++v)
#pragma unroll
            for (int o = C::kLanesPerRow; o < 32; o <<= 1) mv[v] = fmaxf(mv[v], __shfl_xor_sync(0xFFFFFFFFu, mv[v], o));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if constexpr (kT)
                mx[r] = __shfl_sync(0xFFFFFFFFu, mv[0], src[r % 4]);
            else
                mx[r] = mv[r];
        }
        bool grow = false;
#pragma unroll
        for (int r = 0; r < R; ++r) grow |= mx[r] > w.m[r];
        if (grow) {  // warp-uniform: m and mx are the same in every lane
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float mn = fmaxf(w.m[r], mx[r]);
                const float alpha = mn == w.m[r] ? 1.0f : fast_exp2(w.m[r] - mn);  // m = -inf: 0
                w.m[r] = mn;
                w.l[r] *= alpha;
                if constexpr (kChunkSum) cl[r] *= alpha;
#pragma unroll
                for (int j = 0; j < 8; ++j) w.acc[r][j] *= alpha;
            }
        }
        float my_m = w.m[0];
        if constexpr (kT) my_m = rl == 0 ? w.m[0] : rl == 1 ? w.m[1 % R] : rl == 2 ? w.m[2 % R] : w.m[3 % R];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int row = (b0 + k) * C::kRowsPerStep + rs;
            float x[8];
            dec::raw8<F>(Vp + row * M::kRowBytes, x);
            float vs = vs_chunk;
            if (F == IKV_FMT_INT8) vs = Sc[D + row];
            if (F == IKV_FMT_INT4) {
                const float a = dec::half_at(slot + M::kScaleOff, M::kInt4VScale + row * M::kG + g),
                            b = dec::half_at(slot + M::kScaleOff, M::kInt4VMin + row * M::kG + g);
#pragma unroll
                for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], a, b);
            }
            float pr[R];
            if constexpr (kT) {
                const float pl = sv[k][0] == -INFINITY ? 0.0f : fast_exp2(sv[k][0] - my_m);
#pragma unroll
                for (int r = 0; r < R; ++r) pr[r] = __shfl_sync(0xFFFFFFFFu, pl, src[r % 4]);
            } else {
#pragma unroll
                for (int r = 0; r < R; ++r) pr[r] = sv[k][r] == -INFINITY ? 0.0f : fast_exp2(sv[k][r] - w.m[r]);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                w.l[r] += pr[r];
                if constexpr (kChunkSum) cl[r] += pr[r];
                const float pw = pr[r] * vs;
#pragma unroll
                for (int j = 0; j < 8; ++j) w.acc[r][j] = fmaf(pw, x[j], w.acc[r][j]);
            }
        }
    }
}

// A decode that appends its step's token first (FusedAppend, sequences with
// room): the sequence's length once this step's token is in, from the room
// record, and where the token goes. The list holds the room's entries as the
// host listed them, to the room's end (cuda_decode.cpp restores them where a
// clip may have cut them), one entry per page from t.first on: the token's
// page is entry t.first + (old / P - t.page0), the entries a clip at the
// length keeps end at the one of page ceil(len / P) - 1 (the count the CTAs'
// slices are cut from, as for a clipped list: the same split of the work,
// so the same output bits as a decode after separate appends), and rows at
// and past the length are never read. One round trip (the record's fields),
// as a plain decode's (two for a sequence past the first kInlineRoomTails:
// its tail, then the record). (A version that clipped the room's entries here, in a
// loop over them, made every fused step 2.5% slower at B = 1 by its mere
// presence in the kernel: bench/RESULTS.md section 7f.)
struct RoomView {
    uint32_t old_len, len, count;
    uint32_t tail_idx;     // list index of the entry the token lands in (UINT32_MAX: nothing is written)
    float *stage;          // the layer's staging (RoomRecord::stages)
    uint32_t seq_id;       // the sequence (AppendError)
};

// The kernel argument that carries RoomArgs in the fused variants and nothing in the others.
struct NoRoom {};
template <bool kAppend>
using RoomParam = std::conditional_t<kAppend, RoomArgs, NoRoom>;
// The decode kernel's: RoomArgs (a decode that appends), ChunkSums (one with
// attention feedback), or nothing.
template <bool kAppend, bool kFb>
using ExtraParam = std::conditional_t<kAppend, RoomArgs, std::conditional_t<kFb, ChunkSums, NoRoom>>;

// Attention feedback variants (kFb): each chunk's own softmax sum per query
// row (compute_chunk's cl, accumulated beside the running sum, which stays as
// in the plain kernel: the same output bits), written with the row's running
// max after the chunk for launch_feedback_from_chunks (attention_feedback.cu),
// so that the feedback needs no second read of the keys.
// SIMT: every lane holds all R rows' parts of its key-row slot (the slot's
// lanes the same values); the slots are summed across the warp.
template <int D, int R>
__device__ __forceinline__ void chunk_sum_write(const WarpState<R> &w, float *cl, float *out, int nrows, int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float part = cl[r];
#pragma unroll
        for (int o = Cfg<D>::kLanesPerRow; o < 32; o <<= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, o);
        if (lane == 0 && r < nrows) reinterpret_cast<float2 *>(out)[r] = make_float2(w.m[r], part);
    }
}
// Tensor cores: lane (g, c) holds rows g and g + 8 over its keys 4c .. 4c + 3 (decode_mma.cuh).
template <int D, int TR>
__device__ __forceinline__ void chunk_sum_write(const tc::State<D, TR> &w, float *cl, float *out, int nrows, int lane) {
    constexpr int kH = tc::State<D, TR>::kH;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int h = 0; h < kH; ++h) {
        float part = cl[h];
        part += __shfl_xor_sync(0xFFFFFFFFu, part, 1);
        part += __shfl_xor_sync(0xFFFFFFFFu, part, 2);
        const int row = g + 8 * h;
        if (c == 0 && row < nrows) reinterpret_cast<float2 *>(out)[row] = make_float2(w.m[h], part);
    }
}

// Sequence seq's tail: from the parameters when it is among the first kInlineRoomTails.
__device__ __forceinline__ RoomTail room_tail(const RoomArgs &ra, uint32_t seq) {
    return seq < kInlineRoomTails ? ra.inline_tails[seq] : ra.tails[seq];
}
__device__ __forceinline__ RoomView room_view(const DecodeParams &p, const RoomArgs &ra, uint32_t seq) {
    const RoomTail t = room_tail(ra, seq);
    const RoomRecord &r = *t.record;
    const uint32_t gen = r.generation, old = *room_length(t.record, p.layer), end = r.end, id = r.seq;
    RoomView v{old, old, 0, UINT32_MAX, room_stage(t.record, p.layer, p.shape.n_layers), id};
    if (gen != t.generation) return v;  // lists of an earlier room: read nothing (the merge reports it)
    const bool fits = uint64_t(old) + 1 <= end;  // else nothing is written (the merge reports the overrun)
    v.len = fits ? old + 1 : old;
    const uint32_t P = p.shape.page_size, pages = (v.len + P - 1) / P;  // pages holding rows below len
    // Past the listed room (a graph captured before the room grew: the merge reports it), no more than listed.
    v.count = t.first + min(pages > t.page0 ? pages - t.page0 : 0u, t.n);
    if (fits && old < t.list_end && old / P >= t.page0 && t.first + (old / P - t.page0) < v.count)
        v.tail_idx = t.first + (old / P - t.page0);
    return v;
}

// The step's token of sequence `seq`, kv-head h, as this thread's share of
// the whole block: channels threadIdx.x + i * kThreads of K and V, from the
// engine's input.
template <int D>
struct TokenPart {
    static constexpr int kPer = (D + kThreads - 1) / kThreads;
    float k[kPer], v[kPer];
};
template <int D>
__device__ __forceinline__ TokenPart<D> load_token(const DecodeParams &p, const RoomArgs &ra, uint32_t seq,
                                                  uint32_t h) {
    TokenPart<D> x;
    const AppendRows &in = ra.fused.in;
    const int64_t base = input_offset(in, p.layer, seq, h);
#pragma unroll
    for (int i = 0; i < TokenPart<D>::kPer; ++i) {
        const uint32_t d = threadIdx.x + i * kThreads;
        x.k[i] = d < D ? load_input(in.k, in.dtype, base + d) : 0.0f;
        x.v[i] = d < D ? load_input(in.v, in.dtype, base + d) : 0.0f;
    }
    return x;
}

// The token written by the CTA that reads its page: what the room append
// kernel's block of kv-head h writes (quantize_pages.cu append_rows_f16 on the
// staged row), from registers: staging row, F16/BF16 page rows, the key
// summary's folds continued (their earlier values loaded together). Where the
// folds do not cover the page's earlier rows the page is re-encoded from its
// staging (append_rows_f16's from_start). The stores are fenced to L2 before
// the CTA's copies (cp.async reads L2) read the page. fold.rows is advanced by
// the caller once every thread has read it.
template <int D>
__device__ void write_token_f16(const DecodeParams &p, const RoomArgs &ra, const RoomView &v, const DevPage &tail,
                                uint32_t seq, uint32_t h, const TokenPart<D> &x) {
    const PageShape &shape = p.shape;
    const uint32_t P = shape.page_size, H = shape.n_kv_heads, row = v.old_len % P;
    const ikv_format f = ikv_format(tail.format);
    const bool f16 = f == IKV_FMT_F16;
    const StageFold fold = stage_fold(shape, v.stage);
    const AppendJob j{const_cast<uint8_t *>(tail.base), v.stage, p.layer, seq, row, 1u, uint32_t(f), v.seq_id};
    const SubpageLayout L = subpage_layout(f, P, D);
    uint8_t *sub = j.page + subpage_offset(shape, f, p.layer, h);
    uint16_t *rec = reinterpret_cast<uint16_t *>(j.page + summary_offset(shape, f, p.layer, h));
    const uint64_t head_floats = uint64_t(P) * D;
    // Loaded together: whether the folds cover rows [0, row), and their values.
    const uint32_t fold_rows = fold.rows[h];
    constexpr int kPer = TokenPart<D>::kPer;
    float mn[kPer], mx[kPer];
    double sum[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const uint32_t d = threadIdx.x + i * kThreads;
        mn[i] = INFINITY, mx[i] = -INFINITY, sum[i] = 0.0;
        if (row > 0 && d < D) mn[i] = fold.mn[h * D + d], mx[i] = fold.mx[h * D + d], sum[i] = fold.sum[h * D + d];
    }
    const bool continued = row == 0 || fold_rows == row;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const uint32_t d = threadIdx.x + i * kThreads;
        if (d >= D) continue;
        const float k = finite_or_record(x.k[i], j, ra.fused.in, 0, h, d, 0, ra.fused.error);
        const float vv = finite_or_record(x.v[i], j, ra.fused.in, 0, h, d, 1, ra.fused.error);
        v.stage[uint64_t(h) * head_floats + uint64_t(row) * D + d] = k;
        v.stage[(uint64_t(H) + h) * head_floats + uint64_t(row) * D + d] = vv;
        const uint16_t bk = narrow16(k, f16);
        reinterpret_cast<uint16_t *>(sub + L.k)[row * D + d] = bk;
        reinterpret_cast<uint16_t *>(sub + L.v)[row * D + d] = narrow16(vv, f16);
        if (continued) {
            const float xk = widen16(bk, f16);
            store_fold(fold, rec, D, h, d, fminf(mn[i], xk), fmaxf(mx[i], xk), sum[i] + double(xk), row + 1);
        }
    }
    if (!continued) {     // uniform: every thread read the same fold_rows
        __syncthreads();  // the staged row is visible to the block
        append_rows_f16<-1>(shape, j, h, fold, true);
    }
    __threadfence();
}

// kAppend: the decode that appends its step's token (FusedAppend; its own
// instantiations, so that the others keep their code and registers: the
// branches compiled into every variant made plain decodes 10-24% slower).
// kFb: a decode with attention feedback (ChunkSums; its own instantiations too).
template <int D, int R, int kMode, bool kAppend, bool kFb = false>
__global__ void __launch_bounds__(kThreads, min_blocks<D, R, kMode>())
    decode_kernel(const DecodeParams p, const ExtraParam<kAppend, kFb> ra, uint32_t rows_total, float *part_acc,
                  float *part_ml) {
    constexpr bool kTc = kMode != kSimt, kBF = kMode == kTcBF16;
    using C = Cfg<D>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *ring = smem + warp * C::kRingBytes;
    float *Qs = reinterpret_cast<float *>(smem + Smem<D, R>::kQOff);
    ChunkMeta *meta = reinterpret_cast<ChunkMeta *>(smem + Smem<D, R>::kMetaOff) + warp * C::kStages;

    const uint32_t split = blockIdx.x, seq = blockIdx.z;
    const uint32_t Hkv = p.shape.n_kv_heads;
    const uint32_t head = blockIdx.y % Hkv, row_chunk = blockIdx.y / Hkv;
    const uint32_t G = p.n_q_heads / Hkv, T = p.n_query_tokens;
    const uint32_t row0 = row_chunk * R;
    const int nrows = int(min(uint32_t(R), rows_total - row0));
    const uint32_t li = p.lists.list_heads > 1 ? seq * p.lists.list_heads + head : seq;
    const DevPage *list = p.lists.pages + uint64_t(li) * p.lists.stride;
    const int d0 = (lane % C::kLanesPerRow) * 8;
    // Everything above is arithmetic; from here on global memory written by
    // earlier kernels (lists, lengths, q) is read (kernels/launch_pdl.cuh).
    pdl_wait();
    pdl_launch_dependents();  // the merge's CTAs may take slots this grid leaves free
    RoomView room{};
    if constexpr (kAppend) {
        room = room_view(p, ra, seq);
    }
    const uint32_t len = kAppend ? room.len : p.seq_len[seq];
    const uint32_t count = kAppend ? room.count : p.lists.counts[li];

    // The CTA's slice of its list (balanced on the list's own count), then the warp's part of it.
    const uint32_t max_pos = len - T + (row0 + uint32_t(nrows) - 1) / G;
    const uint32_t per_split = (count + gridDim.x - 1) / gridDim.x;
    const uint32_t first = split * per_split;
    const uint32_t npages = first < count ? min(per_split, count - first) : 0u;
    const int P = int(p.shape.page_size);
    const int cpp = P > kChunkRows ? P / kChunkRows : 1;  // chunks per page
    const int nchunks = int(npages) * cpp;
    const int cb = nchunks * warp / kWarps, ce = nchunks * (warp + 1) / kWarps;

    auto entry = [&](int i) { return list[first + uint32_t(i / cpp)]; };
    if constexpr (kAppend) {
        // The CTA whose slice holds the page the appended token lands in writes
        // the token there first (row chunk 0 of its kv-head: the only CTA that
        // reads that sub-page, cuda_decode.cpp asks for one row chunk), then
        // reads the page as every other one.
        const bool writer = room.tail_idx >= first && room.tail_idx < first + npages && row_chunk == 0;
        // The token's input is loaded by this CTA alone (loaded by every CTA
        // in the record's round trip, the step took 1% longer at B = 1).
        if (writer) write_token_f16<D>(p, ra, room, list[room.tail_idx], seq, head, load_token<D>(p, ra, seq, head));
        __syncthreads();  // the token is written before any thread reads its page
        if (writer && threadIdx.x == 0) stage_fold(p.shape, room.stage).rows[head] = room.old_len % p.shape.page_size + 1;
    }
    // Copy chunk i (entry pg) into ring stage st; lane 0 records what the slot holds.
    auto issue = [&](int i, const DevPage &pg, int st) {
        const int c0 = (i % cpp) * kChunkRows;
        const int lo = max(int(pg.begin), c0);
        int hi = min(int(pg.end), min(c0 + kChunkRows, P));
        const int64_t lim = int64_t(max_pos) + 1 - int64_t(pg.pos0);  // rows after the last query are never read
        if (lim < hi) hi = int(lim < 0 ? 0 : lim);
        const ikv_format f = ikv_format(pg.format);
        uint8_t *slot = ring + st * C::kSlotBytes;
        if (hi > lo) {
            const uint8_t *sub = pg.base + subpage_offset(p.shape, f, p.layer, head);
            with_format(f, [&](auto F) { dec::copy_chunk<D, F.value, kTc>(sub, P, c0, lo, hi, slot, lane); });
        }
        if (lane == 0) meta[st] = ChunkMeta{lo - c0, hi - c0, int(f), pg.pos0 + uint32_t(c0)};
    };

    // Prologue: the first kStages-1 chunks go out before the query is staged,
    // so the CTA's first DRAM round trips overlap (a short split, as at B = 1,
    // has only a few chunks per warp and pays each round trip in full).
    DevPage pro[C::kStages - 1];  // the prologue's entries, all loads in flight before the first use
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s)
        if (cb + s < ce) pro[s] = entry(cb + s);
    DevPage next{};  // entry of the next chunk to issue, loaded one iteration ahead
    if (cb + C::kStages - 1 < ce) next = entry(cb + C::kStages - 1);
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
        if (cb + s < ce) issue(cb + s, pro[s], s);
        dec::cp_async_commit();
    }

    // Query rows (row r = t*G + g); padding rows are zero and masked. SIMT:
    // pre-scaled into the base-2 domain; tensor cores: as given (exact in the
    // operand type), the scale goes on the fp32 scores.
    const float qs = p.scale * kLog2e;
    for (int e = threadIdx.x; e < R * D; e += kThreads) {
        const uint32_t r = uint32_t(e / D), rr = row0 + r, t = rr / G, gi = rr % G;
        const uint64_t qi = ((uint64_t(seq) * T + t) * p.n_q_heads + head * G + gi) * D + uint32_t(e % D);
        Qs[e] = int(r) < nrows ? load_elem(p.q, p.q_dtype, qi) * (kTc ? 1.0f : qs) : 0.0f;
    }
    __syncthreads();
    auto qpos_of = [&](int r) { return r < nrows ? int(len - T + (row0 + uint32_t(r)) / G) : -1; };
    std::conditional_t<kTc, tc::State<D, R>, WarpState<R>> w;
    if constexpr (kTc) {
        tc::init_state<D, R, kBF>(w, Qs, lane, qpos_of);
    } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            w.qpos[r] = qpos_of(r);
            w.m[r] = -INFINITY;
            w.l[r] = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) w.acc[r][j] = 0.0f;
        }
    }
    const float cap2 = p.softcap > 0.0f ? p.softcap * kLog2e : 0.0f;
    const float inv_cap2 = p.softcap > 0.0f ? 1.0f / cap2 : 0.0f;

    // Main loop. The copy of chunk i+kStages-1 goes into the slot chunk i-1
    // left (computed in the previous iteration) BEFORE waiting for chunk i,
    // so kStages chunks are in flight while the warp waits (kStages-1 while
    // it computes): with 2 slots, two 8 KB chunks per warp instead of one.
    int st = 0;
    for (int i = cb; i < ce; ++i) {
        __syncwarp();  // every lane is done with the slot (and meta) of chunk i-1
        const int ii = i + C::kStages - 1;
        if (ii < ce) {
            issue(ii, next, st == 0 ? C::kStages - 1 : st - 1);
            if (ii + 1 < ce) next = entry(ii + 1);
        }
        dec::cp_async_commit();
        dec::cp_async_wait<C::kStages - 1>();
        __syncwarp();  // chunk i landed for every lane
        const ChunkMeta mt = meta[st];
        const uint8_t *slot = ring + st * C::kSlotBytes;
        const auto compute = [&](float *cl) {
            if (mt.r1 > mt.r0) {
                with_format(mt.format, [&](auto F) {
                    if constexpr (kTc)
                        tc::compute_chunk<D, R, kBF, F.value, kFb>(slot, mt.r0, mt.r1, mt.pos, w, lane, qs, cap2,
                                                                   inv_cap2, cl);
                    else
                        compute_chunk<D, R, F.value, kFb>(slot, mt, Qs, w, lane, cap2, inv_cap2, cl);
                });
            }
        };
        if constexpr (kFb) {  // every chunk of the slice writes its sums (0 where it read nothing)
            float cl[sizeof(w.m) / sizeof(w.m[0])] = {};
            compute(cl);
            const uint64_t chunk = (uint64_t(seq) * Hkv + head) * ra.chunks_per_list + uint64_t(first) * cpp + i;
            chunk_sum_write<D>(w, cl, ra.sums + (chunk * rows_total + row0) * 2, nrows, lane);
        } else {
            compute(nullptr);
        }
        st = st == C::kStages - 1 ? 0 : st + 1;
    }
    dec::cp_async_wait<0>();
    __syncwarp();

    // Park the warp's (acc, m, l) in its own ring: [R][D] acc, [R] m, [R] l
    // (fits: at D = 32, R = 16 it is 2176 of the ring's 4096 bytes).
    static_assert((R * D + 2 * R) * 4 <= C::kRingBytes, "the warp's partial fits its ring");
    float *red = reinterpret_cast<float *>(ring);
    if constexpr (kTc) {
        tc::finish<D, R>(w, red, lane);
    } else {
        // Sum the warp's row slots (same max) first.
#pragma unroll
        for (int o = C::kLanesPerRow; o < 32; o <<= 1)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                w.l[r] += __shfl_xor_sync(0xFFFFFFFFu, w.l[r], o);
#pragma unroll
                for (int j = 0; j < 8; ++j) w.acc[r][j] += __shfl_xor_sync(0xFFFFFFFFu, w.acc[r][j], o);
            }
        if (lane < C::kLanesPerRow) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float4 *o = reinterpret_cast<float4 *>(red + r * D + d0);
                o[0] = make_float4(w.acc[r][0], w.acc[r][1], w.acc[r][2], w.acc[r][3]);
                o[1] = make_float4(w.acc[r][4], w.acc[r][5], w.acc[r][6], w.acc[r][7]);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) red[R * D + r] = w.m[r], red[R * D + R + r] = w.l[r];
        }
    }
    __syncthreads();

    // Merge the warps; write the split's partial (m in the natural-log domain).
    const uint64_t base = ((uint64_t(seq) * Hkv + head) * gridDim.x + split) * rows_total + row0;
    for (int e = threadIdx.x; e < nrows * D; e += kThreads) {
        const int r = e / D, d = e % D;
        float mw[kWarps], M = -INFINITY;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) {
            mw[v] = reinterpret_cast<const float *>(smem + v * C::kRingBytes)[R * D + r];
            M = fmaxf(M, mw[v]);
        }
        float a = 0.0f, L = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) {
            if (mw[v] == -INFINITY) continue;
            const float *rv = reinterpret_cast<const float *>(smem + v * C::kRingBytes);
            const float sc = fast_exp2(mw[v] - M);
            a = fmaf(rv[r * D + d], sc, a);
            L = fmaf(rv[R * D + R + r], sc, L);
        }
        part_acc[(base + r) * D + d] = a;
        if (d == 0) {
            part_ml[2 * (base + r)] = M == -INFINITY ? -INFINITY : M * kLn2;
            part_ml[2 * (base + r) + 1] = L;
        }
    }
}

// Sum (or max) of v over the block (blockDim.x a multiple of 32); every thread gets the result.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float *tmp) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads();  // tmp is free (an earlier call's reads are done)
    if ((threadIdx.x & 31) == 0) tmp[threadIdx.x >> 5] = v;
    __syncthreads();
    v = tmp[0];
    for (uint32_t i = 1; i < (blockDim.x >> 5); ++i) v = is_max ? fmaxf(v, tmp[i]) : v + tmp[i];
    return v;
}

// After the decode grid of a decode that appended (FusedAppend), by a block
// of the merge grid of its own (beside the merge's, not before their work):
// every decode CTA has read the old length, so it advances now (RoomJobs::
// done's work), and the list's length becomes the one the decode read at
// (ikv_decoder_last_selection clips the room's entries to it on the host;
// the list itself stays whole for the next decode that appends).
__device__ void commit_room(const DecodeParams &p, const RoomArgs &ra, uint32_t seq) {
    if (threadIdx.x != 0) return;
    const RoomTail t = room_tail(ra, seq);
    RoomRecord &r = *t.record;
    if (r.generation != t.generation) {  // the decode read nothing: report the stale graph
        const_cast<uint32_t *>(p.lists.counts)[seq] = 0;  // (ikv_decoder_last_selection; a later plain call clips anew)
        r.stale_read = 1;
        return;
    }
    const uint32_t old = *room_length(t.record, p.layer), len = uint64_t(old) + 1 <= r.end ? old + 1 : old;
    const_cast<uint32_t *>(p.seq_len)[seq] = len;
    advance_room_length(r, p.layer, old, 1);
    if (len > t.list_end) r.stale_read = 1;  // a graph captured before the room grew
}

// For merge_kernel's rare path (a row whose weights summed to 0: none of its
// logits was finite): whether query row `row` (t * G + g) of (seq, head)
// read a key, i.e. its list holds a token at or before the row's position.
// Every thread of the block takes part and gets the answer. After a decode
// that appended (kCommit) the length the decode read is the room's,
// advanced beside this grid (and the lists of a stale room are cleared
// there), so the row's position is not known here: such a row counts only
// when its q holds a NaN or inf and its list holds an entry (every row of a
// one-token step reads the token it appended); a row whose logits all
// overflowed reads as empty there (the header). Inlined and called once the
// row's partials are summed: as a call (__noinline__) it cost the merge 16
// registers, a 144-byte stack frame and B = 1 steps 1.5-3.4%
// (bench/RESULTS.md 0c, 0d).
template <bool kCommit>
__device__ __forceinline__ bool row_read_a_key(const DecodeParams &p, uint32_t seq, uint32_t head, uint32_t row) {
    const uint32_t D = p.shape.head_dim, G = p.n_q_heads / p.shape.n_kv_heads, t = row / G;
    const uint32_t li = p.lists.list_heads > 1 ? seq * p.lists.list_heads + head : seq;
    if constexpr (kCommit) {
        const uint64_t qi = (uint64_t(seq) * p.n_query_tokens + t) * p.n_q_heads + head * G + row % G;
        bool bad = false;
        for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) bad |= !isfinite(load_elem(p.q, p.q_dtype, qi * D + d));
        return __syncthreads_or(bad) && p.lists.counts[li] > 0;
    }
    const uint32_t n = p.lists.counts[li];
    const uint32_t qpos = p.seq_len[seq] - p.n_query_tokens + t;
    const DevPage *list = p.lists.pages + uint64_t(li) * p.lists.stride;
    bool any = false;
    for (uint32_t e = threadIdx.x; e < n && !any; e += blockDim.x) any = list[e].pos0 + list[e].begin <= qpos;
    return __syncthreads_or(any);
}

constexpr int kMergeThreads = 128;
// Every head dim's float4 columns (D/4 = 8 at D = 32 ... 64 at D = 256) tile the block.
static_assert(kMergeThreads % (256 / 4) == 0 && kMergeThreads % (32 / 4) == 0, "whole column groups");

// One block per (seq, head, row). The splits' (m, l) are read in parallel
// across the block and their weights exp(m_s - m) kept in shared memory
// (n_splits floats, dynamic). Then each thread owns a float4
// column of the row and a group of splits (s = group, group + groups, ...):
// its loads are independent and issued 8 at a time, so the merge costs a few
// L2 round trips instead of one per split (profiled at B = 1: the per-channel
// loop over 49 splits made the merge 18.8 us against 4.5 us for cuDNN's).
// kCommit: after a decode that appended, with one more block per sequence
// that advances its length (commit_room); RoomArgs only there.
template <bool kCommit>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const DecodeParams p, const RoomParam<kCommit> ra,
                                                              uint32_t n_splits, uint32_t rows_total,
                                                              const float *part_acc, const float *part_ml) {
    extern __shared__ float wgt[];
    __shared__ float tmp[32];
    __shared__ float4 red[kMergeThreads];
    const uint32_t D = p.shape.head_dim, Hkv = p.shape.n_kv_heads;
    if constexpr (kCommit) {
        const uint32_t merge_blocks = p.n_seqs * Hkv * rows_total;
        if (blockIdx.x >= merge_blocks) {  // one more block per sequence (launch_decode)
            pdl_wait();  // every decode CTA has read the old length
            commit_room(p, ra, blockIdx.x - merge_blocks);
            return;
        }
    }
    const uint32_t row = blockIdx.x % rows_total, head = (blockIdx.x / rows_total) % Hkv;
    const uint32_t seq = blockIdx.x / (rows_total * Hkv);
    const uint32_t G = p.n_q_heads / Hkv, t = row / G, g = row % G;
    const uint64_t stride = rows_total;
    const uint64_t b0 = (uint64_t(seq) * Hkv + head) * n_splits * stride + row;
    const float2 *ml = reinterpret_cast<const float2 *>(part_ml);
    // A thread per float4 column: D 32/64/128/256 -> 8/16/32/64 columns and
    // 16/8/4/2 groups of splits (at D = 32 a block reads 16 splits at once).
    const uint32_t cols = D / 4, groups = kMergeThreads / cols;
    const uint32_t col = threadIdx.x % cols, grp = threadIdx.x / cols;
    const float4 *acc = reinterpret_cast<const float4 *>(part_acc) + b0 * cols + col;
    pdl_wait();  // the decode grid's partials are complete and visible
    // The first kPrefetch partials of this thread's splits and its split's
    // (m, l) are loaded before any reduction: they do not depend on the
    // weights, so their L2 round trip overlaps the (m, l) one (section 1f of
    // bench/RESULTS.md: the merge costs ~6 us of a 26 us B = 1 step).
    constexpr uint32_t kPrefetch = 8;
    float4 pre[kPrefetch];
#pragma unroll
    for (uint32_t k = 0; k < kPrefetch; ++k) {
        const uint32_t s = grp + k * groups;
        pre[k] = s < n_splits ? acc[uint64_t(s) * stride * cols] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const float2 mine = threadIdx.x < n_splits ? ml[b0 + threadIdx.x * stride] : make_float2(-INFINITY, 0.0f);
    float m = mine.x;
    for (uint32_t s = threadIdx.x + blockDim.x; s < n_splits; s += blockDim.x) m = fmaxf(m, ml[b0 + s * stride].x);
    m = block_reduce(m, true, tmp);
    float l = 0.0f;
    for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
        const float2 v = s == threadIdx.x ? mine : ml[b0 + s * stride];
        const float w = v.x == -INFINITY ? 0.0f : __expf(v.x - m);
        wgt[s] = w;
        l += v.y * w;
    }
    l = block_reduce(l, false, tmp);  // its barriers also publish wgt

    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    auto add = [&](uint32_t s, const float4 &v) {
        const float w = wgt[s];
        a.x = fmaf(v.x, w, a.x), a.y = fmaf(v.y, w, a.y), a.z = fmaf(v.z, w, a.z), a.w = fmaf(v.w, w, a.w);
    };
    if (l > 0.0f) {  // splits in ascending order, as before the prefetch
#pragma unroll
        for (uint32_t k = 0; k < kPrefetch; ++k)
            if (grp + k * groups < n_splits) add(grp + k * groups, pre[k]);
#pragma unroll 8
        for (uint32_t s = grp + kPrefetch * groups; s < n_splits; s += groups) add(s, acc[uint64_t(s) * stride * cols]);
    }
    // A query row holding a NaN or inf, or one none of whose logits is finite
    // (they overflow fp32), gets NaN outputs where it read a key (the
    // header). The decode's maxima skip NaN, so NaN and -inf logits read as
    // masked and the row's weights sum to 0, as for a row that read nothing;
    // a +inf one makes the sums NaN. Told apart here, off the common path
    // (l > 0), so the decode kernel carries no check; after the sums, so the
    // prefetched partials are not live across it. l is the same in every
    // thread (block_reduce), so the whole block takes the branch.
    const bool nan_row = l != l || (l == 0.0f && row_read_a_key<kCommit>(p, seq, head, row));
    red[threadIdx.x] = a;
    __syncthreads();
    if (grp != 0) return;
    for (uint32_t k = 1; k < groups; ++k) {
        const float4 v = red[k * cols + col];
        a.x += v.x, a.y += v.y, a.z += v.z, a.w += v.w;
    }
    const float inv = l > 0.0f ? 1.0f / l : nan_row ? NAN : 0.0f;
    const float o[4] = {a.x * inv, a.y * inv, a.z * inv, a.w * inv};
    const uint64_t oi = (uint64_t(seq) * p.n_query_tokens + t) * p.n_q_heads + head * G + g;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint64_t d = oi * D + 4 * col + uint32_t(j);
        if (p.out_dtype == IKV_DTYPE_F32)
            static_cast<float *>(p.out)[d] = o[j];
        else if (p.out_dtype == IKV_DTYPE_F16)
            static_cast<uint16_t *>(p.out)[d] = f32_to_f16(o[j]);
        else
            static_cast<uint16_t *>(p.out)[d] = f32_to_bf16(o[j]);
    }
    if (p.lse && threadIdx.x == 0) p.lse[oi] = l > 0.0f ? m + logf(l) : nan_row ? NAN : -INFINITY;
}

int decode_mode(const DecodeParams &p) {
    // kComputeDefault here was not settled by decode_resolve_compute: SIMT.
    if (p.compute != kComputeTensorCores || p.q_dtype == IKV_DTYPE_F32) return kSimt;
    return p.q_dtype == IKV_DTYPE_BF16 ? kTcBF16 : kTcF16;
}

// Query rows per CTA: SIMT 1, 4 or 8 (its registers grow with R); tensor
// cores 8 or 16 (the mma's M is 16; 8 keeps half of it for 3 CTAs per SM).
uint32_t rows_per_cta(int mode, uint32_t rows_total) {
    if (mode != kSimt) return rows_total <= 8 ? 8 : 16;
    return rows_total <= 1 ? 1 : rows_total <= 4 ? 4 : 8;
}

using DecodeFn = void (*)(const DecodeParams, const NoRoom, uint32_t, float *, float *);
using AppendDecodeFn = void (*)(const DecodeParams, const RoomArgs, uint32_t, float *, float *);
using FeedbackDecodeFn = void (*)(const DecodeParams, const ChunkSums, uint32_t, float *, float *);

// What a table entry's kernel takes besides the decode (its second argument).
enum KernelKind { kPlainKernel, kAppendKernel, kFeedbackKernel };

struct KernelEntry {
    uint32_t D, R;
    int mode;
    int kind;              // KernelKind; kAppendKernel: the decode that appends (FusedAppend), one row chunk, R <= 8
    DecodeFn fn;           // kPlainKernel, else nullptr
    AppendDecodeFn afn;    // kAppendKernel, else nullptr
    FeedbackDecodeFn ffn;  // kFeedbackKernel, else nullptr
    int smem;
    const void *any() const {
        return kind == kAppendKernel     ? reinterpret_cast<const void *>(afn)
               : kind == kFeedbackKernel ? reinterpret_cast<const void *>(ffn)
                                         : reinterpret_cast<const void *>(fn);
    }
};

// The dispatch table: head_dim x row-chunk size x compute mode x kind.
#define IKV_DECODE_PLAIN(D, R, M) {D, R, M, kPlainKernel, decode_kernel<D, R, M, false>, nullptr, nullptr, Smem<D, R>::kBytes}
#define IKV_DECODE_APPEND(D, R, M) {D, R, M, kAppendKernel, nullptr, decode_kernel<D, R, M, true>, nullptr, Smem<D, R>::kBytes}
#define IKV_DECODE_FEEDBACK(D, R, M) \
    {D, R, M, kFeedbackKernel, nullptr, nullptr, decode_kernel<D, R, M, false, true>, Smem<D, R>::kBytes}
#define IKV_DECODE_R8(D, E) E(D, 1, kSimt), E(D, 4, kSimt), E(D, 8, kSimt), E(D, 8, kTcF16), E(D, 8, kTcBF16)
#define IKV_DECODE_D(D)                                                                               \
    IKV_DECODE_R8(D, IKV_DECODE_PLAIN), IKV_DECODE_PLAIN(D, 16, kTcF16), IKV_DECODE_PLAIN(D, 16, kTcBF16), \
        IKV_DECODE_R8(D, IKV_DECODE_APPEND), IKV_DECODE_R8(D, IKV_DECODE_FEEDBACK),                        \
        IKV_DECODE_FEEDBACK(D, 16, kTcF16), IKV_DECODE_FEEDBACK(D, 16, kTcBF16)
// D = 32 (small models, MiniLM-sized heads): the same templates; SIMT with 4
// lanes per row, tensor cores with 2 k-steps for S and 4 n-tiles for P V.
const KernelEntry kTable[] = {IKV_DECODE_D(32), IKV_DECODE_D(64), IKV_DECODE_D(128), IKV_DECODE_D(256)};
#undef IKV_DECODE_D
#undef IKV_DECODE_R8
#undef IKV_DECODE_FEEDBACK
#undef IKV_DECODE_APPEND
#undef IKV_DECODE_PLAIN

const KernelEntry *find_kernel(const DecodeParams &p, uint32_t rows_total, int kind = kPlainKernel) {
    const int mode = decode_mode(p);
    const uint32_t R = rows_per_cta(mode, rows_total);
    for (const KernelEntry &e : kTable)
        if (e.D == p.shape.head_dim && e.R == R && e.mode == mode && e.kind == kind) return &e;
    return nullptr;
}

// Opt in to the kernel's dynamic shared memory once per device (the setting
// is per device; repeating it would cost host time on every step).
cudaError_t allow_smem(const KernelEntry *k) {
    static std::atomic<uint64_t> done[sizeof(kTable) / sizeof(kTable[0])];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint64_t bit = 1ull << (dev & 63);
    std::atomic<uint64_t> &d = done[k - kTable];
    if (d.load(std::memory_order_acquire) & bit) return cudaSuccess;
    err = cudaFuncSetAttribute(k->any(), cudaFuncAttributeMaxDynamicSharedMemorySize, k->smem);
    if (err == cudaSuccess) d.fetch_or(bit, std::memory_order_acq_rel);
    return err;
}

uint32_t query_rows(const DecodeParams &p) { return p.n_query_tokens * (p.n_q_heads / p.shape.n_kv_heads); }

uint32_t row_chunks(const DecodeParams &p) {
    const uint32_t rows = query_rows(p), R = rows_per_cta(decode_mode(p), rows);
    return (rows + R - 1) / R;
}

// CTAs of the decode kernel resident per SM, from the occupancy calculator
// (registers and shared memory), remembered per table entry; without a
// device, the shared-memory bound (228 KB per SM, 1 KB reserved per CTA).
uint64_t ctas_per_sm(const DecodeParams &p) {
    static std::atomic<int> cached[sizeof(kTable) / sizeof(kTable[0])];
    const KernelEntry *k = find_kernel(p, query_rows(p));
    if (!k) return 1;
    int n = cached[k - kTable].load(std::memory_order_relaxed);
    if (n == 0 && allow_smem(k) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k->fn, kThreads, size_t(k->smem)) == cudaSuccess && n > 0)
        cached[k - kTable].store(n, std::memory_order_relaxed);
    if (n <= 0) {
        (void)cudaGetLastError();  // leave no sticky error from a failed query
        n = int((228u * 1024u) / unsigned(k->smem + 1024));
    }
    return uint64_t(n > 0 ? n : 1);
}

}  // namespace

uint32_t decode_choose_splits(const DecodeParams &p, int n_sms) {
    const uint64_t base = uint64_t(p.n_seqs) * p.shape.n_kv_heads * row_chunks(p);
    const uint64_t resident = uint64_t(n_sms > 0 ? n_sms : 132) * ctas_per_sm(p);
    // Work units: 16-row chunks; at least one per warp. (Measured on the H100,
    // B = 1, bench/RESULTS.md: a short list wants every SM busy more than long
    // splits; a 25% selection of 8K, 128 pages per head, ran in 0.0125 ms at
    // 32 splits, one chunk per warp, and in 0.0191 ms at the 6 that a floor of
    // four chunks per warp allowed.)
    const uint64_t P = p.shape.page_size;
    const uint64_t chunks = uint64_t(p.max_pages) * (P > 16 ? P / 16 : 1);
    const uint64_t max_useful = std::max<uint64_t>(1, chunks / kWarps);
    // Fill of the resident CTA slots over the waves s splits take; the fewest
    // splits within 3% of the best fill, searching up to two waves' worth.
    const uint64_t hi = std::min<uint64_t>(max_useful, 2 * ((resident + base - 1) / base));
    auto fill = [&](uint64_t s) {
        const uint64_t ctas = base * s, waves = (ctas + resident - 1) / resident;
        return double(ctas) / double(waves * resident);
    };
    double best = 0.0;
    for (uint64_t s = 1; s <= hi; ++s) best = std::max(best, fill(s));
    uint64_t pick = 1;
    for (uint64_t s = 1; s <= hi; ++s)
        if (fill(s) >= best - 0.03) {
            pick = s;
            break;
        }
    return uint32_t(std::min<uint64_t>(pick, 1024));
}

double device_memory_gbps_per_sm(int device) {
    int khz = 0, bits = 0, sms = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
        cudaGetLastError();
        return 0.0;
    }
    return 2.0 * double(khz) * 1e3 * double(bits) / 8.0 / 1e9 / double(sms);  // double data rate
}

uint32_t decode_resolve_compute(const DecodeParams &p, uint32_t max_rows, int n_sms, double mem_gbps_per_sm) {
    if (p.compute != kComputeDefault) return p.compute;
    if (p.q_dtype != IKV_DTYPE_F32 && query_rows(p) > kSimtMaxQueryRows) return kComputeTensorCores;
    const uint32_t tc_formats = mem_gbps_per_sm >= kTc16BitMinGBpsPerSm ? ~0u : kTensorCoreFormats;
    if (p.q_dtype == IKV_DTYPE_F32 || !(p.formats & tc_formats)) return kComputeSimt;
    DecodeParams simt = p;
    simt.compute = kComputeSimt;
    const uint64_t splits = decode_choose_splits(simt, n_sms);
    const uint64_t P = p.shape.page_size;
    const uint64_t chunks = (uint64_t(max_rows) + std::min<uint64_t>(P, 16) - 1) / std::min<uint64_t>(P, 16);
    return chunks >= kTcMinChunksPerCta * splits ? kComputeTensorCores : kComputeSimt;
}

bool decode_grid_fits(const DecodeParams &p) {
    constexpr uint64_t kMaxGridYZ = 65535;
    return uint64_t(p.shape.n_kv_heads) * row_chunks(p) <= kMaxGridYZ && p.n_seqs <= kMaxGridYZ;
}

uint64_t decode_workspace_bytes(const DecodeParams &p, uint32_t n_splits) {
    const uint64_t n = uint64_t(p.n_seqs) * p.shape.n_kv_heads * n_splits * query_rows(p);
    return align_up(n * p.shape.head_dim * 4, 256) + n * 8;
}

uint32_t chunks_per_entry(const DecodeParams &p) {
    return p.shape.page_size > uint32_t(kChunkRows) ? p.shape.page_size / kChunkRows : 1u;
}

uint64_t chunk_sums_bytes(const DecodeParams &p, uint32_t list_stride) {
    return 8ull * p.n_seqs * p.shape.n_kv_heads * list_stride * chunks_per_entry(p) * query_rows(p);
}

cudaError_t launch_decode(const DecodeParams &p, cudaStream_t stream, const RoomArgs *room, const ChunkSums *sums) {
    const uint32_t rows = query_rows(p);
    if (room != nullptr && sums != nullptr) return cudaErrorInvalidValue;
    const KernelEntry *k = find_kernel(p, rows, room ? kAppendKernel : sums ? kFeedbackKernel : kPlainKernel);
    // (the merge keeps one float per split in shared memory: at most kMaxSplits)
    if (!k || p.n_splits == 0 || p.n_splits > kMaxSplits || p.shape.page_size > 128) return cudaErrorInvalidValue;
    const uint32_t splits = p.n_splits;
    const uint64_t n = uint64_t(p.n_seqs) * p.shape.n_kv_heads * splits * rows;
    float *part_acc = static_cast<float *>(p.workspace);
    float *part_ml = reinterpret_cast<float *>(static_cast<uint8_t *>(p.workspace) +
                                               align_up(n * p.shape.head_dim * 4, 256));
    cudaError_t err = allow_smem(k);
    if (err != cudaSuccess) return err;
    const dim3 grid(splits, p.shape.n_kv_heads * row_chunks(p), p.n_seqs);
    const dim3 merge_grid(p.n_seqs * p.shape.n_kv_heads * rows), merge_block(kMergeThreads);
    const size_t merge_smem = splits * sizeof(float);
    if (sums != nullptr) {
        err = launch_pdl(k->ffn, grid, dim3(kThreads), size_t(k->smem), stream, p, *sums, rows, part_acc, part_ml);
        if (err != cudaSuccess) return err;
        return launch_pdl(merge_kernel<false>, merge_grid, merge_block, merge_smem, stream, p, NoRoom{}, splits, rows,
                          static_cast<const float *>(part_acc), static_cast<const float *>(part_ml));
    }
    if (room == nullptr) {
        err = launch_pdl(k->fn, grid, dim3(kThreads), size_t(k->smem), stream, p, NoRoom{}, rows, part_acc, part_ml);
        if (err != cudaSuccess) return err;
        return launch_pdl(merge_kernel<false>, merge_grid, merge_block, merge_smem, stream, p, NoRoom{}, splits, rows,
                          static_cast<const float *>(part_acc), static_cast<const float *>(part_ml));
    }
    err = launch_pdl(k->afn, grid, dim3(kThreads), size_t(k->smem), stream, p, *room, rows, part_acc, part_ml);
    if (err != cudaSuccess) return err;
    // A decode that appended: one block per sequence besides, which advances its length (commit_room).
    return launch_pdl(merge_kernel<true>, dim3(merge_grid.x + p.n_seqs), merge_block, merge_smem, stream, p, *room,
                      splits, rows, static_cast<const float *>(part_acc), static_cast<const float *>(part_ml));
}

}  // namespace cuda
}  // namespace ikv
