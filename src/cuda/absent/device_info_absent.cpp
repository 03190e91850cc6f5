// Stand-in for a build without CUDA: no backend, no devices.
#include "cuda/device_info.hpp"

namespace ikv {

void cuda_fill_runtime_info(ikv_runtime_info *info) {
    info->cuda_built = 0;
    info->cuda_device_count = 0;
    info->cuda_device_name[0] = '\0';
    info->cuda_archs[0] = '\0';
}

}  // namespace ikv
