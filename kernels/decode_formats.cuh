// Per-format pieces of the decode kernel (kernels/decode_attention.cu): the
// warp's cp.async copy of one 16-row chunk of a sub-page into a shared-memory
// slot, and the dequantization of one lane's 8 channels of a row from it.
// Everything is templated on the format, so the kernel switches once per chunk
// (warp-uniform) and the inner loops carry no format branches.
//
// A slot holds, for chunk rows 0..15 (page rows c0..c0+15):
//   K rows  [16][row_bytes]         at 0
//   V rows  [16][row_bytes]         at 16 * row_bytes
//   scales  (format dependent)      at 32 * row_bytes, as stored:
//     FP8   floats [0] = K scale, [1] = V scale
//     INT8  floats [0, D) K scale per channel, [D, D+16) V scale per chunk row
//     INT4  halves [0, D) K scale, [D, 2D) K min, [2D, 2D+16G) V scale [row][G], then V min [row][G]
//           (the kInt4* offsets below)
// Rows outside the chunk's bounds are zero-filled by the copy (cp.async with
// source size 0 reads nothing), so every value the kernel reads is finite.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "common/page_format.hpp"

namespace ikv {
namespace cuda {
namespace dec {

constexpr int kChunkRows = 16;  // rows of one pipeline stage

// 16-byte asynchronous copy; ok == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool ok = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
#else
    *reinterpret_cast<uint4 *>(smem) = ok ? *reinterpret_cast<const uint4 *>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <int D, int F>
struct Fmt {
    static constexpr int kRowBytes = int(row_bytes(ikv_format(F), D));
    static constexpr int kScaleOff = 2 * kChunkRows * kRowBytes;  // bytes from the slot base
    static constexpr int kLaneBytes = kRowBytes / (D / 8);        // bytes of one lane's 8 channels
    static constexpr int kG = int(int4_v_groups(D));
    // INT4's metadata in a slot, in halves from the scale offset.
    static constexpr int kInt4KMin = D, kInt4VScale = 2 * D, kInt4VMin = 2 * D + kChunkRows * kG;
    // Every row is whole 16-byte pieces (the cp.async unit): D = 32 gives the
    // narrowest, one piece per INT4 row (D/2 = 16 bytes), two per INT8/FP8
    // row, four per F16/BF16 row. An 8-channel slice of INT4 is 4 bytes.
    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "head_dim 32, 64, 128 or 256");
    static_assert(kRowBytes % 16 == 0 && kLaneBytes >= 4, "rows of whole 16-byte pieces");
};

// XOR swizzle of the 16-byte pieces of a slot's K and V rows, for the
// tensor-core path (kernels/decode_mma.cuh): piece p of chunk row r is stored
// at piece p ^ swizzle(r). Its lanes read K rows {0,1,4,5,..} and V rows
// {4c+i} at the same column, which without it land in the same banks (rows
// are 16..512 bytes). The per-row XOR is linear in r's bits,
// x0*r0 ^ x1*r1 ^ x2*r2 ^ x3*r3, with the x chosen by an exhaustive search
// over both read patterns (wavefronts per load minimal: e.g. D=128 F16
// 192 -> 64, INT8 128 -> 32, INT4 64 -> 24 per chunk).
// Nibbles of the code: x0 | x1 << 4 | x2 << 8 | x3 << 12; rows: D = 32, 64,
// 128, 256; columns: 2-byte, 1-byte, half-byte elements.
// D = 32: rows of 64, 32, 16 bytes (4, 2, 1 pieces: every x is below the
// piece count), narrower than the 128-byte bank line, so a row cannot leave
// its part of the line and some conflicts stay whatever the code. Searched
// over every code with a bank model (16-byte loads served per quarter warp,
// 8-byte per half warp, narrower per warp; distinct 4-byte words per bank;
// the model ranks each code of D = 64 and 128 above among its row's best):
//   F16/BF16 0x0200 (x2 = 2): 40 -> 24 wavefronts per chunk. K (2 loads of
//     16 bytes) is conflict-free either way (rows 4k, 4k+1 of a quarter warp
//     fill both halves of a line); V (4 loads of 8 bytes: W = 4 channels)
//     reads rows 4c+t, all in the same 64-byte half of the line, and x2
//     moves the rows of odd c onto the other two pieces of that half: 8 -> 4
//     wavefronts a load, the floor for 64-byte rows.
//   INT8/FP8 0: 24 with every code (rows 0/4 and 1/5 of a half warp share a
//     32-byte quarter of the line for K; V's rows 4c+t all share one).
//   INT4 0: one piece, nothing to permute (12 wavefronts).
template <int D, int F>
__host__ __device__ constexpr uint32_t swizzle_code() {
    constexpr int cls = (F == IKV_FMT_F16 || F == IKV_FMT_BF16) ? 0 : F == IKV_FMT_INT4 ? 2 : 1;
    static_assert(D == 32 || D == 64 || D == 128 || D == 256, "a swizzle is searched per head_dim");
    constexpr uint32_t kCodes[4][3] = {
        {0x0200, 0x0000, 0x0000}, {0x4204, 0x0200, 0x1000}, {0x4104, 0x2402, 0x2100}, {0x2104, 0x1402, 0x4201}};
    return kCodes[D == 32 ? 0 : D == 64 ? 1 : D == 128 ? 2 : 3][cls];
}
// Every XOR term must stay inside the row's pieces (the swizzle permutes a
// row's own 16-byte pieces; rows hold a power of two of them).
template <int D, int F>
__host__ __device__ constexpr bool swizzle_fits() {
    constexpr uint32_t c = swizzle_code<D, F>(), n = uint32_t(Fmt<D, F>::kRowBytes / 16);
    return (c & 0xF) < n && ((c >> 4) & 0xF) < n && ((c >> 8) & 0xF) < n && ((c >> 12) & 0xF) < n && (n & (n - 1)) == 0;
}
template <int D, int F>
__device__ __forceinline__ int swizzle(int r) {
    constexpr uint32_t c = swizzle_code<D, F>();
    return int(((r & 1) ? c & 0xF : 0) ^ ((r & 2) ? (c >> 4) & 0xF : 0) ^ ((r & 4) ? (c >> 8) & 0xF : 0) ^
               ((r & 8) ? (c >> 12) & 0xF : 0));
}

// Copy chunk rows [lo, hi) (page rows; the chunk starts at page row c0) of the
// sub-page at `sub` (page of P rows) into `slot`, by the 32 lanes of a warp.
// kSwz: store the rows' pieces swizzled (tensor-core path).
template <int D, int F, bool kSwz = false>
__device__ __forceinline__ void copy_chunk(const uint8_t *sub, int P, int c0, int lo, int hi, uint8_t *slot,
                                           int lane) {
    using M = Fmt<D, F>;
    constexpr int kPieces = M::kRowBytes / 16;  // 16-byte pieces per row (a power of two; 1 for INT4 at D = 32)
    constexpr int kN = kChunkRows * kPieces;
    static_assert(!kSwz || swizzle_fits<D, F>(), "swizzle code out of the row's pieces");
    const SubpageLayout L = subpage_layout(ikv_format(F), uint32_t(P), uint32_t(D));
#pragma unroll
    for (int idx = lane; idx < kN; idx += 32) {
        const int cr = idx / kPieces, r = c0 + cr;
        const bool ok = r >= lo && r < hi;
        const uint64_t off = ok ? uint64_t(r) * M::kRowBytes + uint64_t(idx % kPieces) * 16 : 0;
        const int dst = kSwz ? cr * kPieces + ((idx % kPieces) ^ swizzle<D, F>(cr)) : idx;
        cp_async16(slot + dst * 16, sub + L.k + off, ok);
        cp_async16(slot + kChunkRows * M::kRowBytes + dst * 16, sub + L.v + off, ok);
    }
    uint8_t *s = slot + M::kScaleOff;
    if (F == IKV_FMT_FP8_E4M3) {
        if (lane == 0) cp_async16(s, sub + L.k_scale);  // K scale, V scale (one 16-byte section)
    } else if (F == IKV_FMT_INT8) {
        constexpr int kK = D / 4;  // pieces of the per-channel K scales
        for (int idx = lane; idx < kK + 4; idx += 32) {
            if (idx < kK) {
                cp_async16(s + idx * 16, sub + L.k_scale + idx * 16);
            } else {
                const int k = idx - kK, r = c0 + 4 * k;  // 4 token scales per piece
                cp_async16(s + 4 * D + k * 16, sub + L.v_scale + (r < P ? 4 * r : 0), r < P);
            }
        }
    } else if (F == IKV_FMT_INT4) {
        // 16-byte pieces of halves: K scale, K min (D/8 each); V scale, V min
        // (the chunk's 16 rows x G groups: 2G each).
        constexpr int kK = D / 8, G = M::kG, kV = 2 * G;
        for (int idx = lane; idx < 2 * kK + 2 * kV; idx += 32) {
            if (idx < 2 * kK) {
                const uint64_t src = idx < kK ? L.k_scale + idx * 16 : L.k_min + (idx - kK) * 16;
                cp_async16(s + idx * 16, sub + src);
            } else {
                const int k = (idx - 2 * kK) % kV, which = (idx - 2 * kK) / kV;
                const int r = c0 + 8 * k / G;  // first row of the piece's 8 halves
                const uint64_t src = (which == 0 ? L.v_scale : L.v_min) + 2ull * (uint64_t(c0) * G + 8 * k);
                cp_async16(s + 2 * (which == 0 ? M::kInt4VScale : M::kInt4VMin) + k * 16, sub + (r < P ? src : 0),
                           r < P);
            }
        }
    }
}

// INT4 metadata in a slot (halves, kInt4* offsets from the scale offset):
// 8 consecutive halves from a 16-byte aligned address, and one half.
__device__ __forceinline__ void halves8(const uint8_t *scales, int i, float x[8]) {
    const uint4 w = *reinterpret_cast<const uint4 *>(scales + 2 * i);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        __half2_raw h;  // through the raw type, as raw<F16> (no type punning of the words)
        h.x = uint16_t(u[j] & 0xFFFFu);
        h.y = uint16_t(u[j] >> 16);
        const float2 f = __half22float2(__half2(h));
        x[2 * j] = f.x;
        x[2 * j + 1] = f.y;
    }
}
__device__ __forceinline__ float half_at(const uint8_t *scales, int i) {
    return __half2float(reinterpret_cast<const __half *>(scales)[i]);
}

// Exact small-integer to float: the byte / nibble becomes the mantissa of 2^23.
__device__ __forceinline__ float int8_lane(uint32_t w, int j) {  // byte j of w as int8
    return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7540u | uint32_t(j))) - 8388736.0f;
}
__device__ __forceinline__ float nibble(uint32_t w, int j) {  // nibble j of w, 0..15
    return __uint_as_float(0x4B000000u | ((w >> (4 * j)) & 0xFu)) - 8388608.0f;
}

// kBytes bytes at src (16-, 8-, 4- or 2-byte aligned) as little-endian 32-bit
// words in one load (2 bytes: the low half of w[0]).
template <int kBytes>
__device__ __forceinline__ void load_words(const uint8_t *src, uint32_t *w) {
    if constexpr (kBytes == 16) {
        const uint4 v = *reinterpret_cast<const uint4 *>(src);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kBytes == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(src);
        w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(src);
    } else {
        static_assert(kBytes == 2, "16, 8, 4 or 2 bytes");
        w[0] = *reinterpret_cast<const uint16_t *>(src);
    }
}

// One lane's N contiguous channels of a row (N = 8; N = 4 for the tensor-core
// V slices at D = 32, where a lane's P V columns are D/8 = 4 channels), before
// any scale (F16/BF16: the values; FP8: the E4M3 values; INT8: the integers;
// INT4: the nibbles). One load of N x (2, 1, 1, 1/2) bytes.
template <int F, int N = 8>
__device__ __forceinline__ void raw(const uint8_t *src, float x[N]) {
    static_assert(N == 8 || N == 4, "8 or 4 channels");
    if constexpr (F == IKV_FMT_F16 || F == IKV_FMT_BF16) {
        uint32_t u[N / 2];
        load_words<2 * N>(src, u);
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
            if constexpr (F == IKV_FMT_F16) {
                __half2_raw h;
                h.x = uint16_t(u[j] & 0xFFFFu);
                h.y = uint16_t(u[j] >> 16);
                const float2 v = __half22float2(__half2(h));
                x[2 * j] = v.x;
                x[2 * j + 1] = v.y;
            } else {
                x[2 * j] = __uint_as_float(u[j] << 16);
                x[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
            }
        }
    } else if constexpr (F == IKV_FMT_FP8_E4M3) {
        uint32_t u[N / 4];
        load_words<N>(src, u);
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
            const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((u[j / 2] >> (16 * (j % 2))) & 0xFFFFu);
            const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
            x[2 * j] = v.x;
            x[2 * j + 1] = v.y;
        }
    } else if constexpr (F == IKV_FMT_INT8) {
        uint32_t u[N / 4];
        load_words<N>(src, u);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < N / 4; ++k) x[4 * k + j] = int8_lane(u[k], j);
    } else {  // INT4
        uint32_t w[1];
        load_words<N / 2>(src, w);
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = nibble(w[0], j);
    }
}
// The common case: 8 channels (a 16/8/8/4-byte load).
template <int F>
__device__ __forceinline__ void raw8(const uint8_t *src, float x[8]) {
    raw<F, 8>(src, x);
}

}  // namespace dec

// fn(std::integral_constant<int, F>{}) for the page format f: one switch,
// warp-uniform, so the per-format code is compiled once per format.
template <class Fn>
__device__ __forceinline__ void with_format(int f, Fn &&fn) {
    switch (f) {
        case IKV_FMT_F16: fn(std::integral_constant<int, IKV_FMT_F16>{}); break;
        case IKV_FMT_BF16: fn(std::integral_constant<int, IKV_FMT_BF16>{}); break;
        case IKV_FMT_FP8_E4M3: fn(std::integral_constant<int, IKV_FMT_FP8_E4M3>{}); break;
        case IKV_FMT_INT8: fn(std::integral_constant<int, IKV_FMT_INT8>{}); break;
        default: fn(std::integral_constant<int, IKV_FMT_INT4>{}); break;
    }
}

}  // namespace cuda
}  // namespace ikv
