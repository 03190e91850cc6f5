// The device records of the rooms a CUDA store's sequences have reserved
// ahead (ikv_pool_reserve; kernels/ikv_kernels.h RoomRecord). A record's
// header, lengths and staging pointers sit in one allocation that lives as
// long as the room, so graphs captured against it stay valid; the list of the
// room's pages is a second allocation, replaced when the room is.
//
// Every call here waits for the whole device first: the records are read by
// kernels on the engine's streams (replays the store never sees), and the
// host rewrites or frees them only when none can be running.
#pragma once

#include <cstdint>
#include <set>

#include "cuda/cuda_util.hpp"
#include "ikv_kernels.h"
#include "pool/page_store.hpp"

namespace ikv {

class DeviceRooms {
public:
    explicit DeviceRooms(uint32_t n_layers) : n_layers_(n_layers) {}
    ~DeviceRooms() {
        if (!rooms_.empty()) cudaDeviceSynchronize();
        for (Handle *h : rooms_) release(h);
    }
    DeviceRooms(const DeviceRooms &) = delete;
    DeviceRooms &operator=(const DeviceRooms &) = delete;

    bool empty() const { return rooms_.empty(); }

    // Create (*record null) or rewrite the record of a room. On failure an
    // existing record is unchanged. Message set on failure (fn: the entry point).
    ikv_status set(const PageStore::Room &room, void **record, const char *fn);
    // The device's lengths (lengths[n_layers]) and reports, which are cleared.
    ikv_status take(void *record, uint32_t *lengths, PageStore::RoomReport *report, const char *fn);
    void free(void *record);
    static void *on_device(const void *record) { return static_cast<const Handle *>(record)->dev; }

private:
    struct Handle {
        cuda::RoomRecord *dev = nullptr;  // header, lengths [n_layers], tickets [n_layers], stages [n_layers]
        uint8_t *pages = nullptr;         // pages [n_pages], then formats [n_pages]
    };
    uint64_t lengths_offset() const { return sizeof(cuda::RoomRecord); }
    uint64_t tickets_offset() const { return lengths_offset() + 4ull * n_layers_; }
    uint64_t stages_offset() const { return (tickets_offset() + 4ull * n_layers_ + 7) / 8 * 8; }
    uint64_t record_bytes() const { return stages_offset() + 8ull * n_layers_; }
    static void release(Handle *h) {
        cudaFree(h->dev);
        if (h->pages) cudaFree(h->pages);
        delete h;
    }

    uint32_t n_layers_;
    std::set<Handle *> rooms_;
};

}  // namespace ikv
