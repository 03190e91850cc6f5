// Attention feedback of CUDA decodes without a host wait: the decode's
// kernels write each list entry's share into the decoder's device workspace
// (kernels/attention_feedback.cu), and this copies them into pinned host
// memory on the decode's stream and records an event. The shares join the
// averages (ikv_page_feedback) at the next call that reads or resets them,
// which waits for those events. Up to kSlots decodes' copies are in flight
// at once (an engine's layers, one after another, each decode with the same
// feedback): the next waits only for the oldest, kSlots decodes back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "feedback/page_feedback.hpp"
#include "ikv_kernels.h"

namespace ikv {

class CudaPendingShares final : public PendingShares {
public:
    static constexpr int kSlots = 8;

    CudaPendingShares() = default;
    ~CudaPendingShares() override;  // waits for every copy in flight, then frees
    CudaPendingShares(const CudaPendingShares &) = delete;
    CudaPendingShares &operator=(const CudaPendingShares &) = delete;

    // Claims a slot for a decode of n_seqs sequences x n_kv_heads lists of
    // `stride` entries, before any kernel is enqueued (an error leaves
    // nothing): a free slot, grown if needed; with every slot's copy in
    // flight, the oldest is folded into fb first.
    ikv_status reserve(ikv_page_feedback &fb, uint32_t n_seqs, uint32_t n_kv_heads, uint32_t stride, const char *fn);
    // After the decode's feedback kernel: enqueue the copies of o's counts,
    // shares and pages into the claimed slot on `stream` and note whose they are.
    ikv_status enqueue(const cuda::FeedbackOut &o, const ikv_seq_id *seqs, uint32_t n_seqs, uint32_t n_kv_heads,
                       uint32_t layer, cudaStream_t stream, const char *fn);
    // Fold the copies in flight of one layer (decode order): what the feedback
    // prior of a decode of that layer reads. Averages of different layers are
    // disjoint, so the other layers' copies may stay in flight.
    ikv_status settle_layer(ikv_page_feedback &fb, uint32_t layer);

    bool in_flight() const override;
    ikv_status fold(ikv_page_feedback &fb) override;  // every copy in flight, in decode order

private:
    struct Slot {
        uint8_t *pinned = nullptr;  // counts[lists] | shares[entries] | pages[entries]
        uint64_t entries = 0;       // capacity in list entries
        uint32_t lists = 0;         // capacity in lists
        cudaEvent_t copied = nullptr;
        bool in_flight = false;
        uint64_t order = 0;  // decode order among the slots in flight
        // The decode the copy belongs to.
        std::vector<ikv_seq_id> seqs;
        uint32_t n_kv_heads = 0, layer = 0, stride = 0, n_lists = 0;
    };
    // Fold slots in flight (matching `layer`, or all with `all`) oldest first.
    ikv_status fold_where(ikv_page_feedback &fb, bool all, uint32_t layer);
    ikv_status fold_slot(ikv_page_feedback &fb, Slot &s);

    Slot slots_[kSlots];
    int claimed_ = -1;
    uint64_t next_order_ = 0;
    // One list's entries merged per page (a page's entries summed).
    std::vector<uint32_t> run_pages_;
    std::vector<float> run_shares_;
};

}  // namespace ikv
