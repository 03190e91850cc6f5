// What ikv_runtime_info reports about the CUDA backend in a build with CUDA.
#include <cuda_runtime_api.h>

#include <cstdio>

#include "cuda/device_info.hpp"

#ifndef IKV_CUDA_ARCHS
#define IKV_CUDA_ARCHS ""
#endif

namespace ikv {

void cuda_fill_runtime_info(ikv_runtime_info *info) {
    info->cuda_built = 1;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver or no device: report none, keep no sticky error
        n = 0;
    }
    info->cuda_device_count = n;
    info->cuda_device_name[0] = '\0';
    cudaDeviceProp prop;
    if (n > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        std::snprintf(info->cuda_device_name, sizeof info->cuda_device_name, "%.63s", prop.name);
    std::snprintf(info->cuda_archs, sizeof info->cuda_archs, "%s", IKV_CUDA_ARCHS);
}

}  // namespace ikv
