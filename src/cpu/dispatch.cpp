#include "cpu/dispatch.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

#include "common/error.hpp"
#include "cpu/attn_kernel.hpp"

namespace ikv {

#if defined(__x86_64__) || defined(_M_X64)
// F16C (CPUID leaf 1, ECX bit 29): asked through cpuid, since clang's
// __builtin_cpu_supports does not know the name (gcc's does).
bool has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

bool isa_supported(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return true;
#if defined(__x86_64__) || defined(_M_X64)
        case Isa::Avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
        case Isa::Avx512:
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                   has_f16c() && __builtin_cpu_supports("fma");
#endif
#if defined(__aarch64__)
        case Isa::Neon: return true;
#endif
        default: return false;
    }
}

const char *isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx512: return "avx512";
        case Isa::Neon: return "neon";
    }
    return "?";
}

static Isa choose() {
    const Isa best_first[] = {Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar};
    Isa best = Isa::Scalar;
    for (Isa i : best_first)
        if (isa_supported(i)) {
            best = i;
            break;
        }
    const char *env = std::getenv("IKV_CPU_ISA");
    if (env == nullptr || env[0] == '\0') return best;
    for (Isa i : best_first)
        if (std::strcmp(env, isa_name(i)) == 0) {
            if (isa_supported(i)) return i;
            log(IKV_LOG_WARN, "IKV_CPU_ISA=%s is not supported on this CPU or build; using %s", env, isa_name(best));
            return best;
        }
    log(IKV_LOG_WARN, "IKV_CPU_ISA=%s is not one of avx512, avx2, neon, scalar; using %s", env, isa_name(best));
    return best;
}

// The AVX-512 path's kernels with integer INT8 values (attn_avx512_vnni.cpp)
// where the CPU has AVX512-VNNI, unless IKV_CPU_VNNI is "off" or "0": the
// same path, named "avx512" in ikv_runtime_info, differing only in how INT8
// values are summed (docs/DECODE.md). Read with the ISA, once.
static bool choose_vnni(Isa isa) {
#if defined(__x86_64__) || defined(_M_X64)
    if (isa != Isa::Avx512 || !__builtin_cpu_supports("avx512vnni")) return false;
    const char *env = std::getenv("IKV_CPU_VNNI");
    if (env == nullptr || env[0] == '\0' || std::strcmp(env, "on") == 0 || std::strcmp(env, "1") == 0) return true;
    if (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0) return false;
    log(IKV_LOG_WARN, "IKV_CPU_VNNI=%s is not one of on, off, 1, 0; using on", env);
    return true;
#else
    (void)isa;
    return false;
#endif
}

struct IsaChoice {
    Isa isa;
    bool vnni;  // the AVX-512 path with integer INT8 values
};

static const IsaChoice &isa_choice() {
    static const IsaChoice chosen = [] {  // C++11 guarantees thread-safe one-time init
        const Isa isa = choose();
        return IsaChoice{isa, choose_vnni(isa)};
    }();
    return chosen;
}

Isa active_isa() { return isa_choice().isa; }

void isa_available(char *buf, std::size_t n) {
    const Isa order[] = {Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar};
    std::size_t used = 0;
    buf[0] = '\0';
    for (Isa i : order)
        if (isa_supported(i)) {
            int w = std::snprintf(buf + used, n - used, "%s%s", used ? "," : "", isa_name(i));
            if (w < 0 || std::size_t(w) >= n - used) break;
            used += std::size_t(w);
        }
}

const CpuKernels &cpu_kernels() {
    switch (active_isa()) {
#if defined(__x86_64__) || defined(_M_X64)
        case Isa::Avx512: return isa_choice().vnni ? cpu_kernels_avx512_vnni() : cpu_kernels_avx512();
        case Isa::Avx2: return cpu_kernels_avx2();
#endif
#if defined(__aarch64__)
        case Isa::Neon: return cpu_kernels_neon();
#endif
        default: return cpu_kernels_scalar();
    }
}

}  // namespace ikv
