// The host tier of a CUDA pool's pages (ikv_seq_offload / ikv_seq_fetch):
// slab memory in pinned, mapped host memory that kernels read and write in
// place, and the source pages of moves whose copies may still be running.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "cuda/cuda_util.hpp"
#include "pool/slab_allocator.hpp"

namespace ikv {

// Slab memory from cudaHostAlloc, mapped into the device's address space
// and portable to every context. With unified addressing (every 64-bit
// platform CUDA supports) the device reads it at the host pointer itself,
// which the check below makes sure of: the page's address is the same in
// both tiers' tables, as decode expects.
class PinnedMemory final : public SlabMemory {
public:
    explicit PinnedMemory(int device) : device_(device) {}
    ikv_status allocate(uint64_t bytes, uint8_t **out) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool", "cudaSetDevice");
        void *p = nullptr;
        cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return fail(IKV_E_NOMEM, "%s: cudaHostAlloc of a %llu-byte host-tier slab failed: %s",
                        current_call(), (unsigned long long)bytes, cudaGetErrorString(err));
        }
        void *dev = nullptr;
        err = cudaHostGetDevicePointer(&dev, p, 0);
        if (err != cudaSuccess || dev != p) {
            cudaGetLastError();
            cudaFreeHost(p);
            return fail(IKV_E_DEVICE,
                        "%s: pinned host memory is not mapped at its host address on device %d (no unified "
                        "addressing); the host tier needs it",
                        current_call(), device_);
        }
        *out = static_cast<uint8_t *>(p);
        return IKV_OK;
    }
    void deallocate(uint8_t *base) override { cudaFreeHost(base); }
    bool keeps_empty_slabs() const override { return true; }

private:
    int device_;
};

// Pages whose copies were enqueued but may not be done: each batch waits on
// the event recorded after its copies. drain() hands the finished ones (or,
// waiting, all) to `release`. Its lock is a leaf: add() runs outside the
// pool's accounting mutex, drain() under it.
class DeferredReleases {
public:
    using Page = std::pair<ikv_format, uint8_t *>;

    ~DeferredReleases() {
        for (Batch &b : batches_)
            if (b.done) cudaEventDestroy(b.done);
    }
    // The sources of copies just enqueued on stream, taken from `pages` on
    // success (on failure `pages` is left as it was).
    cudaError_t add(cudaStream_t stream, std::vector<Page> &pages) {
        cudaEvent_t ev = nullptr;
        cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (err == cudaSuccess) err = cudaEventRecord(ev, stream);
        if (err != cudaSuccess) {
            if (ev) cudaEventDestroy(ev);
            return err;
        }
        std::lock_guard<std::mutex> lock(mu_);
        batches_.push_back(Batch{ev, std::move(pages)});
        return cudaSuccess;
    }
    // Pages whose copies are known done (the caller synchronized): released
    // at the next drain. No allocation when reserve() made room first.
    void add_done(std::vector<Page> pages) {
        std::lock_guard<std::mutex> lock(mu_);
        batches_.push_back(Batch{nullptr, std::move(pages)});
    }
    // Room for `extra` more batches, so that add() and add_done() after it
    // cannot fail for memory (a move calls it before enqueueing any copy).
    void reserve(size_t extra) {
        std::lock_guard<std::mutex> lock(mu_);
        batches_.reserve(batches_.size() + extra);
    }
    bool empty() const {
        std::lock_guard<std::mutex> lock(mu_);
        return batches_.empty();
    }
    template <class Release>
    void drain(bool wait, Release &&release) {
        std::lock_guard<std::mutex> lock(mu_);
        size_t kept = 0;
        for (size_t i = 0; i < batches_.size(); ++i) {
            Batch &b = batches_[i];
            const cudaError_t st = b.done == nullptr ? cudaSuccess  // add_done: copied already
                                   : wait            ? cudaEventSynchronize(b.done)
                                                     : cudaEventQuery(b.done);
            if (st == cudaErrorNotReady) {
                // Never move a batch onto itself: a self-move-assigned vector is
                // left empty (libstdc++), and its pages were then never released
                // (both tiers' slabs grew at every step whose copies were still
                // running when the next allocation looked: bench/RESULTS.md 9b).
                if (kept != i) batches_[kept] = std::move(b);
                ++kept;
                continue;
            }
            if (st != cudaSuccess) cudaGetLastError();  // a failed copy: its device is lost anyway
            for (const Page &p : b.pages) release(p.first, p.second);
            if (b.done) cudaEventDestroy(b.done);
        }
        batches_.resize(kept);
    }

private:
    struct Batch {
        cudaEvent_t done;
        std::vector<Page> pages;
    };
    mutable std::mutex mu_;
    std::vector<Batch> batches_;
};

}  // namespace ikv
