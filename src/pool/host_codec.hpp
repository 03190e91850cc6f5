// Faster host paths equivalent to quant.hpp's reference reader and writer:
// the sub-page layout and the format switch are hoisted out of the element
// loops. Every value computed is the same expression on the same operands as
// in read_subpage_row / write_subpage, so results are bit-identical.
#pragma once

#include <cstring>

#include "common/quant.hpp"

namespace ikv {

// The 256 E4M3 codes decoded once (e4m3_to_f32 is deterministic).
struct E4m3Table {
    float v[256];
    E4m3Table() {
        for (int c = 0; c < 256; ++c) v[c] = e4m3_to_f32(uint8_t(c));
    }
};

inline const E4m3Table &e4m3_table() {
    static const E4m3Table t;
    return t;
}

// n F16 values (bytes, any alignment) to fp32, equal to f16_to_f32 per
// element, in one branch-free loop: masks pick the normal, the zero or
// subnormal (m * 2^-24, exact) and the inf/NaN form, so it vectorizes
// whatever the values (a row with one zero used to take the per-element
// path), and no row is copied through a libc memcpy first (a fifth of the
// keys score's CPU pass, bench/RESULTS.md 6t).
inline void decode_f16(const uint8_t *src, uint64_t n, float *out) {
    for (uint64_t e = 0; e < n; ++e) {
        uint16_t x;
        std::memcpy(&x, src + 2 * e, 2);
        const uint32_t em = x & 0x7FFFu, sign = uint32_t(x & 0x8000u) << 16;
        const float tiny = float(em) * 0x1p-24f;
        uint32_t tiny_bits;
        std::memcpy(&tiny_bits, &tiny, 4);
        const uint32_t tiny_mask = 0u - uint32_t(em < 0x0400u), special_mask = 0u - uint32_t(em >= 0x7C00u);
        const uint32_t normal = (em << 13) + 0x38000000u, special = 0x7F800000u | ((em & 0x3FFu) << 13);
        const uint32_t bits =
            sign | (tiny_bits & tiny_mask) | (special & special_mask) | (normal & ~(tiny_mask | special_mask));
        std::memcpy(out + e, &bits, 4);
    }
}
inline void decode_row_f16(const uint16_t *h, uint32_t D, float *out) {
    decode_f16(reinterpret_cast<const uint8_t *>(h), D, out);
}

// Dequantize rows [t0, t0+n) of K (which == 0) or V (which == 1) of a
// sub-page; row i goes to out + i*stride. Equals read_subpage_row per row.
inline void dequant_rows(ikv_format f, uint32_t P, uint32_t D, const uint8_t *sub, int which, uint32_t t0,
                         uint32_t n, float *out, uint64_t stride) {
    const SubpageLayout L = subpage_layout(f, P, D);
    const uint64_t rb = row_bytes(f, D);
    const uint8_t *data = sub + (which == 0 ? L.k : L.v);
    const float *scales = reinterpret_cast<const float *>(sub + (which == 0 ? L.k_scale : L.v_scale));
    const uint16_t *scales_h = reinterpret_cast<const uint16_t *>(sub + (which == 0 ? L.k_scale : L.v_scale));
    const uint16_t *mins_h = reinterpret_cast<const uint16_t *>(sub + (which == 0 ? L.k_min : L.v_min));
    const uint32_t G = int4_v_groups(D);
    // INT4's half scales and minimums as floats, converted once: K's per channel
    // for every row, V's per row below (a conversion per element cost a CPU
    // one-token append most of its time).
    float i4s[256], i4m[256];
    if (f == IKV_FMT_INT4 && which == 0 && n > 0) {
        decode_row_f16(scales_h, D, i4s);
        decode_row_f16(mins_h, D, i4m);
    }
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t t = t0 + i;
        const uint8_t *row = data + t * rb;
        float *o = out + i * stride;
        switch (f) {
            case IKV_FMT_F16: decode_f16(row, D, o); break;
            case IKV_FMT_BF16: {
                uint16_t b[256];
                std::memcpy(b, row, 2ull * D);
                for (uint32_t d = 0; d < D; ++d) o[d] = bf16_to_f32(b[d]);
                break;
            }
            case IKV_FMT_FP8_E4M3: {
                const float *lut = e4m3_table().v;
                const float s = scales[0];
                for (uint32_t d = 0; d < D; ++d) o[d] = lut[row[d]] * s;
                break;
            }
            case IKV_FMT_INT8:
                if (which == 0)
                    for (uint32_t d = 0; d < D; ++d) o[d] = float(int8_t(row[d])) * scales[d];
                else
                    for (uint32_t d = 0; d < D; ++d) o[d] = float(int8_t(row[d])) * scales[t];
                break;
            case IKV_FMT_INT4:
                if (which == 1)
                    for (uint32_t g = 0; g < G; ++g)
                        for (uint32_t d = g * kInt4VGroup; d < D && d < (g + 1) * kInt4VGroup; ++d)
                            i4s[d] = f16_to_f32(scales_h[t * G + g]), i4m[d] = f16_to_f32(mins_h[t * G + g]);
                for (uint32_t d = 0; d < D; ++d) {
                    const uint32_t q = d & 1 ? row[d / 2] >> 4 : row[d / 2] & 0xFu;
                    o[d] = float(q) * i4s[d] + i4m[d];
                }
                break;
            default: break;
        }
    }
}

// One row of D floats to F16 / BF16, equal to f32_to_f16 / f32_to_bf16 per
// element. F16: when every |x| is a normal half below the saturation bound
// (the usual case), the reference's rounding arithmetic runs without
// branches so the loop vectorizes; otherwise the reference runs per element.
inline void encode_row_f16(const float *x, uint32_t D, uint16_t *out) {
    uint32_t bits[256];
    std::memcpy(bits, x, 4ull * D);
    uint32_t in_range = 1;
    for (uint32_t d = 0; d < D; ++d) {
        const uint32_t ax = bits[d] & 0x7FFFFFFFu;
        in_range &= uint32_t(ax >= 0x38800000u) & uint32_t(ax < 0x477FF000u);
    }
    if (!in_range) {
        for (uint32_t d = 0; d < D; ++d) out[d] = f32_to_f16(x[d]);
        return;
    }
    for (uint32_t d = 0; d < D; ++d) {
        const uint32_t sign = (bits[d] >> 16) & 0x8000u, ax = bits[d] & 0x7FFFFFFFu;
        out[d] = uint16_t(sign | ((ax + 0xC8000FFFu + ((ax >> 13) & 1u)) >> 13));
    }
}

inline void encode_row_bf16(const float *x, uint32_t D, uint16_t *out) {
    uint32_t bits[256];
    std::memcpy(bits, x, 4ull * D);
    for (uint32_t d = 0; d < D; ++d) {
        const uint32_t u = bits[d];
        // f32_to_bf16 (quant.hpp) without branches: NaN kept, a finite value rounding to +-inf saturates
        const uint16_t nan = uint16_t((u >> 16) | 0x40u), rounded = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        const bool overflow = (rounded & 0x7F80u) == 0x7F80u && (u & 0x7FFFFFFFu) != 0x7F800000u;
        const uint16_t sat = overflow ? uint16_t((rounded & 0x8000u) | kBf16MaxBits) : rounded;
        out[d] = (u & 0x7FFFFFFFu) > 0x7F800000u ? nan : sat;
    }
}

// Write rows [t0, n_valid) of K and V of an F16 or BF16 sub-page from fp32
// rows (row r at k + r*row_stride) and zero rows [n_valid, P); rows below t0
// stay as they are. With t0 == 0 this stores exactly what write_subpage does
// (these formats have no scales and no padding: 2*D*P is a multiple of 16).
// zero_tail = false skips zeroing rows [n_valid, P) where they are known zero.
inline void encode_rows_16(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v, uint64_t row_stride,
                           uint32_t t0, uint32_t n_valid, uint8_t *sub, bool zero_tail = true) {
    const SubpageLayout L = subpage_layout(f, P, D);
    const uint64_t rb = row_bytes(f, D);
    for (int which = 0; which < 2; ++which) {
        const float *src = which == 0 ? k : v;
        uint8_t *data = sub + (which == 0 ? L.k : L.v);
        for (uint32_t t = t0; t < n_valid; ++t) {
            uint16_t b[256];
            if (f == IKV_FMT_F16)
                encode_row_f16(src + t * row_stride, D, b);
            else
                encode_row_bf16(src + t * row_stride, D, b);
            std::memcpy(data + t * rb, b, 2ull * D);
        }
        if (zero_tail && n_valid < P) std::memset(data + n_valid * rb, 0, (P - n_valid) * rb);
    }
}

// fp32 -> E4M3 code, equal to f32_to_e4m3 for |x| in [2^-6, 448): rounding
// the mantissa to 3 bits (nearest even) on the float's bits carries into the
// exponent by itself; codes above 0x7E saturate as in the reference.
inline uint8_t e4m3_normal_code(uint32_t bits) {
    const uint32_t a = bits & 0x7FFFFFFFu;
    uint32_t code = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    code = code > 0x7Eu ? 0x7Eu : code;
    return uint8_t(((bits >> 24) & 0x80u) | code);
}

// fmaxf(m, |x|) for m >= 0: both operands are non-negative, so a comparison
// gives the same bits without a libm call (x is finite in the pool).
inline float max_abs(float m, float x) {
    const float a = fabsf(x);
    return a > m ? a : m;
}
// fminf / fmaxf where the operands differ; equal operands (signed zeros) and
// NaN go to the library functions so the result is theirs bit for bit. The
// calls go through volatile pointers: C leaves the sign of fmin(+0, -0)
// unspecified, so the compiler may otherwise fold them to either operand.
inline float libm_fminf(float a, float b) {
    static float (*volatile fn)(float, float) = fminf;
    return fn(a, b);
}
inline float libm_fmaxf(float a, float b) {
    static float (*volatile fn)(float, float) = fmaxf;
    return fn(a, b);
}
inline float min_exact(float lo, float x) { return x < lo ? x : (lo < x ? lo : libm_fminf(lo, x)); }
inline float max_exact(float hi, float x) { return x > hi ? x : (hi > x ? hi : libm_fmaxf(hi, x)); }

// ---- the quantized formats' writers, in pieces ----
// Each piece is one loop of write_subpage's (quant.hpp) over a token range,
// with the same per-element operations, so a page written in pieces holds
// the same bytes. The folds (running |x| maxima, minima, maxima) run in token
// order from a given start, so folding rows [0, t) and then [t, n) gives the
// fold of [0, n): the incremental tail append (tail_append.hpp) relies on it.

// Running max |x| over rows [t0, t1), all channels, from m (FP8's one scale).
inline float fold_absmax(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, float m) {
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t d = 0; d < D; ++d) m = max_abs(m, src[t * stride + d]);
    return m;
}
// Per-channel running max |x| over rows [t0, t1) (INT8 K).
inline void fold_absmax_channels(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1,
                                 float *amax) {
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t d = 0; d < D; ++d) amax[d] = max_abs(amax[d], src[t * stride + d]);
}
// Per-channel running min and max over rows [t0, t1) (INT4 K).
inline void fold_range_channels(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, float *lo,
                                float *hi) {
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t d = 0; d < D; ++d) {
            lo[d] = min_exact(lo[d], src[t * stride + d]);
            hi[d] = max_exact(hi[d], src[t * stride + d]);
        }
}

// FP8 codes of rows [t0, t1) at scale s.
inline void fp8_rows(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, float s,
                     uint8_t *data, uint64_t rb) {
    for (uint32_t t = t0; t < t1; ++t) {
        float y[256];
        uint32_t bits[256], normal = 1;
        for (uint32_t d = 0; d < D; ++d) y[d] = src[t * stride + d] / s;
        std::memcpy(bits, y, 4ull * D);
        for (uint32_t d = 0; d < D; ++d) {
            const uint32_t a = bits[d] & 0x7FFFFFFFu;
            normal &= uint32_t(a >= 0x3C800000u) & uint32_t(a < 0x43E00000u);  // [2^-6, 448)
        }
        uint8_t *row = data + t * rb;
        if (normal)
            for (uint32_t d = 0; d < D; ++d) row[d] = e4m3_normal_code(bits[d]);
        else
            for (uint32_t d = 0; d < D; ++d) row[d] = f32_to_e4m3(y[d]);
    }
}
// INT8 K codes of rows [t0, t1) at per-channel scales.
inline void int8_k_rows(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1,
                        const float *scales, uint8_t *data, uint64_t rb) {
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t d = 0; d < D; ++d) data[t * rb + d] = uint8_t(quant_int8(src[t * stride + d], scales[d]));
}
// INT8 V: each row of [t0, t1) gets its own scale (scales[t]) and codes.
inline void int8_v_rows(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, float *scales,
                        uint8_t *data, uint64_t rb) {
    for (uint32_t t = t0; t < t1; ++t) {
        float amax = 0.0f;
        for (uint32_t d = 0; d < D; ++d) amax = max_abs(amax, src[t * stride + d]);
        scales[t] = int8_scale(amax);
        for (uint32_t d = 0; d < D; ++d) data[t * rb + d] = uint8_t(quant_int8(src[t * stride + d], scales[t]));
    }
}
// INT4 K group parameters from the per-channel ranges (int4_params): the
// values the codes use (mins, scales) and the halves stored (mins_h, scales_h).
// An empty page (n_valid == 0) gets the parameters of an all-zero channel.
inline void int4_k_params(const float *lo, const float *hi, uint32_t D, uint32_t n_valid, float *mins, float *scales,
                          uint16_t *mins_h, uint16_t *scales_h) {
    for (uint32_t d = 0; d < D; ++d) {
        const Int4Params g = n_valid == 0 ? int4_params(0.0f, 0.0f) : int4_params(lo[d], hi[d]);
        mins[d] = g.min, scales[d] = g.scale, mins_h[d] = g.min_h, scales_h[d] = g.scale_h;
    }
}
// INT4 K codes of rows [t0, t1) at per-channel minima and scales, two
// channels per byte (whole bytes written).
inline void int4_k_rows(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, const float *mins,
                        const float *scales, uint8_t *data, uint64_t rb) {
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t d = 0; d < D; d += 2) {
            const uint8_t q0 = quant_int4(src[t * stride + d], mins[d], scales[d]);
            const uint8_t q1 = quant_int4(src[t * stride + d + 1], mins[d + 1], scales[d + 1]);
            data[t * rb + d / 2] = uint8_t(q0 | (q1 << 4));
        }
}
// INT4 V: each row of [t0, t1) gets per-group minima and scales (groups of
// kInt4VGroup channels, stored as halves) and codes.
inline void int4_v_rows(const float *src, uint64_t stride, uint32_t D, uint32_t t0, uint32_t t1, uint16_t *scales_h,
                        uint16_t *mins_h, uint8_t *data, uint64_t rb) {
    const uint32_t G = int4_v_groups(D);
    for (uint32_t t = t0; t < t1; ++t)
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t d0 = g * kInt4VGroup, d1 = d0 + kInt4VGroup < D ? d0 + kInt4VGroup : D;
            float lo = INFINITY, hi = -INFINITY;
            for (uint32_t d = d0; d < d1; ++d) {
                lo = min_exact(lo, src[t * stride + d]);
                hi = max_exact(hi, src[t * stride + d]);
            }
            const Int4Params p = int4_params(lo, hi);
            scales_h[t * G + g] = p.scale_h;
            mins_h[t * G + g] = p.min_h;
            for (uint32_t d = d0; d < d1; d += 2) {
                const uint8_t q0 = quant_int4(src[t * stride + d], p.min, p.scale);
                const uint8_t q1 = quant_int4(src[t * stride + d + 1], p.min, p.scale);
                data[t * rb + d / 2] = uint8_t(q0 | (q1 << 4));
            }
        }
}

// What the folds over a sub-page's rows ended at: FP8's max |x| of K and of
// V; INT8 K's per-channel max |x| (ka) or INT4 K's per-channel min (ka) and
// max (kb). A tail page's running statistics keep them (tail_append.hpp).
struct QuantFolds {
    float k_amax = 0.0f, v_amax = 0.0f;
    float *ka = nullptr, *kb = nullptr;  // D floats each, written when set
    float *km = nullptr, *ks = nullptr;  // INT4 K: the stored minimums and scales as floats, when set
};

// write_subpage for FP8, INT8 and INT4 with the loops in row order (same
// per-element operations, so the same bytes); F16/BF16 go to encode_rows_16.
// The folds end up in *folds when it is set.
inline void write_subpage_quant(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v,
                                uint64_t row_stride, uint32_t n_valid, uint8_t *sub, QuantFolds *folds = nullptr) {
    const SubpageLayout L = subpage_layout(f, P, D);
    std::memset(sub, 0, L.bytes);
    const uint64_t rb = row_bytes(f, D);
    uint8_t *kd = sub + L.k, *vd = sub + L.v;
    float *k_scales = reinterpret_cast<float *>(sub + L.k_scale), *v_scales = reinterpret_cast<float *>(sub + L.v_scale);
    uint16_t *k_scales_h = reinterpret_cast<uint16_t *>(sub + L.k_scale),
             *v_scales_h = reinterpret_cast<uint16_t *>(sub + L.v_scale);
    uint16_t *k_mins_h = reinterpret_cast<uint16_t *>(sub + L.k_min), *v_mins_h = reinterpret_cast<uint16_t *>(sub + L.v_min);
    if (f == IKV_FMT_FP8_E4M3) {
        const float ka = fold_absmax(k, row_stride, D, 0, n_valid, 0.0f);
        const float va = fold_absmax(v, row_stride, D, 0, n_valid, 0.0f);
        k_scales[0] = fp8_scale(ka);
        v_scales[0] = fp8_scale(va);
        fp8_rows(k, row_stride, D, 0, n_valid, k_scales[0], kd, rb);
        fp8_rows(v, row_stride, D, 0, n_valid, v_scales[0], vd, rb);
        if (folds) {
            folds->k_amax = ka;
            folds->v_amax = va;
        }
    } else if (f == IKV_FMT_INT8) {  // K: one scale per channel over the page's tokens; V: one per token
        float amax[256];
        for (uint32_t d = 0; d < D; ++d) amax[d] = 0.0f;
        fold_absmax_channels(k, row_stride, D, 0, n_valid, amax);
        for (uint32_t d = 0; d < D; ++d) k_scales[d] = int8_scale(amax[d]);
        int8_k_rows(k, row_stride, D, 0, n_valid, k_scales, kd, rb);
        int8_v_rows(v, row_stride, D, 0, n_valid, v_scales, vd, rb);
        if (folds && folds->ka) std::memcpy(folds->ka, amax, 4ull * D);
    } else if (f == IKV_FMT_INT4) {  // K: per channel over the page's tokens; V: per token and group
        float lo[256], hi[256];
        for (uint32_t d = 0; d < D; ++d) {
            lo[d] = INFINITY;
            hi[d] = -INFINITY;
        }
        fold_range_channels(k, row_stride, D, 0, n_valid, lo, hi);
        if (folds && folds->ka) std::memcpy(folds->ka, lo, 4ull * D);
        if (folds && folds->kb) std::memcpy(folds->kb, hi, 4ull * D);
        float mins_buf[256], scales_buf[256];
        float *mins = folds && folds->km ? folds->km : mins_buf, *scales = folds && folds->ks ? folds->ks : scales_buf;
        int4_k_params(lo, hi, D, n_valid, mins, scales, k_mins_h, k_scales_h);
        int4_k_rows(k, row_stride, D, 0, n_valid, mins, scales, kd, rb);
        int4_v_rows(v, row_stride, D, 0, n_valid, v_scales_h, v_mins_h, vd, rb);
    }
}

}  // namespace ikv
