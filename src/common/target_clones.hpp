// IKV_AVX2_CLONES: on x86-64 Linux, a function gets an AVX2 copy beside its
// baseline one, chosen once at load time (GCC/clang target_clones, an ifunc),
// with everything it calls inlined into each copy (flatten) so the helpers
// vectorize with it. Used on the host append path, which the library builds
// for baseline x86-64. AVX2 without FMA keeps every IEEE operation and its
// order, so both copies compute the same bits; the tests run whichever copy
// the machine picks (docs/FORMATS.md). (That holds for the library's own
// flags; a build with FMA enabled for the whole library, e.g.
// -march=x86-64-v3, lets GCC contract a*b+c in both copies.)
#pragma once

// ThreadSanitizer builds get the baseline copy only: an ifunc whose resolver
// the loader runs while relocating the library (as for a static function's
// clones) runs instrumented code before the TSan runtime is up and crashes.
#if defined(__SANITIZE_THREAD__)
#define IKV_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IKV_NO_CLONES 1
#endif
#endif

#if defined(IKV_NO_CLONES)
#define IKV_AVX2_CLONES
#elif defined(__x86_64__) && defined(__linux__) && defined(__clang__)
#define IKV_AVX2_CLONES __attribute__((target_clones("avx2", "default")))  // clang refuses flatten here
#elif defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define IKV_AVX2_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define IKV_AVX2_CLONES
#endif
