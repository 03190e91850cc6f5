// CPU ISA selection: chosen once per process from the CPU's features, or
// forced by the environment variable IKV_CPU_ISA (avx512 | avx2 | neon | scalar).
#pragma once

#include <cstddef>

namespace ikv {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };

#if defined(__x86_64__) || defined(_M_X64)
// Whether the CPU converts halves in hardware (F16C).
bool has_f16c();
#endif

// True if this build has kernels for isa and this CPU can run them.
bool isa_supported(Isa isa);
// The path in use (decided on first call; thread-safe).
Isa active_isa();
const char *isa_name(Isa isa);
// Comma-separated list of supported paths, best first.
void isa_available(char *buf, std::size_t n);

struct CpuKernels;  // cpu/attn_kernel.hpp
// The kernel table of the active path (the only global state of the CPU
// backend: the ISA chosen once, never changed).
const CpuKernels &cpu_kernels();

}  // namespace ikv
