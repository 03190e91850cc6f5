// AVX2 + FMA + F16C path (this file alone is compiled with those flags).
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/x86_support.hpp"
#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

struct O {
    using V = __m256;
    static constexpr uint32_t W = 8;
    static constexpr uint32_t kValueChunks = 2;  // accumulator chunks per value pass
    static constexpr bool kIntValues = false;    // INT8 values in fp32 (attn_impl.hpp)
    static V zero() { return _mm256_setzero_ps(); }
    static V set1(float a) { return _mm256_set1_ps(a); }
    static V load(const float *p) { return _mm256_loadu_ps(p); }
    static void store(float *p, V v) { _mm256_storeu_ps(p, v); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static float hsum(V a) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static float hmax(V a) {
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static void hsum4(const V *a, float *out, size_t stride) {
        // hadd tree: lanes end as [sum a0, a1, a2, a3] (low half + high half)
        const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        const __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        float t[4];
        _mm_storeu_ps(t, r);
        for (int j = 0; j < 4; ++j) out[j * stride] = t[j];
    }
    static V min(V a, V b) { return _mm256_min_ps(a, b); }
    static V max(V a, V b) { return _mm256_max_ps(a, b); }
    static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static V pow2(V n) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    }
    static V zero_below(V x, float lo, V y) { return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_GE_OQ)); }
    using FlushDenormals = x86::FlushDenormals;
    static void prefetch(const void *p) { x86::prefetch(p); }
    static V f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
    static V bf16(const uint8_t *p) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    static V e4m3_div256(const uint8_t *p) {
        // E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: same value times 2^-8 (normals and subnormals).
        // Sign-extended to 16 bits and shifted left 7, the sign lands in bit 15 and
        // (for negatives) a stray copy in bit 14, which the mask clears.
        const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
        return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(short(0xBFFF))));
    }
    static V i8(const uint8_t *p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
    }
    static V u4(const uint8_t *p) {
        // each byte to two lanes, then lane 2j keeps the low nibble, 2j+1 the high one
        int32_t w;
        memcpy(&w, p, 4);
        const __m128i b = _mm_cvtsi32_si128(w);
        const __m256i x = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), _mm256_set1_epi32(0xF));
        return _mm256_cvtepi32_ps(c);
    }
};

#include "cpu/attn_impl.hpp"
#include "cpu/quest_impl.hpp"

}  // namespace

const CpuKernels &cpu_kernels_avx2() {
    static const CpuKernels k{"avx2", attend_chunk, quest_bounds, attend_chunks};
    return k;
}

}  // namespace ikv
