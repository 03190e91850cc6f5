// Pieces the x86 kernels (AVX2, AVX-512) share: a scoped flush-to-zero guard
// and a prefetch that the compiler keeps.
#pragma once

#include <immintrin.h>

namespace ikv {
namespace x86 {

// MXCSR FTZ (bit 15) and DAZ (bit 6) for the guard's lifetime, then the
// caller's value: denormal weights from peaked softmax rows cost ~100 cycles
// per FMA on Intel cores, and values below ~1e-38 of the largest do not matter.
struct FlushDenormals {
    unsigned saved = _mm_getcsr();
    FlushDenormals() { _mm_setcsr(saved | 0x8040u); }
    ~FlushDenormals() { _mm_setcsr(saved); }
    FlushDenormals(const FlushDenormals &) = delete;
    FlushDenormals &operator=(const FlushDenormals &) = delete;
};

// GCC 12 drops __builtin_prefetch inside these kernels; the asm stays.
inline void prefetch(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char *>(p))); }

}  // namespace x86
}  // namespace ikv
