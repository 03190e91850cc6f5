// The byte layout of a KV page: the contract between the pool (which writes
// pages), the CPU decode kernels and the CUDA kernels (which read them).
// Header-only, usable from host C++ and from CUDA device code.
//
// A page holds page_size (P) tokens of one sequence for every layer (L) and
// kv-head (H), all in one storage format. It is L*H sub-pages followed by the
// key summaries:
//
//   page base
//   ├─ sub-page (layer 0, head 0)      subpage_bytes(fmt, P, D) bytes
//   ├─ sub-page (layer 0, head 1)
//   ├─ ...                              sub-page (l, h) at (l*H + h) * subpage_bytes
//   └─ summaries                        L*H records of 3*D bfloat16: k_min[D], k_max[D], k_mean[D]
//                                       (k_min rounded down, k_max up: they bound every stored key;
//                                       k_mean to nearest, one rounding; quant.hpp encode_summary)
//
// A sub-page is a sequence of sections, each starting on a 16-byte boundary
// (so kernels can use 16-byte vector loads; D is a multiple of 16):
//
//   F16, BF16  K[P][D] (2 B each)   V[P][D]
//   FP8_E4M3   K[P][D] (1 B)        V[P][D]        k_scale (f32), v_scale (f32)   (one per sub-page)
//   INT8       K[P][D] (int8)       V[P][D]        k_scale[D] (f32, per channel)  v_scale[P] (f32, per token)
//   INT4       K[P][D/2] (packed)   V[P][D/2]      k_scale[D], k_min[D] (f16)     v_scale[P][G], v_min[P][G] (f16)
//
// Numerics (docs/FORMATS.md gives the error bounds):
//   F16/BF16   round to nearest even; F16 saturates to +-65504, BF16 (finite inputs) to
//              its largest value 0x1.fep127.
//   FP8_E4M3   OCP E4M3 ("fn": max 448, no infinities). scale = min(absmax, 0x1.fcp127)/448
//              over the sub-page's K (resp. V), 1 if that is 0; code = e4m3(x/scale)
//              rounded to nearest even with saturation; x' = decode(code)*scale.
//   INT8       symmetric. s = min(absmax, 0x1.fcp127)/127 over the group (1 if that is 0);
//              q = clamp(rint(x/s), -127, 127); x' = q*s.
//              K groups: one channel over the page's tokens. V groups: one token.
//   INT4       asymmetric, 16-bit group parameters (176 B per token and
//              kv-head at D = 128, P = 16, against 224 with f32 ones):
//              m = min rounded down to an IEEE half, s = (max-m)/15 rounded
//              up to one (1 if max == m), both stored as halves, the inputs
//              clamped to +-65504 first (INT4 saturates like F16);
//              q = clamp(rint((x-m)/s), 0, 15); x' = q*s + m (quant.hpp int4_params).
//              K groups: one channel over the page's tokens. V groups: one token
//              and G = ceil(D/32) groups of 32 channels (the last may be shorter).
//              Packing: byte j of a row holds channel 2j in bits 0-3 and 2j+1 in bits 4-7.
//   rint() is round-half-to-even with a true division, on CPU and GPU alike, so
//   both backends write identical bytes for identical input.
//   Tokens of a page beyond its fill count are zero in every section.
#pragma once

#include <stdint.h>

#include "intentkv.h"

#if defined(__CUDACC__)
#define IKV_HD __host__ __device__ __forceinline__
#else
#define IKV_HD inline
#endif

namespace ikv {

constexpr uint32_t kPageAlign = 16;         // every section starts on this boundary
constexpr uint32_t kInt4VGroup = 32;        // channels per INT4 V scale group
constexpr uint32_t kDeadPage = 0xFFFFFFFFu; // block-table sentinel of an evicted page
constexpr float kFp8Max = 448.0f;

IKV_HD constexpr uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// ceil(D / 32) without the overflow of D + 31 (plan costs take any head_dim below 2^32).
IKV_HD constexpr uint32_t int4_v_groups(uint32_t D) { return D / kInt4VGroup + (D % kInt4VGroup != 0 ? 1u : 0u); }

// Bytes of one token row of K (or V) in a format (data only, no scales).
IKV_HD constexpr uint64_t row_bytes(ikv_format f, uint32_t D) {
    return f == IKV_FMT_F16 || f == IKV_FMT_BF16 ? 2ull * D
         : f == IKV_FMT_INT4                     ? D / 2ull
                                                 : 1ull * D;
}

// Offsets of the sections of one sub-page, in bytes from the sub-page base.
struct SubpageLayout {
    uint64_t k;        // K data
    uint64_t v;        // V data
    uint64_t k_scale;  // FP8: 1 float; INT8: D floats; INT4: D halves; F16/BF16: unused (= bytes)
    uint64_t k_min;    // INT4: D halves; else unused
    uint64_t v_scale;  // FP8: 1 float; INT8: P floats; INT4: P*G halves
    uint64_t v_min;    // INT4: P*G halves
    uint64_t bytes;    // total, a multiple of kPageAlign
};

IKV_HD SubpageLayout subpage_layout(ikv_format f, uint32_t P, uint32_t D) {
    SubpageLayout s{};
    const uint64_t data = align_up(row_bytes(f, D) * P, kPageAlign);
    s.k = 0;
    s.v = data;
    uint64_t off = 2 * data;
    s.k_scale = s.k_min = s.v_scale = s.v_min = off;
    if (f == IKV_FMT_FP8_E4M3) {
        s.k_scale = off;
        s.v_scale = off + 4;
        off += kPageAlign;
    } else if (f == IKV_FMT_INT8) {
        s.k_scale = off;
        off = align_up(off + 4ull * D, kPageAlign);
        s.v_scale = off;
        off = align_up(off + 4ull * P, kPageAlign);
    } else if (f == IKV_FMT_INT4) {
        const uint64_t G = int4_v_groups(D);
        s.k_scale = off;
        off = align_up(off + 2ull * D, kPageAlign);
        s.k_min = off;
        off = align_up(off + 2ull * D, kPageAlign);
        s.v_scale = off;
        off = align_up(off + 2ull * P * G, kPageAlign);
        s.v_min = off;
        off = align_up(off + 2ull * P * G, kPageAlign);
    }
    s.bytes = off;
    return s;
}

// The shape every page of a pool shares.
struct PageShape {
    uint32_t n_layers;   // L
    uint32_t n_kv_heads; // H
    uint32_t head_dim;   // D
    uint32_t page_size;  // P
};

IKV_HD uint64_t summary_record_bytes(const PageShape &s) { return 3ull * 2ull * s.head_dim; }
// Bytes query-aware scoring reads of one record: k_min and k_max.
IKV_HD uint64_t summary_bound_bytes(uint32_t head_dim) { return 2ull * 2ull * head_dim; }
// ... and with k_mean, as IKV_TOPK_SCORE_HYBRID reads them.
IKV_HD uint64_t summary_hybrid_bytes(uint32_t head_dim) { return 3ull * 2ull * head_dim; }

// Byte offset of sub-page (layer, head) inside a page of format f.
IKV_HD uint64_t subpage_offset(const PageShape &s, ikv_format f, uint32_t layer, uint32_t head) {
    return (uint64_t(layer) * s.n_kv_heads + head) * subpage_layout(f, s.page_size, s.head_dim).bytes;
}

// Byte offset of the key summary record (k_min, k_max, k_mean) of (layer, head).
IKV_HD uint64_t summary_offset(const PageShape &s, ikv_format f, uint32_t layer, uint32_t head) {
    return uint64_t(s.n_layers) * s.n_kv_heads * subpage_layout(f, s.page_size, s.head_dim).bytes +
           (uint64_t(layer) * s.n_kv_heads + head) * summary_record_bytes(s);
}

// Total bytes of a page in format f (what capacity accounting charges).
IKV_HD uint64_t page_bytes(const PageShape &s, ikv_format f) {
    return summary_offset(s, f, s.n_layers, 0);
}

// Bytes a decode reads from one sub-page for n tokens of K and V: the token
// rows plus the scales it needs (what bytes-read figures count).
IKV_HD uint64_t subpage_read_bytes(ikv_format f, uint32_t P, uint32_t D, uint32_t n_tokens) {
    const SubpageLayout s = subpage_layout(f, P, D);
    uint64_t scales = 0;
    if (f == IKV_FMT_FP8_E4M3) scales = 8;
    if (f == IKV_FMT_INT8) scales = 4ull * D + 4ull * n_tokens;
    if (f == IKV_FMT_INT4) scales = 4ull * D + 4ull * n_tokens * int4_v_groups(D);
    (void)s;
    return 2ull * row_bytes(f, D) * n_tokens + scales;
}

}  // namespace ikv
