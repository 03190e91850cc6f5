// The AVX-512 vector operations (the O of attn_impl.hpp), shared by the two
// AVX-512 kernel files: attn_avx512.cpp (F/BW/VL/DQ + F16C) and
// attn_avx512_vnni.cpp (the same plus VNNI). Include it INSIDE an anonymous
// namespace, after <immintrin.h>, <string.h> and cpu/x86_support.hpp, as
// attn_impl.hpp: each file compiles its own copy with its own flags.
//
// With VNNI (__AVX512VNNI__, attn_avx512_vnni.cpp alone) O also provides the
// integer ops of INT8 values (kIntValues; attn_impl.hpp values_int8): the
// value product sum_t w_t * v_t runs along tokens, so two tokens' codes are
// interleaved as int16 pairs per channel and one vpdpwssd adds w_a * v_a +
// w_b * v_b into each channel's int32 lane: 32 products per instruction
// where an fp32 FMA does 16, and no int8 -> fp32 conversion per code.
#pragma once

struct O {
    using V = __m512;
    static constexpr uint32_t W = 16;
    static constexpr uint32_t kValueChunks = 4;  // accumulator chunks per value pass
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float a) { return _mm512_set1_ps(a); }
    static V load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static float hsum(V a) { return _mm512_reduce_add_ps(a); }
    static float hmax(V a) { return _mm512_reduce_max_ps(a); }
    static void hsum4(const V *a, float *out, size_t stride) {
        // 256-bit halves added (a0|a1, a2|a3), then 128-bit quarters, so each
        // 128-bit lane j holds 4 partial sums of a[j]; then sum within lanes.
        const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
        const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
        __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
        y = _mm512_add_ps(y, _mm512_permute_ps(y, 0x4E));
        y = _mm512_add_ps(y, _mm512_permute_ps(y, 0xB1));
        float t[16];
        _mm512_storeu_ps(t, y);
        for (int j = 0; j < 4; ++j) out[j * stride] = t[4 * j];
    }
    static V min(V a, V b) { return _mm512_min_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static V pow2(V n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    static V zero_below(V x, float lo, V y) {
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
    }
    using FlushDenormals = x86::FlushDenormals;
    static void prefetch(const void *p) { x86::prefetch(p); }
    static V f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }
    static V bf16(const uint8_t *p) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    static V e4m3_div256(const uint8_t *p) {
        // E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: same value times 2^-8.
        // Sign-extended to 16 bits and shifted left 7, the sign lands in bit 15 and
        // (for negatives) a stray copy in bit 14, which the mask clears.
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(short(0xBFFF))));
    }
    static V i8(const uint8_t *p) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
    }
    static V u4(const uint8_t *p) {
        // each byte to two lanes, then lane 2j keeps the low nibble, 2j+1 the high one
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p));
        const __m512i x = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        const __m512i s = _mm512_set4_epi32(4, 0, 4, 0);  // lanes (0, 4, 0, 4, ...)
        return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(x, s), _mm512_set1_epi32(0xF)));
    }
#if defined(__AVX512VNNI__)
    static constexpr bool kIntValues = true;
    using VI = __m512i;
    static VI izero() { return _mm512_setzero_si512(); }
    // The int8 codes of tokens a and b at 32 channels as (a, b) int16 pairs:
    // 128-bit lane k of lo holds channels 8k..8k+3, of hi channels 8k+4..8k+7
    // (unpack order; add_pair_sums puts them back in channel order).
    static void i8_pairs(const uint8_t *a, const uint8_t *b, VI &lo, VI &hi) {
        const __m512i A = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a)));
        const __m512i B = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b)));
        lo = _mm512_unpacklo_epi16(A, B);
        hi = _mm512_unpackhi_epi16(A, B);
    }
    // acc += x . (w2[0], w2[1]) in every int32 lane (the two tokens' weights).
    static VI dot_pairs(VI acc, VI x, const int16_t *w2) {
        int32_t w;
        memcpy(&w, w2, sizeof w);
        return _mm512_dpwssd_epi32(acc, x, _mm512_set1_epi32(w));
    }
    // acc[0, 32) += (the 32 channel sums held by (lo, hi) in i8_pairs' order) / 32767 * wmax.
    static void add_pair_sums(float *acc, VI lo, VI hi, float wmax) {
        const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        const __m512 u = _mm512_set1_ps(1.0f / 32767.0f), s = _mm512_set1_ps(wmax);
        const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), u), b = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), u);
        _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_permutex2var_ps(a, first, b), s, _mm512_loadu_ps(acc)));
        _mm512_storeu_ps(acc + 16, _mm512_fmadd_ps(_mm512_permutex2var_ps(a, second, b), s, _mm512_loadu_ps(acc + 16)));
    }
    // out[i] = w[i] * inv * 32767 rounded to nearest, i < n (n a multiple of W; 0 <= w[i] * inv <= 1).
    static void to_i16(const float *w, uint32_t n, float inv, int16_t *out) {
        const __m512 sv = _mm512_set1_ps(inv), q = _mm512_set1_ps(32767.0f);
        for (uint32_t i = 0; i < n; i += W) {
            const __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w + i), sv), q);
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(x)));
        }
    }
#else
    static constexpr bool kIntValues = false;
#endif
};
