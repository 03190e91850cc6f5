// NEON path (aarch64; Advanced SIMD is mandatory there, fp16 conversion included).
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

struct O {
    using V = float32x4_t;
    static constexpr uint32_t W = 4;
    static constexpr uint32_t kValueChunks = 4;  // accumulator chunks per value pass
    static constexpr bool kIntValues = false;    // INT8 values in fp32 (attn_impl.hpp)
    static V zero() { return vdupq_n_f32(0.0f); }
    static V set1(float a) { return vdupq_n_f32(a); }
    static V load(const float *p) { return vld1q_f32(p); }
    static void store(float *p, V v) { vst1q_f32(p, v); }
    static V add(V a, V b) { return vaddq_f32(a, b); }
    static V mul(V a, V b) { return vmulq_f32(a, b); }
    static V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
    static float hsum(V a) { return vaddvq_f32(a); }
    static float hmax(V a) { return vmaxvq_f32(a); }
    static void hsum4(const V *a, float *out, size_t stride) {
        const V s = vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));  // [sum a0, a1, a2, a3]
        float t[4];
        vst1q_f32(t, s);
        for (int j = 0; j < 4; ++j) out[j * stride] = t[j];
    }
    static V min(V a, V b) { return vminq_f32(a, b); }
    static V max(V a, V b) { return vmaxq_f32(a, b); }
    static V round(V a) { return vrndnq_f32(a); }
    static V pow2(V n) {
        return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
    }
    static V zero_below(V x, float lo, V y) {
        return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), vcgeq_f32(x, vdupq_n_f32(lo))));
    }
    // FPCR.FZ (bit 24) for the guard's lifetime, then the caller's value.
    struct FlushDenormals {
        uint64_t saved;
        FlushDenormals() {
            __asm__ volatile("mrs %0, fpcr" : "=r"(saved));
            __asm__ volatile("msr fpcr, %0" : : "r"(saved | (uint64_t(1) << 24)));
        }
        ~FlushDenormals() { __asm__ volatile("msr fpcr, %0" : : "r"(saved)); }
        FlushDenormals(const FlushDenormals &) = delete;
        FlushDenormals &operator=(const FlushDenormals &) = delete;
    };
    static void prefetch(const void *p) { __asm__ volatile("prfm pldl1keep, %0" : : "Q"(*static_cast<const char *>(p))); }
    static V f16(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t *>(p)))); }
    static V bf16(const uint8_t *p) {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t *>(p)), 16));
    }
    static V e4m3_div256(const uint8_t *p) {
        // E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: same value times 2^-8.
        // Sign-extended to 16 bits and shifted left 7, the sign lands in bit 15 and
        // (for negatives) a stray copy in bit 14, which the mask clears.
        uint32_t w;
        memcpy(&w, p, 4);
        const int16x4_t b = vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(w))));
        const uint16x4_t h = vand_u16(vreinterpret_u16_s16(vshl_n_s16(b, 7)), vdup_n_u16(0xBFFF));
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    }
    static V i8(const uint8_t *p) {
        uint32_t w;
        memcpy(&w, p, 4);
        const int16x8_t s = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(w)));
        return vcvtq_f32_s32(vmovl_s16(vget_low_s16(s)));
    }
    static V u4(const uint8_t *p) {
        const uint32_t a = p[0], b = p[1];
        const uint32_t lanes[4] = {a & 0xFu, a >> 4, b & 0xFu, b >> 4};
        return vcvtq_f32_u32(vld1q_u32(lanes));
    }
};

#include "cpu/attn_impl.hpp"
#include "cpu/quest_impl.hpp"

}  // namespace

const CpuKernels &cpu_kernels_neon() {
    static const CpuKernels k{"neon", attend_chunk, quest_bounds, attend_chunks};
    return k;
}

}  // namespace ikv
