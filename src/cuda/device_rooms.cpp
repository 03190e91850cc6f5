// DeviceRooms (device_rooms.hpp): the device records of reserved rooms.
#include "cuda/device_rooms.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

namespace ikv {

static_assert(offsetof(cuda::RoomRecord, stale_read) == offsetof(cuda::RoomRecord, overrun) + 4,
              "take() clears overrun and stale_read with one copy");

ikv_status DeviceRooms::prepare(uint32_t n_pages, void **record, const char *fn) {
    Handle *h = static_cast<Handle *>(*record);
    const bool taken = h == nullptr;
    try {  // room for one more handle in both lists: the push_backs below and in retire() cannot throw
        handles_.reserve(handles_.size() + 1);
        retired_.reserve(handles_.size() + 1);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    if (taken && !retired_.empty()) {
        // A retired record's report (a replay of a graph that knew its room) is kept before reuse.
        const ikv_status st = collect(retired_.back(), fn);
        if (st != IKV_OK) return st;
        h = retired_.back();
        retired_.pop_back();
    } else if (taken) {
        Handle *made = new (std::nothrow) Handle;
        if (made == nullptr) return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        cudaError_t err = cudaMalloc(reinterpret_cast<void **>(&made->dev), record_bytes());
        if (err == cudaSuccess) err = cudaMemset(made->dev, 0, record_bytes());  // a header retire() may read
        if (err != cudaSuccess) {
            cudaFree(made->dev);
            delete made;
            return cuda_fail(err, fn, "cudaMalloc of a room's record");
        }
        handles_.push_back(made);
        h = made;
    }
    try {  // the host images set() writes from: nothing allocates after the pool commits the room
        h->image.resize(record_bytes());
        h->page_image.resize(page_list_bytes(n_pages));
    } catch (const std::bad_alloc &) {
        if (taken) retired_.push_back(h);
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    if (h->next == nullptr || h->next_pages < n_pages) {
        if (h->next) cudaFree(h->next);
        h->next = nullptr;
        h->next_pages = 0;
        const cudaError_t err = cudaMalloc(reinterpret_cast<void **>(&h->next), page_list_bytes(n_pages));
        if (err != cudaSuccess) {
            if (taken) retired_.push_back(h);  // cannot throw: it came from there or from handles_' room
            return cuda_fail(err, fn, "cudaMalloc of a room's page list");
        }
        h->next_pages = n_pages;
    }
    *record = h;
    return IKV_OK;
}

ikv_status DeviceRooms::set(const PageStore::Room &room, void *record, const char *fn) {
    Handle *h = static_cast<Handle *>(record);
    std::vector<uint8_t> &image = h->image, &page_image = h->page_image;  // sized by prepare()
    std::fill(image.begin(), image.end(), uint8_t(0));
    cuda::RoomRecord hdr{};
    hdr.page_first = room.page_first;
    hdr.n_pages = room.n_pages;
    hdr.end = room.end;
    hdr.seq = uint32_t(room.seq);
    hdr.generation = h->generation + 1;
    uint8_t *base = reinterpret_cast<uint8_t *>(h->dev);
    hdr.lengths = reinterpret_cast<uint32_t *>(base + lengths_offset());
    hdr.tickets = reinterpret_cast<uint32_t *>(base + tickets_offset());  // zero in the image
    hdr.stages = reinterpret_cast<float *const *>(base + stages_offset());
    hdr.pages = reinterpret_cast<uint8_t *const *>(h->next);
    hdr.formats = reinterpret_cast<const uint32_t *>(h->next + 8ull * room.n_pages);
    std::memcpy(image.data(), &hdr, sizeof hdr);
    std::memcpy(image.data() + lengths_offset(), room.lengths, 4ull * n_layers_);
    std::memcpy(image.data() + stages_offset(), room.stages, 8ull * n_layers_);
    std::memcpy(page_image.data(), room.pages, 8ull * room.n_pages);
    for (uint32_t i = 0; i < room.n_pages; ++i) {
        const uint32_t f = uint32_t(room.formats[i]);
        std::memcpy(page_image.data() + 8ull * room.n_pages + 4ull * i, &f, 4);
    }
    cudaError_t err = cudaDeviceSynchronize();  // no kernel reads the record while it changes
    if (err == cudaSuccess) err = cudaMemcpy(h->next, page_image.data(), 12ull * room.n_pages, cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaMemcpy(h->dev, image.data(), image.size(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) return cuda_fail(err, fn, "cudaMemcpy of a room's record");
    std::swap(h->pages, h->next);  // the old list (no kernel reads it now) serves the next prepare
    std::swap(h->pages_cap, h->next_pages);
    h->generation = hdr.generation;
    if (!h->live) ++live_;
    h->live = true;
    return IKV_OK;
}

ikv_status DeviceRooms::take(void *record, uint32_t *lengths, PageStore::RoomReport *report, const char *fn) {
    Handle *h = static_cast<Handle *>(record);
    cuda::RoomRecord hdr{};
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaMemcpy(&hdr, h->dev, sizeof hdr, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess)
        err = cudaMemcpy(lengths, reinterpret_cast<uint8_t *>(h->dev) + lengths_offset(), 4ull * n_layers_,
                         cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && (hdr.overrun != 0 || hdr.stale_read != 0)) {
        const uint32_t zeros[2] = {0, 0};  // overrun and stale_read are adjacent
        err = cudaMemcpy(&h->dev->overrun, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    }
    if (err != cudaSuccess) return cuda_fail(err, fn, "reading a room's lengths from the device");
    report->overrun_layer = hdr.overrun != 0 ? int64_t(hdr.overrun) - 1 : -1;
    report->stale_read = hdr.stale_read != 0;
    return IKV_OK;
}

ikv_status DeviceRooms::collect(Handle *h, const char *fn) {
    cuda::RoomRecord hdr{};
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaMemcpy(&hdr, h->dev, sizeof hdr, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && (hdr.overrun != 0 || hdr.stale_read != 0)) {
        const uint32_t zeros[2] = {0, 0};
        err = cudaMemcpy(&h->dev->overrun, zeros, sizeof zeros, cudaMemcpyHostToDevice);
        if (!pending_found_) pending_found_ = true, pending_seq_ = hdr.seq, pending_overrun_ = -1;
    }
    return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "reading a retired room's report");
}

ikv_status DeviceRooms::take_retired(ikv_seq_id *seq, PageStore::RoomReport *report, const char *fn) {
    *report = PageStore::RoomReport{};
    for (Handle *h : retired_) {
        const ikv_status st = collect(h, fn);
        if (st != IKV_OK) return st;
    }
    if (pending_found_) {  // met by the live room (an overrun), or since by a graph of the ended room
        *seq = pending_seq_;
        report->overrun_layer = pending_overrun_;
        report->stale_read = pending_overrun_ < 0;
        pending_found_ = false;
    }
    return IKV_OK;
}

void DeviceRooms::retire(void *record) {
    Handle *h = static_cast<Handle *>(record);
    // An empty room of a new generation: graphs that knew the old one append and read nothing.
    cuda::RoomRecord hdr{};
    cudaDeviceSynchronize();
    if (cudaMemcpy(&hdr, h->dev, sizeof hdr, cudaMemcpyDeviceToHost) == cudaSuccess) {
        // What the live room met and nobody took (a sequence destroyed after
        // an overrun): an overrun, reported as such, not as a stale graph.
        if ((hdr.overrun != 0 || hdr.stale_read != 0) && !pending_found_)
            pending_found_ = true, pending_seq_ = hdr.seq,
            pending_overrun_ = hdr.overrun != 0 ? int64_t(hdr.overrun) - 1 : -1;
        hdr.overrun = 0;
        hdr.stale_read = 0;
        hdr.generation = h->generation + 1;
        hdr.end = 0;
        hdr.n_pages = 0;
        if (cudaMemcpy(h->dev, &hdr, sizeof hdr, cudaMemcpyHostToDevice) == cudaSuccess) h->generation = hdr.generation;
    }
    cudaGetLastError();  // a failure here leaves a sticky device error the next call reports
    if (h->live) --live_;
    h->live = false;
    retired_.push_back(h);  // cannot throw: retired_ has room for every handle (prepare)
}

}  // namespace ikv
