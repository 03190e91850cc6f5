// Entry points of the CUDA backend that the handle folders call. Defined in
// src/cuda/*.cpp when built with CUDA, and by stand-ins in src/cuda/absent/
// (which fail with IKV_E_NO_DEVICE) otherwise.
#pragma once

#include <cstdint>

#include <vector>

#include "intentkv.h"
#include "decode/step_lists.hpp"
#include "pool/pool_view.hpp"

namespace ikv {

// Per-decoder CUDA state (stream-ordered scratch, device plan buffers).
struct CudaDecoderState;
void cuda_decoder_state_destroy(CudaDecoderState *state);

// Decode on a CUDA pool: args were checked by src/api/ against the pool's
// shape; *state is created on first use. With lists.reuse the device page
// lists of the last call are this call's (used unless the stream is
// capturing); otherwise the call takes snapshots and builds and uploads them.
// Sets lists.reuse to whether it reused them and lists.keep to whether its
// lists may serve a later call. Enqueues on args->stream without host
// synchronization (a feedback's shares are copied back behind the step:
// cuda/cuda_feedback.hpp). *bytes_read: K/V bytes the step reads (host-computed).
ikv_status cuda_decode(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args, StepLists &lists,
                       uint64_t *bytes_read);
// The checks of cuda_decode that need the device but not the page lists
// (head_dim, top-k limits, feedback while capturing): the API layer runs them
// before a decode's args->append is applied, so that they refuse a call with
// nothing appended. cuda_decode runs them again.
ikv_status cuda_decode_check(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args);

// The token runs the last successful (eager) cuda_decode on this state read
// for sequence index b, kv-head h (ikv_decoder_last_selection): from the host
// entries, or with top-k copied from the device after waiting for its stream.
ikv_status cuda_last_selection(const CudaDecoderState *state, uint32_t b, uint32_t h,
                               std::vector<ikv_token_range> &runs);

// Query memories of CUDA pools (ikv_query_memory, src/cuda/cuda_query_memory.cpp):
// the device copy of one sequence's ended turns that decodes read.
struct SeqQueryMemory;
// Allocates seq's device copy when it has none (IKV_E_NOMEM: nothing changed).
ikv_status cuda_query_memory_reserve(const ikv_query_memory &m, SeqQueryMemory &seq, const char *fn);
// Writes seq's device copy from its host state, after the device finished
// the work already enqueued (decodes that may read the copy).
ikv_status cuda_query_memory_upload(const ikv_query_memory &m, SeqQueryMemory &seq, const char *fn);
// Frees seq's device copy (cudaFree waits for the device first).
void cuda_query_memory_free(const ikv_query_memory &m, SeqQueryMemory &seq);

}  // namespace ikv
