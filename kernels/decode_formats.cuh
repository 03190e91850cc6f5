// Per-format pieces of the decode kernel (kernels/decode_attention.cu): the
// warp's cp.async copy of one 16-row chunk of a sub-page into a shared-memory
// slot, and the dequantization of one lane's 8 channels of a row from it.
// Everything is templated on the format, so the kernel switches once per chunk
// (warp-uniform) and the inner loops carry no format branches.
//
// A slot holds, for chunk rows 0..15 (page rows c0..c0+15):
//   K rows  [16][row_bytes]         at 0
//   V rows  [16][row_bytes]         at 16 * row_bytes
//   scales  (format dependent)      at 32 * row_bytes, as floats:
//     FP8   [0] = K scale, [1] = V scale
//     INT8  [0, D) K scale per channel, [D, D+16) V scale per chunk row
//     INT4  [0, D) K scale, [D, 2D) K min, [2D, 2D+16G) V scale [row][G], then V min [row][G]
// Rows outside the chunk's bounds are zero-filled by the copy (cp.async with
// source size 0 reads nothing), so every value the kernel reads is finite.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

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
};

// XOR swizzle of the 16-byte pieces of a slot's K and V rows, for the
// tensor-core path (kernels/decode_mma.cuh): piece p of chunk row r is stored
// at piece p ^ swizzle(r). Its lanes read K rows {0,1,4,5,..} and V rows
// {4c+i} at the same column, which without it land in the same banks (rows
// are 32..512 bytes, multiples of the 128-byte bank line). The per-row XOR is
// linear in r's bits, x0*r0 ^ x1*r1 ^ x2*r2 ^ x3*r3, with the x chosen by an
// exhaustive search over both read patterns (wavefronts per load minimal:
// e.g. D=128 F16 192 -> 64, INT8 128 -> 32, INT4 64 -> 24 per chunk).
// Nibbles of the code: x0 | x1 << 4 | x2 << 8 | x3 << 12; rows: D = 64, 128,
// 256; columns: 2-byte, 1-byte, half-byte elements.
template <int D, int F>
__host__ __device__ constexpr uint32_t swizzle_code() {
    constexpr int cls = (F == IKV_FMT_F16 || F == IKV_FMT_BF16) ? 0 : F == IKV_FMT_INT4 ? 2 : 1;
    constexpr uint32_t kCodes[3][3] = {{0x4204, 0x0200, 0x1000}, {0x4104, 0x2402, 0x2100}, {0x2104, 0x1402, 0x4201}};
    return kCodes[D == 64 ? 0 : D == 128 ? 1 : 2][cls];
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
    constexpr int kPieces = M::kRowBytes / 16;  // 16-byte pieces per row (a power of two)
    constexpr int kN = kChunkRows * kPieces;
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
        constexpr int kK = D / 4, G = M::kG, kV = 4 * G;  // pieces: K scale, K min; V scale, V min
        for (int idx = lane; idx < 2 * kK + 2 * kV; idx += 32) {
            if (idx < 2 * kK) {
                const uint64_t src = idx < kK ? L.k_scale + idx * 16 : L.k_min + (idx - kK) * 16;
                cp_async16(s + idx * 16, sub + src);
            } else {
                const int k = (idx - 2 * kK) % kV, which = (idx - 2 * kK) / kV;
                const int r = c0 + 4 * k / G;  // first row of the piece's 4 floats
                const uint64_t src = (which == 0 ? L.v_scale : L.v_min) + 4ull * (uint64_t(c0) * G + 4 * k);
                cp_async16(s + 8 * D + which * 64 * G + k * 16, sub + (r < P ? src : 0), r < P);
            }
        }
    }
}

// Exact small-integer to float: the byte / nibble becomes the mantissa of 2^23.
__device__ __forceinline__ float int8_lane(uint32_t w, int j) {  // byte j of w as int8
    return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7540u | uint32_t(j))) - 8388736.0f;
}
__device__ __forceinline__ float nibble(uint32_t w, int j) {  // nibble j of w, 0..15
    return __uint_as_float(0x4B000000u | ((w >> (4 * j)) & 0xFu)) - 8388608.0f;
}

// One lane's 8 channels of a row, before any scale (F16/BF16: the values;
// FP8: the E4M3 values; INT8: the integers; INT4: the nibbles).
template <int F>
__device__ __forceinline__ void raw8(const uint8_t *src, float x[8]) {
    if (F == IKV_FMT_F16 || F == IKV_FMT_BF16) {
        const uint4 w = *reinterpret_cast<const uint4 *>(src);
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (F == IKV_FMT_F16) {
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
    } else if (F == IKV_FMT_FP8_E4M3) {
        const uint2 w = *reinterpret_cast<const uint2 *>(src);
        const uint32_t u[2] = {w.x, w.y};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((u[j / 2] >> (16 * (j % 2))) & 0xFFFFu);
            const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
            x[2 * j] = v.x;
            x[2 * j + 1] = v.y;
        }
    } else if (F == IKV_FMT_INT8) {
        const uint2 w = *reinterpret_cast<const uint2 *>(src);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            x[j] = int8_lane(w.x, j);
            x[4 + j] = int8_lane(w.y, j);
        }
    } else {  // INT4
        const uint32_t w = *reinterpret_cast<const uint32_t *>(src);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = nibble(w, j);
    }
}

}  // namespace dec
}  // namespace cuda
}  // namespace ikv
