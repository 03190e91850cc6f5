// Scalar encoders/decoders of every page format and the reference writer and
// reader of one sub-page. This is the single definition of the numerics in
// page_format.hpp: the pool's CPU path calls it directly; SIMD and CUDA
// kernels must produce and consume exactly these bytes (tests compare them).
// Header-only; every function is usable from host code and CUDA device code.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/page_format.hpp"

namespace ikv {

IKV_HD uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
IKV_HD float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- IEEE half: round to nearest even, saturating to +-65504, NaN kept ----
IKV_HD uint16_t f32_to_f16(float f) {
    const uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return uint16_t(sign | 0x7E00u);      // NaN
    if (ax >= 0x477FF000u) return uint16_t(sign | 0x7BFFu);     // >= 65520 (and inf): saturate
    if (ax < 0x38800000u) {                                     // below 2^-14: subnormal half
        const float r = bits_f32(ax) + 0.5f;                    // FPU rounds to nearest even
        return uint16_t(sign | (f32_bits(r) - 0x3F000000u));
    }
    const uint32_t odd = (ax >> 13) & 1u;
    ax += 0xC8000FFFu + odd;                                    // rebias exponent, round
    return uint16_t(sign | (ax >> 13));
}

IKV_HD float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        const float v = float(m) * 5.9604644775390625e-8f;     // m * 2^-24
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- IEEE half, directed: the half next to x on one side (INT4's group
// parameters, int4_params). x finite with |x| <= 65504. Halves are ordered
// like sign-magnitude integers, so one step is +-1 on the bits (from +-0 to
// the smallest subnormal of the other sign). ----
constexpr float kF16Max = 65504.0f;
IKV_HD uint16_t f16_step(uint16_t h, bool up) {
    const bool negative = (h & 0x8000u) != 0, zero = (h & 0x7FFFu) == 0;
    if (zero) return up ? uint16_t(0x0001u) : uint16_t(0x8001u);
    return uint16_t(up != negative ? h + 1u : h - 1u);  // away from zero: up for +h, down for -h
}
// Normal halves straight from the fp32 bits (the mantissa truncated toward
// zero, one step away from it where bits were dropped and the direction asks
// for it, as f32_to_bf16_toward); below 2^-14 by a nearest rounding and a step.
IKV_HD uint16_t f16_toward(float x, bool up) {
    const uint32_t b = f32_bits(x), ax = b & 0x7FFFFFFFu;
    const bool negative = (b >> 31) != 0;
    if (ax < 0x38800000u) {  // the subnormal halves
        const uint16_t h = f32_to_f16(x);
        const float back = f16_to_f32(h);
        return (up ? back < x : back > x) ? f16_step(h, up) : h;
    }
    uint32_t h = (ax - 0x38000000u) >> 13;            // rebias the exponent, truncate
    if ((ax & 0x1FFFu) != 0 && up != negative) ++h;  // away from zero: up for +x, down for -x
    return uint16_t((negative ? 0x8000u : 0u) | h);
}
IKV_HD uint16_t f16_down(float x) { return f16_toward(x, false); }  // largest half <= x
IKV_HD uint16_t f16_up(float x) { return f16_toward(x, true); }     // smallest half >= x

// ---- bfloat16: round to nearest even, NaN and +-inf kept; a finite value
// that would round to +-inf (|x| >= 0x1.ffp127, about 3.3961e38) saturates to
// the largest bf16, +-0x1.fep127 (about 3.3895e38), as F16 saturates: the
// pool stores finite values only ----
constexpr uint16_t kBf16MaxBits = 0x7F7Fu;
IKV_HD uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return uint16_t((x >> 16) | 0x40u);
    if (ax == 0x7F800000u) return uint16_t(x >> 16);
    x += 0x7FFFu + ((x >> 16) & 1u);
    if ((x & 0x7F800000u) == 0x7F800000u) return uint16_t(((x >> 16) & 0x8000u) | kBf16MaxBits);
    return uint16_t(x >> 16);
}
IKV_HD float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

// Element i of an engine array of ikv_dtype dtype (F32, F16, BF16; taken as
// an int, so a caller's raw value is never loaded as the enum) as fp32.
inline float load_dtype_elem(const void *base, int dtype, uint64_t i) {
    switch (dtype) {
        case IKV_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t *>(base)[i]);
        case IKV_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t *>(base)[i]);
        default: return static_cast<const float *>(base)[i];
    }
}

// True if any of the D elements at base + off of an engine array of dtype dt
// (F32, F16, BF16) is NaN or inf, testing exponent bits only (all ones) so
// no conversion is needed: append inputs, decode queries.
inline bool row_has_nonfinite(const void *base, int dt, int64_t off, uint32_t D) {
    uint32_t bad = 0;
    if (dt == IKV_DTYPE_F32) {
        const uint32_t *p = static_cast<const uint32_t *>(base) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & 0x7F800000u) == 0x7F800000u);
    } else {
        const uint16_t mask = dt == IKV_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        const uint16_t *p = static_cast<const uint16_t *>(base) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & mask) == mask);
    }
    return bad != 0;
}

// ---- key summaries: bfloat16 records (page_format.hpp) ----
// Directed bf16 rounding keeps k_min/k_max outward: bf16_down(x) <= x <=
// bf16_up(x), both exact bf16 values next to x. Truncating the low 16 bits
// rounds toward zero, so one ulp more of magnitude gives the other direction.
// Inputs are stored keys: finite, and within the largest bf16 in every
// format (F16/INT4 saturate at 65504, BF16 and the INT8/FP8 scales as above).
IKV_HD uint16_t f32_to_bf16_toward(float f, bool up) {
    const uint32_t x = f32_bits(f);
    uint16_t b = uint16_t(x >> 16);
    const bool negative = (x >> 31) != 0;
    if ((x & 0xFFFFu) != 0 && up != negative) ++b;  // away from zero: up for +x, down for -x
    return b;
}
IKV_HD uint16_t bf16_down(float f) { return f32_to_bf16_toward(f, false); }
IKV_HD uint16_t bf16_up(float f) { return f32_to_bf16_toward(f, true); }

// k_mean: the bf16 nearest the mean computed in double (ties to even), in
// one rounding. Rounding the double to the nearest fp32 first could make a
// tie of a mean that is not one (0x1.01p0 + 2^-25 became 0x1.01p0, a tie,
// then 1.0 by ties-to-even instead of 0x1.02p0). So the fp32 step rounds to
// odd instead (truncated, lowest bit set when inexact), which keeps enough
// of the lost bits for the bf16 rounding. Branch-free, so callers' loops
// vectorize. A mean lies within its keys, so within the largest bf16.
IKV_HD uint16_t mean_to_bf16(double mean) {
    mean += 0.0;                  // -0 (a sum begun from a -0 key) is +0, as for sums begun from 0
    const float f = float(mean);  // to nearest
    const double back = double(f);
    uint32_t b = f32_bits(f);
    b -= uint32_t((back < 0.0 ? -back : back) > (mean < 0.0 ? -mean : mean));  // rounded outward: truncate
    b |= uint32_t(back != mean);                                            // inexact: odd
    return f32_to_bf16(bits_f32(b));
}

// Channel d of a summary record from the stored keys' min, max and mean.
IKV_HD void encode_summary(uint16_t *rec, uint32_t D, uint32_t d, float mn, float mx, double mean) {
    rec[d] = bf16_down(mn);
    rec[D + d] = bf16_up(mx);
    rec[2 * D + d] = mean_to_bf16(mean);
}
// The record as 3*D floats: k_min[D], k_max[D], k_mean[D].
IKV_HD void decode_summary(const uint16_t *rec, uint32_t D, float *out) {
    for (uint32_t i = 0; i < 3 * D; ++i) out[i] = bf16_to_f32(rec[i]);
}

// ---- OCP FP8 E4M3 ("fn"): bias 7, max 448, 0x7F/0xFF are NaN, no infinity ----
IKV_HD uint8_t f32_to_e4m3(float x) {
    if (x != x) return 0x7Fu;
    const uint8_t sign = x < 0.0f ? 0x80u : 0u;
    const float a = fabsf(x);
    if (a >= kFp8Max) return uint8_t(sign | 0x7Eu);            // saturate
    if (a < 0.015625f) {                                        // < 2^-6: subnormal, step 2^-9
        const float q = rintf(a * 512.0f);                      // 8 -> code 0x08 = 2^-6, exact
        return uint8_t(sign | uint8_t(q));
    }
    int ex;
    const float fr = frexpf(a, &ex);                            // a = fr * 2^ex, fr in [0.5, 1)
    int E = ex - 1;
    float m = rintf((fr * 2.0f - 1.0f) * 8.0f);
    if (m >= 8.0f) {
        m = 0.0f;
        ++E;
    }
    uint32_t code = (uint32_t(E + 7) << 3) | uint32_t(m);
    if (code > 0x7Eu) code = 0x7Eu;
    return uint8_t(sign | code);
}

IKV_HD float e4m3_to_f32(uint8_t c) {
    const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    if ((c & 0x7Fu) == 0x7Fu) return bits_f32(0x7FC00000u);
    float v = e == 0 ? float(m) * 0.001953125f                  // m * 2^-9
                     : ldexpf(1.0f + float(m) * 0.125f, int(e) - 7);
    return (c & 0x80u) ? -v : v;
}

// ---- group scales ----
// A group's largest magnitude is taken at most kScaleAbsMax (0x1.fcp127,
// about 3.3762e38): the largest code times the scale (127 s, 448 s) then
// stays below the largest bf16, so every stored value is finite and its key
// summary (bf16, rounded outward) too; larger values saturate there.
constexpr float kScaleAbsMax = 0x1.fcp127f;
// A scale that would be 0 (no magnitude, or one so small that the quotient
// underflows: below ~3e-43 for FP8) is 1: the group's codes are then 0 or
// its values' own roundings, and x / s is never 0 / 0.
IKV_HD float group_scale(float absmax, float top_code) {
    const float s = (absmax < kScaleAbsMax ? absmax : kScaleAbsMax) / top_code;
    return s > 0.0f ? s : 1.0f;
}
IKV_HD float int8_scale(float absmax) { return group_scale(absmax, 127.0f); }
IKV_HD float fp8_scale(float absmax) { return group_scale(absmax, kFp8Max); }

// INT4 group parameters, stored as halves: the minimum rounded down and the
// scale rounded up, so [m, m + 15 s] covers the group and every value is
// within s/2 of its code's value. Inputs beyond +-65504 are clamped first
// (INT4 saturates like F16); a group with max == m gets s = 1 (stored exactly).
struct Int4Params {
    float scale, min;         // the values the codes are computed with and read back at
    uint16_t scale_h, min_h;  // their half bits, as stored
};
// Comparisons, not fminf/fmaxf: those are library calls on x86-64 without
// fast-math, and this runs per element of an INT4 append (inputs are finite).
IKV_HD float clamp_f16_range(float x) { return x < -kF16Max ? -kF16Max : x > kF16Max ? kF16Max : x; }
IKV_HD Int4Params int4_params(float lo, float hi) {
    Int4Params p;
    p.min_h = f16_down(clamp_f16_range(lo));
    p.min = f16_to_f32(p.min_h);
    const float range = clamp_f16_range(hi) - p.min;  // >= 0, at most 131008
    p.scale_h = range > 0.0f ? f16_up(range / 15.0f) : uint16_t(0x3C00u);
    p.scale = f16_to_f32(p.scale_h);
    return p;
}

IKV_HD int8_t quant_int8(float x, float s) {
    float q = rintf(x / s);
    q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
    return int8_t(q);
}
IKV_HD uint8_t quant_int4(float x, float lo, float s) {  // lo, s: an Int4Params' min and scale
    float q = rintf((clamp_f16_range(x) - lo) / s);
    q = q > 15.0f ? 15.0f : (q < 0.0f ? 0.0f : q);
    return uint8_t(q);
}

// ---- one sub-page ----
// Write the sub-page at `sub` from fp32 rows: k and v hold n_valid rows of D
// floats, row r at k + r*row_stride. Rows n_valid..P-1 are written as zeros.
inline void write_subpage(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v,
                          uint64_t row_stride, uint32_t n_valid, uint8_t *sub) {
    const SubpageLayout L = subpage_layout(f, P, D);
    memset(sub, 0, L.bytes);
    for (int which = 0; which < 2; ++which) {
        const float *src = which == 0 ? k : v;
        uint8_t *data = sub + (which == 0 ? L.k : L.v);
        const uint64_t rb = row_bytes(f, D);
        if (f == IKV_FMT_F16 || f == IKV_FMT_BF16) {
            for (uint32_t t = 0; t < n_valid; ++t)
                for (uint32_t d = 0; d < D; ++d) {
                    const float x = src[t * row_stride + d];
                    const uint16_t b = f == IKV_FMT_F16 ? f32_to_f16(x) : f32_to_bf16(x);
                    memcpy(data + t * rb + 2 * d, &b, 2);
                }
        } else if (f == IKV_FMT_FP8_E4M3) {
            float amax = 0.0f;
            for (uint32_t t = 0; t < n_valid; ++t)
                for (uint32_t d = 0; d < D; ++d) amax = fmaxf(amax, fabsf(src[t * row_stride + d]));
            const float s = fp8_scale(amax);
            memcpy(sub + (which == 0 ? L.k_scale : L.v_scale), &s, 4);
            for (uint32_t t = 0; t < n_valid; ++t)
                for (uint32_t d = 0; d < D; ++d) data[t * rb + d] = f32_to_e4m3(src[t * row_stride + d] / s);
        } else if (f == IKV_FMT_INT8) {
            float *scales = reinterpret_cast<float *>(sub + (which == 0 ? L.k_scale : L.v_scale));
            if (which == 0) {  // K: one scale per channel over the page's tokens
                for (uint32_t d = 0; d < D; ++d) {
                    float amax = 0.0f;
                    for (uint32_t t = 0; t < n_valid; ++t) amax = fmaxf(amax, fabsf(src[t * row_stride + d]));
                    scales[d] = int8_scale(amax);
                    for (uint32_t t = 0; t < n_valid; ++t)
                        data[t * rb + d] = uint8_t(quant_int8(src[t * row_stride + d], scales[d]));
                }
            } else {  // V: one scale per token
                for (uint32_t t = 0; t < n_valid; ++t) {
                    float amax = 0.0f;
                    for (uint32_t d = 0; d < D; ++d) amax = fmaxf(amax, fabsf(src[t * row_stride + d]));
                    scales[t] = int8_scale(amax);
                    for (uint32_t d = 0; d < D; ++d)
                        data[t * rb + d] = uint8_t(quant_int8(src[t * row_stride + d], scales[t]));
                }
            }
        } else if (f == IKV_FMT_INT4) {
            uint16_t *scales = reinterpret_cast<uint16_t *>(sub + (which == 0 ? L.k_scale : L.v_scale));
            uint16_t *mins = reinterpret_cast<uint16_t *>(sub + (which == 0 ? L.k_min : L.v_min));
            if (which == 0) {  // K: per channel over the page's tokens
                for (uint32_t d = 0; d < D; ++d) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (uint32_t t = 0; t < n_valid; ++t) {
                        lo = fminf(lo, src[t * row_stride + d]);
                        hi = fmaxf(hi, src[t * row_stride + d]);
                    }
                    if (n_valid == 0) lo = hi = 0.0f;
                    const Int4Params g = int4_params(lo, hi);
                    scales[d] = g.scale_h;
                    mins[d] = g.min_h;
                    for (uint32_t t = 0; t < n_valid; ++t) {
                        const uint8_t q = quant_int4(src[t * row_stride + d], g.min, g.scale);
                        data[t * rb + d / 2] |= uint8_t(d & 1 ? q << 4 : q);
                    }
                }
            } else {  // V: per token, groups of kInt4VGroup channels
                const uint32_t G = int4_v_groups(D);
                for (uint32_t t = 0; t < n_valid; ++t)
                    for (uint32_t g = 0; g < G; ++g) {
                        const uint32_t d0 = g * kInt4VGroup, d1 = d0 + kInt4VGroup < D ? d0 + kInt4VGroup : D;
                        float lo = INFINITY, hi = -INFINITY;
                        for (uint32_t d = d0; d < d1; ++d) {
                            lo = fminf(lo, src[t * row_stride + d]);
                            hi = fmaxf(hi, src[t * row_stride + d]);
                        }
                        const Int4Params p = int4_params(lo, hi);
                        scales[t * G + g] = p.scale_h;
                        mins[t * G + g] = p.min_h;
                        for (uint32_t d = d0; d < d1; ++d) {
                            const uint8_t q = quant_int4(src[t * row_stride + d], p.min, p.scale);
                            data[t * rb + d / 2] |= uint8_t(d & 1 ? q << 4 : q);
                        }
                    }
            }
        }
    }
}

// Dequantize row t of K (which == 0) or V (which == 1) of a sub-page to fp32.
IKV_HD void read_subpage_row(ikv_format f, uint32_t P, uint32_t D, const uint8_t *sub, int which, uint32_t t,
                             float *out) {
    const SubpageLayout L = subpage_layout(f, P, D);
    const uint8_t *data = sub + (which == 0 ? L.k : L.v) + t * row_bytes(f, D);
    const float *scales = reinterpret_cast<const float *>(sub + (which == 0 ? L.k_scale : L.v_scale));
    const uint16_t *scales_h = reinterpret_cast<const uint16_t *>(sub + (which == 0 ? L.k_scale : L.v_scale));
    const uint16_t *mins_h = reinterpret_cast<const uint16_t *>(sub + (which == 0 ? L.k_min : L.v_min));
    const uint32_t G = int4_v_groups(D);
    for (uint32_t d = 0; d < D; ++d) {
        float x = 0.0f;
        switch (f) {
            case IKV_FMT_F16: {
                uint16_t b;
                memcpy(&b, data + 2 * d, 2);
                x = f16_to_f32(b);
                break;
            }
            case IKV_FMT_BF16: {
                uint16_t b;
                memcpy(&b, data + 2 * d, 2);
                x = bf16_to_f32(b);
                break;
            }
            case IKV_FMT_FP8_E4M3: x = e4m3_to_f32(data[d]) * scales[0]; break;
            case IKV_FMT_INT8: x = float(int8_t(data[d])) * (which == 0 ? scales[d] : scales[t]); break;
            case IKV_FMT_INT4: {
                const uint32_t q = d & 1 ? data[d / 2] >> 4 : data[d / 2] & 0xFu;
                const uint32_t i = which == 0 ? d : t * G + d / kInt4VGroup;
                x = float(q) * f16_to_f32(scales_h[i]) + f16_to_f32(mins_h[i]);
                break;
            }
            default: break;
        }
        out[d] = x;
    }
}

}  // namespace ikv
