// Portable path: the kernel of attn_impl.hpp over a 4-lane array type that
// any C++ compiler handles (it may auto-vectorize it for the baseline ISA).
#include <math.h>
#include <string.h>

#include "common/quant.hpp"  // scalar converters: safe here, this file has baseline flags
#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

struct O {
    struct V {
        float x[4];
    };
    static constexpr uint32_t W = 4;
    static constexpr uint32_t kValueChunks = 2;  // accumulator chunks per value pass
    static constexpr bool kIntValues = false;    // INT8 values in fp32 (attn_impl.hpp)
    static V zero() { return V{{0.0f, 0.0f, 0.0f, 0.0f}}; }
    static V set1(float a) { return V{{a, a, a, a}}; }
    static V load(const float *p) {
        V v;
        memcpy(v.x, p, sizeof v.x);
        return v;
    }
    static void store(float *p, V v) { memcpy(p, v.x, sizeof v.x); }
    static V add(V a, V b) {
        for (int i = 0; i < 4; ++i) a.x[i] += b.x[i];
        return a;
    }
    static V mul(V a, V b) {
        for (int i = 0; i < 4; ++i) a.x[i] *= b.x[i];
        return a;
    }
    static V fma(V a, V b, V c) {
        for (int i = 0; i < 4; ++i) c.x[i] = a.x[i] * b.x[i] + c.x[i];
        return c;
    }
    static float hsum(V a) { return (a.x[0] + a.x[2]) + (a.x[1] + a.x[3]); }
    static float hmax(V a) {
        const float x = a.x[0] > a.x[1] ? a.x[0] : a.x[1], y = a.x[2] > a.x[3] ? a.x[2] : a.x[3];
        return x > y ? x : y;
    }
    static void hsum4(const V *a, float *out, size_t stride) {
        for (int j = 0; j < 4; ++j) out[j * stride] = hsum(a[j]);
    }
    static V min(V a, V b) {
        for (int i = 0; i < 4; ++i) a.x[i] = b.x[i] < a.x[i] ? b.x[i] : a.x[i];
        return a;
    }
    static V max(V a, V b) {
        for (int i = 0; i < 4; ++i) a.x[i] = b.x[i] > a.x[i] ? b.x[i] : a.x[i];
        return a;
    }
    static V round(V a) {
        for (int i = 0; i < 4; ++i) a.x[i] = nearbyintf(a.x[i]);
        return a;
    }
    static V pow2(V n) {
        for (int i = 0; i < 4; ++i) n.x[i] = ldexpf(1.0f, int(n.x[i]));
        return n;
    }
    static V zero_below(V x, float lo, V y) {
        for (int i = 0; i < 4; ++i) y.x[i] = x.x[i] >= lo ? y.x[i] : 0.0f;
        return y;
    }
    struct FlushDenormals {};  // portable path: the floating-point environment is left as is
    static void prefetch(const void *p) {
#if defined(__x86_64__)
        __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char *>(p)));  // GCC 12 drops the builtin here
#else
        __builtin_prefetch(p);
#endif
    }
    static V f16(const uint8_t *p) {
        V v;
        for (int i = 0; i < 4; ++i) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v.x[i] = f16_to_f32(h);
        }
        return v;
    }
    static V bf16(const uint8_t *p) {
        V v;
        for (int i = 0; i < 4; ++i) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v.x[i] = bf16_to_f32(h);
        }
        return v;
    }
    static V e4m3_div256(const uint8_t *p) {
        V v;
        for (int i = 0; i < 4; ++i) v.x[i] = e4m3_to_f32(p[i]) * (1.0f / 256.0f);
        return v;
    }
    static V i8(const uint8_t *p) {
        V v;
        for (int i = 0; i < 4; ++i) v.x[i] = float(int8_t(p[i]));
        return v;
    }
    static V u4(const uint8_t *p) {
        V v;
        for (int i = 0; i < 2; ++i) {
            v.x[2 * i] = float(p[i] & 0xFu);
            v.x[2 * i + 1] = float(p[i] >> 4);
        }
        return v;
    }
};

#include "cpu/attn_impl.hpp"
#include "cpu/quest_impl.hpp"

}  // namespace

const CpuKernels &cpu_kernels_scalar() {
    static const CpuKernels k{"scalar", attend_chunk, quest_bounds, attend_chunks};
    return k;
}

}  // namespace ikv
