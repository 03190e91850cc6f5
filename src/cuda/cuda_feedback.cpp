#include "cuda/cuda_feedback.hpp"

#include <algorithm>
#include <new>

#include "common/error.hpp"
#include "cuda/cuda_util.hpp"

namespace ikv {

CudaPendingShares::~CudaPendingShares() {
    // The copy may still write the buffer: wait (errors have no one to go to), then free.
    if (in_flight_) cudaEventSynchronize(copied_);
    if (copied_ != nullptr) cudaEventDestroy(copied_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

ikv_status CudaPendingShares::reserve(ikv_page_feedback &fb, uint32_t n_seqs, uint32_t n_kv_heads, uint32_t stride,
                                      const char *fn) {
    const uint32_t lists = n_seqs * n_kv_heads;
    const uint64_t entries = uint64_t(lists) * stride;
    try {
        seqs_.reserve(n_seqs);
        run_pages_.resize(std::max<uint64_t>(run_pages_.size(), stride));
        run_shares_.resize(run_pages_.size());
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory for the attention feedback", fn);
    }
    if (copied_ == nullptr) {
        // Timing off: the event only orders the host after the copy.
        const cudaError_t err = cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaEventCreate for the attention feedback");
    }
    if (entries <= capacity_ && lists <= capacity_lists_) return IKV_OK;
    // Grow: the copy in flight writes the old buffer, so its shares are folded first.
    const ikv_status st = fb.settle();
    if (st != IKV_OK) return st;
    const uint64_t want_entries = std::max(entries, capacity_), want_lists = std::max(lists, capacity_lists_);
    uint8_t *grown = nullptr;
    const cudaError_t err = cudaMallocHost(reinterpret_cast<void **>(&grown), 4 * want_lists + 8 * want_entries);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fail(IKV_E_NOMEM, "%s: out of pinned host memory for the attention feedback (%llu bytes)", fn,
                    (unsigned long long)(4 * want_lists + 8 * want_entries));
    }
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    pinned_ = grown;
    capacity_ = want_entries;
    capacity_lists_ = uint32_t(want_lists);
    return IKV_OK;
}

ikv_status CudaPendingShares::enqueue(ikv_page_feedback &fb, const cuda::FeedbackOut &o, const ikv_seq_id *seqs,
                                      uint32_t n_seqs, uint32_t n_kv_heads, uint32_t layer, cudaStream_t stream,
                                      const char *fn) {
    const ikv_status st = fb.settle();  // the previous decode's shares leave the buffer
    if (st != IKV_OK) return st;
    const uint32_t lists = n_seqs * n_kv_heads;
    const uint64_t n = uint64_t(lists) * o.stride;
    uint32_t *counts = reinterpret_cast<uint32_t *>(pinned_);
    float *shares = reinterpret_cast<float *>(pinned_ + 4ull * capacity_lists_);
    uint32_t *pages = reinterpret_cast<uint32_t *>(pinned_ + 4ull * capacity_lists_ + 4 * capacity_);
    cudaError_t err = cudaMemcpyAsync(counts, o.counts, 4ull * lists, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaMemcpyAsync(shares, o.shares, 4 * n, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaMemcpyAsync(pages, o.pages, 4 * n, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaEventRecord(copied_, stream);
    if (err != cudaSuccess) return cuda_fail(err, fn, "copying the attention feedback back");
    seqs_.assign(seqs, seqs + n_seqs);  // reserved: no allocation
    n_kv_heads_ = n_kv_heads;
    layer_ = layer;
    stride_ = o.stride;
    n_lists_ = lists;
    in_flight_ = true;
    return IKV_OK;
}

// As the CPU's feed_back (decode/cpu_decode.cpp): a page's entries (one list
// holds a page once, or in consecutive pieces) summed, then one EMA step per page.
ikv_status CudaPendingShares::fold(ikv_page_feedback &fb) {
    if (!in_flight_) return IKV_OK;
    in_flight_ = false;
    const cudaError_t err = cudaEventSynchronize(copied_);
    if (err != cudaSuccess)
        return cuda_fail(err, current_call(), "the copy of an earlier decode's attention feedback (its shares are lost)");
    const uint32_t *counts = reinterpret_cast<const uint32_t *>(pinned_);
    const float *shares = reinterpret_cast<const float *>(pinned_ + 4ull * capacity_lists_);
    const uint32_t *pages = reinterpret_cast<const uint32_t *>(pinned_ + 4ull * capacity_lists_ + 4 * capacity_);
    for (uint32_t bh = 0; bh < n_lists_; ++bh) {
        uint32_t runs = 0;
        const uint64_t first = uint64_t(bh) * stride_;
        for (uint32_t i = 0; i < counts[bh] && i < stride_; ++i) {
            const uint32_t page = pages[first + i];
            if (runs > 0 && run_pages_[runs - 1] == page)
                run_shares_[runs - 1] += shares[first + i];
            else
                run_pages_[runs] = page, run_shares_[runs++] = shares[first + i];
        }
        fb.add_step(seqs_[bh / n_kv_heads_], layer_, bh % n_kv_heads_, run_pages_.data(), run_shares_.data(), runs);
    }
    return IKV_OK;
}

}  // namespace ikv
