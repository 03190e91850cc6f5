// The head dims the templated kernels are built for, as one dispatch: the
// launchers call with_head_dim(D, fn) and fn gets D as a compile-time
// constant (std::integral_constant<int, D>).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace ikv {
namespace cuda {

// fn(std::integral_constant<int, D>{}) for D = 32, 64, 128 or 256; cudaErrorInvalidValue for any other.
template <class Fn>
cudaError_t with_head_dim(uint32_t D, Fn &&fn) {
    switch (D) {
        case 32: return fn(std::integral_constant<int, 32>{});
        case 64: return fn(std::integral_constant<int, 64>{});
        case 128: return fn(std::integral_constant<int, 128>{});
        case 256: return fn(std::integral_constant<int, 256>{});
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace cuda
}  // namespace ikv
