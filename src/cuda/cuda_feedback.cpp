#include "cuda/cuda_feedback.hpp"

#include <algorithm>
#include <new>

#include "common/error.hpp"
#include "cuda/cuda_util.hpp"

namespace ikv {

CudaPendingShares::~CudaPendingShares() {
    const RelaxedCaptureMode relaxed;  // (another thread may be capturing a graph)
    for (Slot &s : slots_) {
        // A copy may still write the buffer: wait (errors have no one to go to), then free.
        if (s.in_flight) cudaEventSynchronize(s.copied);
        if (s.copied != nullptr) cudaEventDestroy(s.copied);
        if (s.pinned != nullptr) cudaFreeHost(s.pinned);
    }
}

bool CudaPendingShares::in_flight() const {
    for (const Slot &s : slots_)
        if (s.in_flight) return true;
    return false;
}

ikv_status CudaPendingShares::reserve(ikv_page_feedback &fb, uint32_t n_seqs, uint32_t n_kv_heads, uint32_t stride,
                                      const char *fn) {
    claimed_ = -1;
    // A free slot, the largest enough first; with none free, the oldest copy is folded.
    int pick = -1, oldest = 0;
    const uint32_t lists = n_seqs * n_kv_heads;
    const uint64_t entries = uint64_t(lists) * stride;
    for (int i = 0; i < kSlots; ++i) {
        const Slot &s = slots_[i];
        if (s.in_flight) {
            if (s.order < slots_[oldest].order || !slots_[oldest].in_flight) oldest = i;
            continue;
        }
        const bool fits = s.entries >= entries && s.lists >= lists;
        if (pick < 0 || (fits && !(slots_[pick].entries >= entries && slots_[pick].lists >= lists))) pick = i;
    }
    if (pick < 0) {
        const ikv_status st = fold_slot(fb, slots_[oldest]);
        if (st != IKV_OK) return st;
        pick = oldest;
    }
    Slot &s = slots_[pick];
    try {
        s.seqs.reserve(n_seqs);
        run_pages_.resize(std::max<uint64_t>(run_pages_.size(), stride));
        run_shares_.resize(run_pages_.size());
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory for the attention feedback", fn);
    }
    const RelaxedCaptureMode relaxed;  // pinned allocations while another thread captures
    if (s.copied == nullptr) {
        // Timing off: the event only orders the host after the copy.
        const cudaError_t err = cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming);
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaEventCreate for the attention feedback");
    }
    if (s.entries < entries || s.lists < lists) {
        const uint64_t want_entries = std::max(entries, s.entries), want_lists = std::max<uint64_t>(lists, s.lists);
        uint8_t *grown = nullptr;
        const cudaError_t err = cudaMallocHost(reinterpret_cast<void **>(&grown), 4 * want_lists + 8 * want_entries);
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaMallocHost of the attention feedback's copy");
        if (s.pinned != nullptr) cudaFreeHost(s.pinned);
        s.pinned = grown;
        s.entries = want_entries;
        s.lists = uint32_t(want_lists);
    }
    claimed_ = pick;
    return IKV_OK;
}

ikv_status CudaPendingShares::enqueue(const cuda::FeedbackOut &o, const ikv_seq_id *seqs, uint32_t n_seqs,
                                      uint32_t n_kv_heads, uint32_t layer, cudaStream_t stream, const char *fn) {
    if (claimed_ < 0) return fail(IKV_E_INTERNAL, "%s: attention feedback copied without a reserved slot", fn);
    Slot &s = slots_[claimed_];
    claimed_ = -1;
    const uint32_t lists = n_seqs * n_kv_heads;
    const uint64_t n = uint64_t(lists) * o.stride;
    uint32_t *counts = reinterpret_cast<uint32_t *>(s.pinned);
    float *shares = reinterpret_cast<float *>(s.pinned + 4ull * s.lists);
    uint32_t *pages = reinterpret_cast<uint32_t *>(s.pinned + 4ull * s.lists + 4 * s.entries);
    cudaError_t err = cudaMemcpyAsync(counts, o.counts, 4ull * lists, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaMemcpyAsync(shares, o.shares, 4 * n, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaMemcpyAsync(pages, o.pages, 4 * n, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaEventRecord(s.copied, stream);
    if (err != cudaSuccess) {
        // A copy enqueued before the failure may still write the buffer, which
        // nothing tracks: wait for the stream (best effort) before it is reused.
        const RelaxedCaptureMode relaxed;
        cudaStreamSynchronize(stream);
        return cuda_fail(err, fn, "copying the attention feedback back");
    }
    s.seqs.assign(seqs, seqs + n_seqs);  // reserved: no allocation
    s.n_kv_heads = n_kv_heads;
    s.layer = layer;
    s.stride = o.stride;
    s.n_lists = lists;
    s.order = next_order_++;
    s.in_flight = true;
    return IKV_OK;
}

ikv_status CudaPendingShares::settle_layer(ikv_page_feedback &fb, uint32_t layer) { return fold_where(fb, false, layer); }

ikv_status CudaPendingShares::fold(ikv_page_feedback &fb) { return fold_where(fb, true, 0); }

ikv_status CudaPendingShares::fold_where(ikv_page_feedback &fb, bool all, uint32_t layer) {
    for (;;) {  // oldest first: a (sequence, layer, kv-head)'s steps fold in decode order
        Slot *next = nullptr;
        for (Slot &s : slots_)
            if (s.in_flight && (all || s.layer == layer) && (next == nullptr || s.order < next->order)) next = &s;
        if (next == nullptr) return IKV_OK;
        const ikv_status st = fold_slot(fb, *next);
        if (st != IKV_OK) return st;
    }
}

// As the CPU's feed_back (decode/cpu_decode.cpp): a page's entries (one list
// holds a page once, or in consecutive pieces) summed, then one EMA step per page.
ikv_status CudaPendingShares::fold_slot(ikv_page_feedback &fb, Slot &s) {
    cudaError_t err;
    {
        const RelaxedCaptureMode relaxed;  // a wait outside any graph, while another thread may capture one
        err = cudaEventSynchronize(s.copied);
    }
    s.in_flight = false;
    if (err != cudaSuccess)
        return cuda_fail(err, current_call(), "the copy of an earlier decode's attention feedback (its shares are lost)");
    const uint32_t *counts = reinterpret_cast<const uint32_t *>(s.pinned);
    const float *shares = reinterpret_cast<const float *>(s.pinned + 4ull * s.lists);
    const uint32_t *pages = reinterpret_cast<const uint32_t *>(s.pinned + 4ull * s.lists + 4 * s.entries);
    for (uint32_t bh = 0; bh < s.n_lists; ++bh) {
        uint32_t runs = 0;
        const uint64_t first = uint64_t(bh) * s.stride;
        for (uint32_t i = 0; i < counts[bh] && i < s.stride; ++i) {
            const uint32_t page = pages[first + i];
            if (runs > 0 && run_pages_[runs - 1] == page)
                run_shares_[runs - 1] += shares[first + i];
            else
                run_pages_[runs] = page, run_shares_[runs++] = shares[first + i];
        }
        fb.add_step(s.seqs[bh / s.n_kv_heads], s.layer, bh % s.n_kv_heads, run_pages_.data(), run_shares_.data(),
                    runs);
    }
    return IKV_OK;
}

}  // namespace ikv
