// One element of an engine tensor (queries: F32, F16 or BF16) as fp32 on the
// device: the one load every kernel that reads ikv_decode_args.q uses.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "common/quant.hpp"
#include "intentkv.h"

namespace ikv {
namespace cuda {

__device__ __forceinline__ float load_elem(const void *p, ikv_dtype dt, uint64_t i) {
    if (dt == IKV_DTYPE_F32) return static_cast<const float *>(p)[i];
    const uint16_t b = static_cast<const uint16_t *>(p)[i];
    return dt == IKV_DTYPE_F16 ? __half2float(__ushort_as_half(b)) : bf16_to_f32(b);
}

}  // namespace cuda
}  // namespace ikv
