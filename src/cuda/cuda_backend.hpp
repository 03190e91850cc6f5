// Entry points of the CUDA backend that the handle folders call. Defined in
// src/cuda/*.cpp when built with CUDA, and by stand-ins in src/cuda/absent/
// (which fail with IKV_E_NO_DEVICE) otherwise.
#pragma once

#include <cstdint>

#include <vector>

#include "intentkv.h"
#include "pool/pool_view.hpp"

namespace ikv {

// Per-decoder CUDA state (stream-ordered scratch, device plan buffers).
struct CudaDecoderState;
void cuda_decoder_state_destroy(CudaDecoderState *state);

// Decode on a CUDA pool: args were checked by src/api/ against the pool's
// shape, which took snaps[b] (sequence b's block table at args->layer, device
// page addresses); *state is created on first use. Enqueues on args->stream without
// host synchronization. *bytes_read: K/V bytes the step reads (host-computed).
ikv_status cuda_decode(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args,
                       const std::vector<SeqSnapshot> &snaps, uint64_t *bytes_read);


}  // namespace ikv
