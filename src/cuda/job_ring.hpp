// Job buffers of the CUDA store's appends: the host fills pinned memory, one
// cudaMemcpyAsync moves it to the device, kernels read it there. A buffer may
// be refilled only after the kernels that read its device copy are done, so
// the store cycles through kSlots of them, each with an event recorded after
// its last reader. A synchronous append finds every slot idle; an
// asynchronous one (the host does not wait for the device) waits only when it
// comes back to a slot still in use kSlots appends later: the host then runs
// at most kSlots appends ahead of the device instead of draining it each time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "ikv_kernels.h"

namespace ikv {

class JobRing {
public:
    static constexpr int kSlots = 8;

    struct Slot {
        cuda::AppendJob *host = nullptr;  // pinned
        cuda::AppendJob *dev = nullptr;
        size_t cap = 0;
        cudaEvent_t done = nullptr;  // recorded after the slot's last reader
        bool in_use = false;         // `done` was recorded and may be pending
    };

    JobRing() = default;
    JobRing(const JobRing &) = delete;
    JobRing &operator=(const JobRing &) = delete;
    ~JobRing() {
        for (Slot &s : slots_) {
            if (s.in_use) cudaEventSynchronize(s.done);
            if (s.dev) cudaFree(s.dev);
            if (s.host) cudaFreeHost(s.host);
            if (s.done) cudaEventDestroy(s.done);
        }
    }

    // The next slot, idle and with room for n jobs (on the current device).
    cudaError_t acquire(size_t n, Slot **out) {
        Slot &s = slots_[next_];
        next_ = (next_ + 1) % kSlots;
        cudaError_t err = cudaSuccess;
        if (s.in_use) err = cudaEventSynchronize(s.done);
        s.in_use = false;
        if (err == cudaSuccess && s.done == nullptr) err = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
        if (err == cudaSuccess && n > s.cap) {
            const size_t cap = std::max<size_t>(n, 2 * s.cap);
            if (s.dev) cudaFree(s.dev);
            if (s.host) cudaFreeHost(s.host);
            s.dev = s.host = nullptr;
            s.cap = 0;
            err = cudaMalloc(reinterpret_cast<void **>(&s.dev), cap * sizeof(cuda::AppendJob));
            if (err == cudaSuccess) err = cudaMallocHost(reinterpret_cast<void **>(&s.host), cap * sizeof(cuda::AppendJob));
            if (err == cudaSuccess) s.cap = cap;
        }
        *out = &s;
        return err;
    }

    // Every slot with room for n jobs (waiting for a busy one first), so that
    // the next acquire(n) of any slot allocates nothing.
    cudaError_t reserve(size_t n) {
        for (int i = 0; i < kSlots; ++i) {
            Slot &s = slots_[i];
            if (n <= s.cap) continue;
            cudaError_t err = s.in_use ? cudaEventSynchronize(s.done) : cudaSuccess;
            s.in_use = false;
            const size_t cap = std::max<size_t>(n, 2 * s.cap);
            if (s.dev) cudaFree(s.dev);
            if (s.host) cudaFreeHost(s.host);
            s.dev = s.host = nullptr;
            s.cap = 0;
            if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void **>(&s.dev), cap * sizeof(cuda::AppendJob));
            if (err == cudaSuccess)
                err = cudaMallocHost(reinterpret_cast<void **>(&s.host), cap * sizeof(cuda::AppendJob));
            if (err != cudaSuccess) return err;
            s.cap = cap;
        }
        return cudaSuccess;
    }

    // n jobs of the slot's host buffer to its device buffer, on stream.
    static cudaError_t upload(const Slot &s, size_t n, cudaStream_t stream) {
        return cudaMemcpyAsync(s.dev, s.host, n * sizeof(cuda::AppendJob), cudaMemcpyHostToDevice, stream);
    }

    // After the slot's last reader was enqueued on stream.
    static cudaError_t release(Slot *s, cudaStream_t stream) {
        const cudaError_t err = cudaEventRecord(s->done, stream);
        s->in_use = err == cudaSuccess;
        return err;
    }

private:
    Slot slots_[kSlots];
    int next_ = 0;
};

}  // namespace ikv
