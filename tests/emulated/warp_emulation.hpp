// A CUDA warp emulated on the CPU, so device code written for one warp
// (kernels/decode_mma.cuh, kernels/decode_formats.cuh) runs unchanged under
// the host compiler and can be checked where there is no GPU (CI).
//
// The 32 lanes are 32 host threads running the same function; the warp
// intrinsics the kernels use (__shfl_xor_sync, __shfl_sync, __any_sync) and
// the tensor-core instruction mma.sync.m16n8k16 (ikv_emulated_mma, called by
// decode_mma.cuh when IKV_WARP_EMULATION is defined) exchange values through
// this warp's arrays between two barrier phases. mma follows the fragment
// layouts of the PTX ISA ("Matrix fragments for mma.m16n8k16 with
// floating point type"): lane = 4 * groupID + threadID_in_group; A row
// groupID (+8 for registers 1, 3), column 2 * threadID_in_group (+8 for
// registers 2, 3); B column groupID, row 2 * threadID_in_group (+8 for
// register 1); C/D row groupID (+8 for elements 2, 3), column
// 2 * threadID_in_group + (element & 1). The products are summed exactly
// (double) and rounded once to fp32.
//
// Include this before the kernel headers, with IKV_WARP_EMULATION defined.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace emu {

struct Warp {
    std::barrier<> bar{32};
    float f[32];
    int i[32];
    uint32_t a[32][4], b[32][2];
};

inline Warp *&current() {
    static Warp *w = nullptr;
    return w;
}
inline int &lane() {
    thread_local int l = 0;
    return l;
}

// Run fn(lane) on 32 threads as one warp.
inline void run_warp(const std::function<void(int)> &fn) {
    Warp w;
    current() = &w;
    std::vector<std::thread> t;
    for (int l = 0; l < 32; ++l)
        t.emplace_back([&fn, l] {
            lane() = l;
            fn(l);
        });
    for (auto &x : t) x.join();
    current() = nullptr;
}

inline float half_bits(uint32_t bits16, bool bf) {
    if (bf) {
        const uint32_t u = bits16 << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    __half_raw r;
    r.x = uint16_t(bits16);
    return __half2float(__half(r));
}
inline double elem(uint32_t reg, int which, bool bf) { return half_bits(which ? reg >> 16 : reg & 0xFFFFu, bf); }

}  // namespace emu

inline float __shfl_xor_sync(unsigned, float v, int mask) {
    emu::Warp &w = *emu::current();
    const int l = emu::lane();
    w.f[l] = v;
    w.bar.arrive_and_wait();
    const float r = w.f[l ^ mask];
    w.bar.arrive_and_wait();
    return r;
}
inline float __shfl_sync(unsigned, float v, int src) {
    emu::Warp &w = *emu::current();
    const int l = emu::lane();
    w.f[l] = v;
    w.bar.arrive_and_wait();
    const float r = w.f[src & 31];
    w.bar.arrive_and_wait();
    return r;
}
inline int __any_sync(unsigned, int pred) {
    emu::Warp &w = *emu::current();
    const int l = emu::lane();
    w.i[l] = pred != 0;
    w.bar.arrive_and_wait();
    int any = 0;
    for (int k = 0; k < 32; ++k) any |= w.i[k];
    w.bar.arrive_and_wait();
    return any;
}
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { emu::current()->bar.arrive_and_wait(); }

// Byte k of the result is byte (s >> 4k) & 7 of {y:x} (x holds bytes 0..3).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t(y) << 32) | x;
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) r |= unsigned((v >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k);
    return r;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

// HFMA2 is device-only in cuda_fp16.h: a * b + c per half, the product and the
// sum exact in double (f16 has 11-bit significands and exponents within
// 2^+-24, so both fit), rounded once to f16 as the instruction does.
inline __half2 __hfma2(const __half2 a, const __half2 b, const __half2 c) {
    const float2 x = __half22float2(a), y = __half22float2(b), z = __half22float2(c);
    return __halves2half2(__double2half(double(x.x) * double(y.x) + double(z.x)),
                          __double2half(double(x.y) * double(y.y) + double(z.y)));
}

// d += A B for the warp (see the layout above); every lane calls it.
inline void ikv_emulated_mma(bool bf, float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    emu::Warp &w = *emu::current();
    const int l = emu::lane();
    w.a[l][0] = a0, w.a[l][1] = a1, w.a[l][2] = a2, w.a[l][3] = a3;
    w.b[l][0] = b0, w.b[l][1] = b1;
    w.bar.arrive_and_wait();
    const int g = l / 4, t = l % 4;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int m = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        double acc = d[e];
        for (int k = 0; k < 16; ++k) {
            const int al = (m % 8) * 4 + (k % 8) / 2, ar = (m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const int bl = n * 4 + (k % 8) / 2, br = k >= 8 ? 1 : 0;
            acc += emu::elem(w.a[al][ar], k & 1, bf) * emu::elem(w.b[bl][br], k & 1, bf);
        }
        out[e] = float(acc);
    }
    w.bar.arrive_and_wait();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}
