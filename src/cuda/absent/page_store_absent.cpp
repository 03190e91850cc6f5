// Stand-in for a build without CUDA: a CUDA pool cannot be created.
#include "common/error.hpp"
#include "pool/page_store.hpp"

namespace ikv {

ikv_status make_cuda_store(const ikv_pool_config &, std::unique_ptr<PageStore> *) {
    return fail(IKV_E_NO_DEVICE,
                "ikv_pool_create: config->backend is IKV_BACKEND_CUDA but this build of intentkv has no CUDA "
                "backend; use IKV_BACKEND_CPU or a build with CUDA");
}

}  // namespace ikv
