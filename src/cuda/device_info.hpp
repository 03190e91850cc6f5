// What the runtime-info call reports about the CUDA backend. Implemented in
// src/cuda/ when the library is built with CUDA, in src/cuda/absent/ otherwise.
#pragma once

#include "intentkv.h"

namespace ikv {

// Fill cuda_built, cuda_device_count, cuda_device_name, cuda_archs.
void cuda_fill_runtime_info(ikv_runtime_info *info);

}  // namespace ikv
