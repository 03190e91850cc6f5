// Stand-in for a build without CUDA.
#include "common/error.hpp"
#include "cuda/cuda_backend.hpp"

namespace ikv {

void cuda_decoder_state_destroy(CudaDecoderState *) {}

ikv_status cuda_decode_check(CudaDecoderState **, ikv_pool *, const ikv_decode_args *) {
    return fail(IKV_E_NO_DEVICE, "ikv_decode: this build of intentkv has no CUDA backend");
}

ikv_status cuda_decode(CudaDecoderState **, ikv_pool *, const ikv_decode_args *, StepLists &, uint64_t *) {
    return fail(IKV_E_NO_DEVICE, "ikv_decode: this build of intentkv has no CUDA backend");
}

ikv_status cuda_last_selection(const CudaDecoderState *, uint32_t, uint32_t, std::vector<ikv_token_range> &) {
    return fail(IKV_E_NO_DEVICE, "ikv_decoder_last_selection: this build of intentkv has no CUDA backend");
}

// Without CUDA no pool has a device, so no memory has device copies.
ikv_status cuda_query_memory_reserve(const ikv_query_memory &, SeqQueryMemory &, const char *fn) {
    return fail(IKV_E_NO_DEVICE, "%s: this build of intentkv has no CUDA backend", fn);
}
ikv_status cuda_query_memory_upload(const ikv_query_memory &, SeqQueryMemory &, const char *fn) {
    return fail(IKV_E_NO_DEVICE, "%s: this build of intentkv has no CUDA backend", fn);
}
void cuda_query_memory_free(const ikv_query_memory &, SeqQueryMemory &) {}

}  // namespace ikv
