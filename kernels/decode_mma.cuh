// Tensor-core compute of the decode kernel (kernels/decode_attention.cu) for
// F16 and BF16 queries: one warp, one 16-row chunk of K/V in its slot, up to
// 16 query rows, with mma.sync m16n8k16 (fp32 accumulation). The SIMT path of
// the same kernel (fp32 FMAs) serves F32 queries.
//
// Why: the SIMT path spends ~1,600 instructions per chunk on fp32 FMAs and
// dequantization, so quantized pages (half the bytes) were issue bound. Here a
// chunk costs 32 mma instructions plus dequantization (~150-600 instructions
// depending on the format).
//
// Orientation (FlashAttention-2 style, the score accumulators are reused as
// the P operand without a shuffle):
//   S = Q K^T : M = query rows (16; rows >= R are zero), N = chunk tokens in
//               two n-tiles of 8, K = head_dim in D/16 k-steps.
//   O = P V   : M = query rows, N = head_dim in D/8 n-tiles, K = the 16 tokens.
// Lane (g, c) = (lane / 4, lane % 4) holds query row g (and g + 8) and:
//   * for S: K rows sigma(nt, g) = 2g - g%2 + 2nt, and in k-step s the dims
//     32*(s/2) + 8c + 4*(s%2) + {0,1 | 2,3} (a per-lane permutation of the
//     dot product's channels, the same for Q and K, so each lane's K values of
//     two k-steps are 8 contiguous channels: one 16/8/4-byte load);
//   * after S: scores of tokens 4c..4c+3 (n-tile 0 columns 2c, 2c+1 are tokens
//     4c, 4c+1; n-tile 1: 4c+2, 4c+3), which as the A operand of P V are
//     k-indices 2c, 2c+1, 2c+8, 2c+9: so P V's token order is that permutation;
//   * for P V: V rows 4c..4c+3 and channels W*g .. W*g + W - 1 (W = D/8);
//     n-tile j holds channel W*n + j in column n, so the lane ends with output
//     channels [2cW, 2cW + 2W) of its row(s): contiguous. The V slice is read
//     8 channels (8 n-tiles) per load, or W = 4 at D = 32 (one 8/4/2-byte
//     load per row: the lane's whole slice).
// Head dims: D = 32 is the smallest this layout takes: S needs whole pairs of
// k-steps (32 channels: 8 per lane quad member c), P V needs W = D/8 >= 4
// n-tiles of 8 columns.
// The slot's rows are XOR-swizzled (decode_formats.cuh: swizzle) so these
// reads are free of bank conflicts.
//
// Numerics: K and V are dequantized into the query's type (f16 or bf16: one
// rounding of the stored value, exact for F16/BF16 pages read with the same
// type and for INT8/INT4 integers and FP8 values before their scales), the
// FP8 K scale and scale*log2(e) are applied to the fp32 scores, softmax runs
// in fp32 (base 2), P is rounded to the operand type. Error class: f16/bf16
// operands with fp32 accumulation (FlashAttention's), see docs/CUDA.md. On
// the f16 pair paths the INT8 scales are rounded to f16 (INT4's scales and
// minimums are stored as halves, page_format.hpp) and applied with one
// HMUL2 / HFMA2 (INT4 on the CPU emulation: rel. L2 ~2e-4 with the stored
// halves, ~1e-3 while f32 scales were rounded here; far below INT4's own s/2). On the f16 path K/V values and scales
// outside f16's normal range lose precision (use F32 or BF16 queries for such
// data).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "decode_formats.cuh"

namespace ikv {
namespace cuda {
namespace tc {

using dec::kChunkRows;

// ------------------------------------------------------------ operand type --
// BF = false: f16 operands; true: bf16.
template <bool BF>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    uint32_t u;
    if constexpr (BF) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        u = *reinterpret_cast<const uint32_t *>(&h);
    } else {
        const __half2 h = __floats2half2_rn(lo, hi);
        u = *reinterpret_cast<const uint32_t *>(&h);
    }
    return u;
}
__device__ __forceinline__ __half2 as_h2(uint32_t u) { return *reinterpret_cast<const __half2 *>(&u); }
__device__ __forceinline__ uint32_t from_h2(__half2 h) { return *reinterpret_cast<const uint32_t *>(&h); }

// d += A B (m16n8k16, row.col, fp32 accumulators).
template <bool BF>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (BF)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(IKV_WARP_EMULATION)
    // Host build of this header by the warp emulation test (tests/emulated/):
    // the 32 lanes run as host threads and exchange fragments there.
    ikv_emulated_mma(BF, d, a0, a1, a2, a3, b0, b1);
#endif
}

// Address of byte `b` of chunk row r in a swizzled K or V area (rows of kRowBytes).
template <int D, int F>
__device__ __forceinline__ const uint8_t *at(const uint8_t *area, int r, int b) {
    return area + r * dec::Fmt<D, F>::kRowBytes + (((b >> 4) ^ dec::swizzle<D, F>(r)) << 4) + (b & 15);
}

// Exact f16 pairs of two int8 bytes (j, j+1 of xw = word ^ 0x80808080): the
// byte becomes the low mantissa of 1024 (0x64xx = 1024 + byte), minus 1152.
__device__ __forceinline__ uint32_t i8pair_f16(uint32_t xw, uint32_t sel) {
    const __half2 off = __floats2half2_rn(1152.0f, 1152.0f);
    return from_h2(__hsub2(as_h2(__byte_perm(xw, 0x64646464u, sel)), off));
}
__device__ __forceinline__ uint32_t fp8pair_f16(uint32_t two_bytes) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two_bytes & 0xFFFFu), __NV_E4M3);
    return from_h2(__half2(r));
}

// 2^x with one MUFU.EX2 (2^-inf = 0), as the SIMT path.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// Exact f16 pair of two nibbles (bits 0-3 and 16-19 of x): the nibble becomes
// the low mantissa of 1024 (0x640n = 1024 + n), minus 1024. The mask and the
// OR are one LOP3 (written out: with two immediates the compiler emits two).
__device__ __forceinline__ uint32_t i4pair_f16(uint32_t x) {
    const __half2 off = __floats2half2_rn(1024.0f, 1024.0f);
    uint32_t y;
#if defined(__CUDA_ARCH__)
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(y) : "r"(x), "r"(0x000F000Fu), "r"(0x64006400u));  // (a & b) | c
#else
    y = (x & 0x000F000Fu) | 0x64006400u;
#endif
    return from_h2(__hsub2(as_h2(y), off));
}

// Whether (format, operand type) has a direct pair path (no fp32 round trip).
template <int F, bool BF>
constexpr bool fast_path() {
    return BF ? F == IKV_FMT_BF16
              : (F == IKV_FMT_F16 || F == IKV_FMT_INT8 || F == IKV_FMT_FP8_E4M3 || F == IKV_FMT_INT4);
}

// ------------------------------------------------------------ warp state --
template <int D, int TR>
struct State {
    // S's k-steps come in pairs of 32 channels (kchan), P V's n-tiles of one
    // V load are 8, or all 4 at D = 32 (v_pairs' NC): D = 32 is the smallest.
    static_assert(D % 32 == 0 && D >= 32, "head_dim a multiple of 32");
    static_assert(TR == 8 || TR == 16, "8 or 16 query rows");
    static constexpr int kH = TR / 8;  // row halves: g, and g + 8 when TR == 16
    static constexpr int kW = D / 8;   // channels per lane per V row = P V n-tiles (4 at D = 32)
    // n-tiles per V load (v_pairs' NC): 8 contiguous channels (16/8/4 bytes a
    // row), or at D = 32 the lane's whole slice of kW = 4 (8/4/2 bytes).
    static constexpr int kVB = kW < 8 ? kW : 8;
    static_assert(kW % kVB == 0, "whole V loads");
    uint32_t qf[D / 16][2 * kH];       // Q fragments per k-step: {row g: 2c.., (row g+8), row g: 2c+8.., (row g+8)}
    float acc[kW][2 * kH];             // O fragments per n-tile
    float m[kH];                       // running max (base 2) of rows g, g + 8 (same in the row's 4 lanes)
    float l[kH];                       // this lane's part of the denominators
    int qpos[kH];                      // query positions (-1: padding row)
};

// Channel of the lane's Q/K value i (0..3) in k-step s.
__device__ __forceinline__ int kchan(int s, int c, int i) { return 32 * (s >> 1) + 8 * c + 4 * (s & 1) + i; }

// Q fragments from the CTA's fp32 query rows Qs[TR][D] (exact: Qs holds F16/BF16 values).
// qpos(r): position of CTA query row r (-1 for a padding row).
template <int D, int TR, bool BF, class QPos>
__device__ __forceinline__ void init_state(State<D, TR> &w, const float *Qs, int lane, QPos qpos) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int s = 0; s < D / 16; ++s)
#pragma unroll
        for (int h = 0; h < State<D, TR>::kH; ++h) {
            const float *q = Qs + (g + 8 * h) * D;
            const int d = kchan(s, c, 0);
            w.qf[s][h] = pack<BF>(q[d], q[d + 1]);
            w.qf[s][State<D, TR>::kH + h] = pack<BF>(q[d + 2], q[d + 3]);
        }
#pragma unroll
    for (int j = 0; j < State<D, TR>::kW; ++j)
#pragma unroll
        for (int e = 0; e < 2 * State<D, TR>::kH; ++e) w.acc[j][e] = 0.0f;
#pragma unroll
    for (int h = 0; h < State<D, TR>::kH; ++h) {
        w.m[h] = -INFINITY;
        w.l[h] = 0.0f;
        w.qpos[h] = qpos(g + 8 * h);
    }
}

// Per-channel K coefficients of 8 contiguous channels [ch, ch+8) as operand
// pairs, for the pair paths that apply them in f16 (INT8: scale; INT4: scale
// and min). Converted once per channel slice and reused for every K row the
// lane reads there (both n-tiles of a chunk).
struct KCoef {
    uint32_t s[4], m[4];
};
template <int D, int F, bool BF>
__device__ __forceinline__ void k_coefs(const float *Sc, int ch, KCoef &k) {
    if constexpr (fast_path<F, BF>() && F == IKV_FMT_INT8) {
        const float4 a = *reinterpret_cast<const float4 *>(Sc + ch), b = *reinterpret_cast<const float4 *>(Sc + ch + 4);
        k.s[0] = pack<false>(a.x, a.y), k.s[1] = pack<false>(a.z, a.w);
        k.s[2] = pack<false>(b.x, b.y), k.s[3] = pack<false>(b.z, b.w);
    } else if constexpr (fast_path<F, BF>() && F == IKV_FMT_INT4) {  // stored as halves: the pairs as they are
        using M = dec::Fmt<D, F>;
        const uint8_t *sb = reinterpret_cast<const uint8_t *>(Sc);
        const uint4 a = *reinterpret_cast<const uint4 *>(sb + 2 * ch);
        const uint4 b = *reinterpret_cast<const uint4 *>(sb + 2 * (M::kInt4KMin + ch));
        k.s[0] = a.x, k.s[1] = a.y, k.s[2] = a.z, k.s[3] = a.w;
        k.m[0] = b.x, k.m[1] = b.y, k.m[2] = b.z, k.m[3] = b.w;
    }
}

// 8 contiguous channels [ch, ch+8) of K row r as 4 operand pairs (0,1) (2,3)
// (4,5) (6,7), K scales applied (INT8/INT4 per channel, from kc on the pair
// paths; FP8's is applied to S).
template <int D, int F, bool BF>
__device__ __forceinline__ void k_pairs(const uint8_t *Karea, const float *Sc, const KCoef &kc, int r, int ch,
                                        uint32_t out[4]) {
    using M = dec::Fmt<D, F>;
    const uint8_t *src = at<D, F>(Karea, r, ch * M::kLaneBytes / 8);
    if constexpr (fast_path<F, BF>() && (F == IKV_FMT_F16 || F == IKV_FMT_BF16)) {
        const uint4 w = *reinterpret_cast<const uint4 *>(src);
        out[0] = w.x, out[1] = w.y, out[2] = w.z, out[3] = w.w;
    } else if constexpr (fast_path<F, BF>() && F == IKV_FMT_INT8) {
        const uint2 w = *reinterpret_cast<const uint2 *>(src);
        const uint32_t x0 = w.x ^ 0x80808080u, x1 = w.y ^ 0x80808080u;
        out[0] = from_h2(__hmul2(as_h2(i8pair_f16(x0, 0x4140)), as_h2(kc.s[0])));
        out[1] = from_h2(__hmul2(as_h2(i8pair_f16(x0, 0x4342)), as_h2(kc.s[1])));
        out[2] = from_h2(__hmul2(as_h2(i8pair_f16(x1, 0x4140)), as_h2(kc.s[2])));
        out[3] = from_h2(__hmul2(as_h2(i8pair_f16(x1, 0x4342)), as_h2(kc.s[3])));
    } else if constexpr (fast_path<F, BF>() && F == IKV_FMT_INT4) {
        // Byte j holds channels 2j (bits 0-3) and 2j+1 (bits 4-7): put byte j
        // of w at bits 0-7 and byte j of w >> 4 at bits 16-23 (one PRMT).
        const uint32_t w = *reinterpret_cast<const uint32_t *>(src), wh = w >> 4;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            out[j] = from_h2(__hfma2(as_h2(i4pair_f16(__byte_perm(w, wh, uint32_t(j | (4 + j) << 8)))),
                                     as_h2(kc.s[j]), as_h2(kc.m[j])));
    } else if constexpr (fast_path<F, BF>() && F == IKV_FMT_FP8_E4M3) {
        const uint2 w = *reinterpret_cast<const uint2 *>(src);
        out[0] = fp8pair_f16(w.x), out[1] = fp8pair_f16(w.x >> 16);
        out[2] = fp8pair_f16(w.y), out[3] = fp8pair_f16(w.y >> 16);
    } else {  // through fp32: raw value (x scale (+ min)), one rounding
        float x[8];
        dec::raw8<F>(src, x);
        if constexpr (F == IKV_FMT_INT8) {
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] *= Sc[ch + j];
        } else if constexpr (F == IKV_FMT_INT4) {
            float ks[8], km[8];
            dec::halves8(reinterpret_cast<const uint8_t *>(Sc), ch, ks);
            dec::halves8(reinterpret_cast<const uint8_t *>(Sc), M::kInt4KMin + ch, km);
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], ks[j], km[j]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) out[j] = pack<BF>(x[2 * j], x[2 * j + 1]);
    }
}

// V of tokens 4c..4c+3 at channels [ch, ch+NC) as B pairs of NC n-tiles
// (NC = 8, or 4 at D = 32: State::kVB): lo[j] = (V[4c][ch+j], V[4c+1][ch+j]),
// hi[j] = (V[4c+2][..], V[4c+3][..]), V scales applied. One load per row of
// NC x (2, 1, 1, 1/2) bytes (F16/BF16, FP8, INT8, INT4), aligned to its size
// (ch is a multiple of NC).
template <int D, int F, bool BF, int NC = 8>
__device__ __forceinline__ void v_pairs(const uint8_t *Varea, const float *Sc, int c, int ch, uint32_t lo[NC],
                                        uint32_t hi[NC]) {
    static_assert(NC == 8 || NC == 4, "8 channels, or the 4 of a lane at D = 32");
    using M = dec::Fmt<D, F>;
    const int t0 = 4 * c, boff = ch * M::kLaneBytes / 8;
    if constexpr (fast_path<F, BF>() && (F == IKV_FMT_F16 || F == IKV_FMT_BF16)) {
        constexpr int kWords = NC / 2;  // 2 channels per 32-bit word
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
            uint32_t wa[kWords], wb[kWords];
            dec::load_words<4 * kWords>(at<D, F>(Varea, t0 + 2 * hp, boff), wa);
            dec::load_words<4 * kWords>(at<D, F>(Varea, t0 + 2 * hp + 1, boff), wb);
            uint32_t *o = hp ? hi : lo;
#pragma unroll
            for (int k = 0; k < kWords; ++k) {
                o[2 * k] = __byte_perm(wa[k], wb[k], 0x5410);
                o[2 * k + 1] = __byte_perm(wa[k], wb[k], 0x7632);
            }
        }
    } else if constexpr (fast_path<F, BF>() && (F == IKV_FMT_INT8 || F == IKV_FMT_FP8_E4M3)) {
        constexpr int kWords = NC / 4;  // 4 channels per 32-bit word
        const float4 vs4 = F == IKV_FMT_INT8 ? *reinterpret_cast<const float4 *>(Sc + D + t0)
                                             : make_float4(Sc[1], Sc[1], Sc[1], Sc[1]);
        const __half2 sc[2] = {__floats2half2_rn(vs4.x, vs4.y), __floats2half2_rn(vs4.z, vs4.w)};
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
            uint32_t wa[kWords], wb[kWords];
            dec::load_words<4 * kWords>(at<D, F>(Varea, t0 + 2 * hp, boff), wa);
            dec::load_words<4 * kWords>(at<D, F>(Varea, t0 + 2 * hp + 1, boff), wb);
            if (F == IKV_FMT_INT8) {
#pragma unroll
                for (int k = 0; k < kWords; ++k) wa[k] ^= 0x80808080u, wb[k] ^= 0x80808080u;
            }
            uint32_t *o = hp ? hi : lo;
#pragma unroll
            for (int k = 0; k < kWords; ++k) {
                const uint32_t x01 = __byte_perm(wa[k], wb[k], 0x5140);  // a0 b0 a1 b1
                const uint32_t x23 = __byte_perm(wa[k], wb[k], 0x7362);  // a2 b2 a3 b3
                uint32_t p[4];
                if (F == IKV_FMT_INT8) {
                    p[0] = i8pair_f16(x01, 0x4140), p[1] = i8pair_f16(x01, 0x4342);
                    p[2] = i8pair_f16(x23, 0x4140), p[3] = i8pair_f16(x23, 0x4342);
                } else {
                    p[0] = fp8pair_f16(x01), p[1] = fp8pair_f16(x01 >> 16);
                    p[2] = fp8pair_f16(x23), p[3] = fp8pair_f16(x23 >> 16);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) o[4 * k + e] = from_h2(__hmul2(as_h2(p[e]), sc[hp]));
            }
        }
    } else if constexpr (fast_path<F, BF>() && F == IKV_FMT_INT4) {
        // Token pair (a, b) = rows t0 + 2hp, +1; channels ch..ch+NC-1 lie in
        // one 32-channel group, so each token has one (scale, min) here.
        constexpr int G = M::kG;
        const int grp = ch / 32;
        const __half *sh = reinterpret_cast<const __half *>(Sc);  // halves (decode_formats.cuh)
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
            const int ta = t0 + 2 * hp;
            const __half2 sc = __halves2half2(sh[M::kInt4VScale + ta * G + grp], sh[M::kInt4VScale + (ta + 1) * G + grp]);
            const __half2 mn = __halves2half2(sh[M::kInt4VMin + ta * G + grp], sh[M::kInt4VMin + (ta + 1) * G + grp]);
            uint32_t wa[1], wb[1];  // NC nibbles: 4 bytes, or 2 at D = 32 (the upper half zero)
            dec::load_words<NC / 2>(at<D, F>(Varea, ta, boff), wa);
            dec::load_words<NC / 2>(at<D, F>(Varea, ta + 1, boff), wb);
            uint32_t *o = hp ? hi : lo;
#pragma unroll
            for (int k = 0; k < NC / 2; ++k) {
                // a.byte k at bits 0-7, b.byte k at bits 16-23
                const uint32_t x = __byte_perm(wa[0], wb[0], uint32_t(k | (4 + k) << 8));
                o[2 * k] = from_h2(__hfma2(as_h2(i4pair_f16(x)), sc, mn));
                o[2 * k + 1] = from_h2(__hfma2(as_h2(i4pair_f16(x >> 4)), sc, mn));
            }
        }
    } else {  // through fp32
        float x[4][NC];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            dec::raw<F, NC>(at<D, F>(Varea, t0 + t, boff), x[t]);
            if constexpr (F == IKV_FMT_FP8_E4M3 || F == IKV_FMT_INT8) {
                const float s = F == IKV_FMT_FP8_E4M3 ? Sc[1] : Sc[D + t0 + t];
#pragma unroll
                for (int j = 0; j < NC; ++j) x[t][j] *= s;
            } else if constexpr (F == IKV_FMT_INT4) {
                constexpr int G = M::kG;
                const int grp = ch / 32;
                const uint8_t *sb = reinterpret_cast<const uint8_t *>(Sc);
                const float a = dec::half_at(sb, M::kInt4VScale + (t0 + t) * G + grp),
                            b = dec::half_at(sb, M::kInt4VMin + (t0 + t) * G + grp);
#pragma unroll
                for (int j = 0; j < NC; ++j) x[t][j] = fmaf(x[t][j], a, b);
            }
        }
#pragma unroll
        for (int j = 0; j < NC; ++j) lo[j] = pack<BF>(x[0][j], x[1][j]), hi[j] = pack<BF>(x[2][j], x[3][j]);
    }
}

// One chunk: S = Q K^T, masked online softmax (base 2), O += P V. Format F,
// warp-uniform. Rows [r0, r1) of the chunk hold data; chunk row i sits at
// position pos + i. qs = scale*log2(e); cap2/inv_cap2: softcap (0 = off).
// kChunkSum (attention feedback): cl[h] += the lane's part of this chunk's
// softmax sum of row g + 8h, relative to the row's max after the chunk (the
// chunk rescales once, before its weights, so no rescale of cl is needed).
template <int D, int TR, bool BF, int F, bool kChunkSum = false>
__device__ __forceinline__ void compute_chunk(const uint8_t *slot, int r0, int r1, uint32_t pos, State<D, TR> &w,
                                              int lane, float qs, float cap2, float inv_cap2, float *cl = nullptr) {
    using M = dec::Fmt<D, F>;
    using St = State<D, TR>;
    constexpr int kH = St::kH, kW = St::kW;
    const int g = lane >> 2, c = lane & 3;
    const uint8_t *Karea = slot, *Varea = slot + kChunkRows * M::kRowBytes;
    const float *Sc = reinterpret_cast<const float *>(slot + M::kScaleOff);

    // ---- S: two n-tiles of 8 tokens; lane's columns are tokens 4c + 2nt + {0,1}.
    // The channel slice u is the outer loop so its K coefficients are
    // converted once for both n-tiles.
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int u = 0; u < D / 32; ++u) {
        KCoef kc;
        k_coefs<D, F, BF>(Sc, 32 * u + 8 * c, kc);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int kr = 2 * g - (g & 1) + 2 * nt;
            uint32_t b[4];
            k_pairs<D, F, BF>(Karea, Sc, kc, kr, 32 * u + 8 * c, b);
            mma<BF>(s[nt], w.qf[2 * u][0], kH > 1 ? w.qf[2 * u][1] : 0u, w.qf[2 * u][kH], kH > 1 ? w.qf[2 * u][3] : 0u,
                    b[0], b[1]);
            mma<BF>(s[nt], w.qf[2 * u + 1][0], kH > 1 ? w.qf[2 * u + 1][1] : 0u, w.qf[2 * u + 1][kH],
                    kH > 1 ? w.qf[2 * u + 1][3] : 0u, b[2], b[3]);
        }
    }
    const float sc = F == IKV_FMT_FP8_E4M3 ? qs * Sc[0] : qs;

    // ---- masked online softmax per row (h: row g + 8h; values e = 2h, 2h+1 of each n-tile).
    float p[2][4];
    bool grow = false;
    float alpha[kH];
#pragma unroll
    for (int h = 0; h < kH; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int row = 4 * c + 2 * nt + e;
                float x = s[nt][2 * h + e] * sc;
                if (cap2 > 0.0f) x = (x - x) + cap2 * tanhf(x * inv_cap2);  // x - x: NaN for an infinite logit (a non-finite q)
                const bool ok = row >= r0 && row < r1 && int(pos) + row <= w.qpos[h];
                x = ok ? x : -INFINITY;
                s[nt][2 * h + e] = x;
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
        const float mn = fmaxf(w.m[h], mx);
        alpha[h] = mn == w.m[h] ? 1.0f : exp2_approx(w.m[h] - mn);  // m = -inf: 0
        grow |= mn != w.m[h];
        w.m[h] = mn;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = s[nt][2 * h + e];
                const float pe = x == -INFINITY ? 0.0f : exp2_approx(x - mn);
                p[nt][2 * h + e] = pe;
                w.l[h] = w.l[h] * (e == 0 && nt == 0 ? alpha[h] : 1.0f) + pe;
                if constexpr (kChunkSum) cl[h] += pe;
            }
    }
    if (__any_sync(0xFFFFFFFFu, grow)) {
#pragma unroll
        for (int j = 0; j < kW; ++j)
#pragma unroll
            for (int h = 0; h < kH; ++h) w.acc[j][2 * h] *= alpha[h], w.acc[j][2 * h + 1] *= alpha[h];
    }

    // ---- O += P V: A = P (k = tokens in the permuted order), B = V pairs.
    const uint32_t a0 = pack<BF>(p[0][0], p[0][1]), a2 = pack<BF>(p[1][0], p[1][1]);
    const uint32_t a1 = kH > 1 ? pack<BF>(p[0][2], p[0][3]) : 0u, a3 = kH > 1 ? pack<BF>(p[1][2], p[1][3]) : 0u;
    // V in loads of kVB n-tiles: 8 (kW / 8 loads per row), or at D = 32 the
    // lane's whole slice of kW = 4 channels in one load per row.
    constexpr int kVB = St::kVB;
#pragma unroll
    for (int jb = 0; jb < kW / kVB; ++jb) {
        uint32_t lo[kVB], hi[kVB];
        v_pairs<D, F, BF, kVB>(Varea, Sc, c, kW * g + kVB * jb, lo, hi);
#pragma unroll
        for (int j = 0; j < kVB; ++j) {
            const int n = kVB * jb + j;  // the n-tile
            float d4[4] = {w.acc[n][0], w.acc[n][1], kH > 1 ? w.acc[n][2] : 0.0f, kH > 1 ? w.acc[n][3] : 0.0f};
            mma<BF>(d4, a0, a1, a2, a3, lo[j], hi[j]);
            w.acc[n][0] = d4[0], w.acc[n][1] = d4[1];
            if (kH > 1) w.acc[n][2] = d4[2], w.acc[n][3] = d4[3];
        }
    }
}

// Park the warp's (acc, m, l) as [TR][D] acc, [TR] m, [TR] l floats in red
// (the layout the kernel's CTA merge reads).
template <int D, int TR>
__device__ __forceinline__ void finish(State<D, TR> &w, float *red, int lane) {
    constexpr int kH = State<D, TR>::kH, kW = State<D, TR>::kW;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int h = 0; h < kH; ++h) {
        w.l[h] += __shfl_xor_sync(0xFFFFFFFFu, w.l[h], 1);
        w.l[h] += __shfl_xor_sync(0xFFFFFFFFu, w.l[h], 2);
        float *row = red + (g + 8 * h) * D;
#pragma unroll
        for (int j = 0; j < kW; ++j) {
            row[kW * (2 * c) + j] = w.acc[j][2 * h];
            row[kW * (2 * c + 1) + j] = w.acc[j][2 * h + 1];
        }
        if (c == 0) red[TR * D + g + 8 * h] = w.m[h], red[TR * D + TR + g + 8 * h] = w.l[h];
    }
}

}  // namespace tc
}  // namespace cuda
}  // namespace ikv
