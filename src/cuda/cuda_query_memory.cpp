// The device copies of a CUDA pool's query memory (ikv_query_memory): one
// block per sequence, in the layout kernels/ikv_kernels.h's MemoryRecall
// describes, that the recall kernel of a decode reads (kernels/score_pages.cu).
//
// Why a copy per sequence written at each ended turn, and not an upload per
// decode: a turn's memory changes only when the turn ends, while a decode
// runs per layer and step; uploading a batch's memory every decode was about
// half a megabyte per layer at B = 8 (4 turns, 32 query heads, head_dim 128).
// The block's address stays fixed from the sequence's first ended turn until
// it is forgotten, so a CUDA graph that captured a decode reads the turns
// ended after the capture as well.
#include <cuda_runtime_api.h>

#include <new>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_util.hpp"
#include "ikv_kernels.h"
#include "query_memory/query_memory.hpp"

namespace ikv {
namespace {

uint64_t block_bytes(const ikv_query_memory &m) {
    return cuda::mem_block_header_bytes(m.n_layers) +
           uint64_t(m.n_layers) * m.slots() * m.n_q_heads * m.head_dim * sizeof(float);
}

}  // namespace

ikv_status cuda_query_memory_reserve(const ikv_query_memory &m, SeqQueryMemory &seq, const char *fn) {
    if (seq.device != nullptr) return IKV_OK;
    try {
        seq.device_header.assign(cuda::mem_block_header_bytes(m.n_layers) / sizeof(uint32_t), 0);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    DeviceGuard g(m.device);
    if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
    void *p = nullptr;
    cudaError_t err = cudaMalloc(&p, block_bytes(m));
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fail(IKV_E_NOMEM, "%s: cudaMalloc of the sequence's %llu-byte device query memory failed: %s", fn,
                    (unsigned long long)block_bytes(m), cudaGetErrorString(err));
    }
    // Zeros (nothing kept) until the first upload, so that a block whose
    // upload failed reads as empty, never as garbage counts.
    err = cudaMemset(p, 0, block_bytes(m));
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        cudaFree(p);
        return cuda_fail(err, fn, "clearing the sequence's device query memory");
    }
    seq.device = p;
    return IKV_OK;
}

ikv_status cuda_query_memory_upload(const ikv_query_memory &m, SeqQueryMemory &seq, const char *fn) {
    std::vector<uint32_t> &header = seq.device_header;  // sized by cuda_query_memory_reserve
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        // The mean form is one slot, kept once any turn ended (weight > 0).
        header[2 * l] = m.turns > 0 ? seq.filled[l] : (seq.weight[l] > 0.0f ? 1u : 0u);
        header[2 * l + 1] = m.turns > 0 ? seq.next[l] : 0u;
    }
    DeviceGuard g(m.device);
    if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
    // Decodes already enqueued may still read the block: the header's
    // contract has changes wait for them, on any stream.
    cudaError_t err = cudaDeviceSynchronize();
    uint8_t *dst = static_cast<uint8_t *>(seq.device);
    if (err == cudaSuccess)
        err = cudaMemcpy(dst, header.data(), header.size() * sizeof(uint32_t), cudaMemcpyHostToDevice);
    if (err == cudaSuccess)
        err = cudaMemcpy(dst + cuda::mem_block_header_bytes(m.n_layers), seq.m.data(), seq.m.size() * sizeof(float),
                         cudaMemcpyHostToDevice);
    // A copy from pageable memory may return before its data reached the
    // device, on the legacy stream, which non-blocking streams do not follow:
    // done only when the device is idle again.
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "writing the sequence's device query memory");
}

void cuda_query_memory_free(const ikv_query_memory &m, SeqQueryMemory &seq) {
    if (seq.device == nullptr) return;
    DeviceGuard g(m.device);
    cudaFree(seq.device);  // waits for the device: no decode still reads it
    cudaGetLastError();
    seq.device = nullptr;
}

}  // namespace ikv
