// The device records of the rooms a CUDA store's sequences have reserved
// ahead (ikv_pool_reserve; kernels/ikv_kernels.h RoomRecord). A record's
// header, lengths, tickets and staging pointers sit in one allocation that is
// never freed while the store lives: a room that ends retires its record
// (its generation moves on, its room is empty) and a later room reuses it.
// Graphs captured against a record therefore never read freed memory, and
// their appends and decodes, which carry the generation they were captured
// with, do nothing but report once the room they knew has changed. The list
// of the room's pages is a second allocation, prepared before the pool
// commits a new room (so the commit cannot fail for memory) and swapped in
// when the record is written.
//
// Every call that writes or reads a record waits for the whole device first:
// the records are read by kernels on the engine's streams (replays the store
// never sees), and the host rewrites them only when none can be running.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/cuda_util.hpp"
#include "ikv_kernels.h"
#include "pool/page_store.hpp"

namespace ikv {

class DeviceRooms {
public:
    explicit DeviceRooms(uint32_t n_layers) : n_layers_(n_layers) {}
    ~DeviceRooms() {
        if (!handles_.empty()) cudaDeviceSynchronize();
        for (Handle *h : handles_) {
            cudaFree(h->dev);
            cudaFree(h->pages);
            cudaFree(h->next);
            delete h;
        }
    }
    DeviceRooms(const DeviceRooms &) = delete;
    DeviceRooms &operator=(const DeviceRooms &) = delete;

    // Whether any room is live (not retired).
    bool any_live() const { return live_ > 0; }

    // Make *record (null: a new or retired one) ready to hold a room of
    // n_pages pages: device memory for its page list is allocated now. On
    // failure nothing changed (a record taken here goes back). Message set.
    ikv_status prepare(uint32_t n_pages, void **record, const char *fn);
    // Write the room into its prepared record (a new generation). Fails only
    // with a CUDA error of the copies (IKV_E_DEVICE).
    ikv_status set(const PageStore::Room &room, void *record, const char *fn);
    // The device's lengths (lengths[n_layers]) and reports, which are cleared.
    ikv_status take(void *record, uint32_t *lengths, PageStore::RoomReport *report, const char *fn);
    // What retired records met since the last call (replays of graphs that
    // knew their rooms), cleared: the first one's sequence and report.
    ikv_status take_retired(ikv_seq_id *seq, PageStore::RoomReport *report, const char *fn);
    // Retire a record: its room ends (replays of graphs that knew it do nothing
    // and report); it may serve a later room.
    void retire(void *record);
    static void *on_device(const void *record) { return static_cast<const Handle *>(record)->dev; }
    static uint32_t generation(const void *record) { return static_cast<const Handle *>(record)->generation; }

private:
    struct Handle {
        cuda::RoomRecord *dev = nullptr;  // header, lengths [n_layers], tickets [n_layers], stages [n_layers]
        uint8_t *pages = nullptr;         // pages [n_pages], then formats [n_pages]: the record's
        uint8_t *next = nullptr;          // prepared for the next room (prepare -> set)
        uint32_t pages_cap = 0, next_pages = 0;  // pages each list holds
        uint32_t generation = 0;          // the record's on the device; 0: never written
        bool live = false;
        std::vector<uint8_t> image, page_image;  // host images set() writes from (sized by prepare())
    };
    // Read and clear a retired record's report into pending_ (waits for the device).
    ikv_status collect(Handle *h, const char *fn);
    // The layout the kernels know too (kernels/ikv_kernels.h room_*_offset).
    uint64_t lengths_offset() const { return cuda::room_lengths_offset(); }
    uint64_t tickets_offset() const { return cuda::room_tickets_offset(n_layers_); }
    uint64_t stages_offset() const { return cuda::room_stages_offset(n_layers_); }
    uint64_t record_bytes() const { return cuda::room_record_bytes(n_layers_); }
    static uint64_t page_list_bytes(uint32_t n_pages) { return 12ull * (n_pages > 0 ? n_pages : 1); }

    uint32_t n_layers_;
    uint32_t live_ = 0;
    std::vector<Handle *> handles_;  // every record made, live or retired
    std::vector<Handle *> retired_;  // retired ones, for reuse
    bool pending_found_ = false;     // a retired record's report not taken yet (collect, retire)
    ikv_seq_id pending_seq_ = 0;
    int64_t pending_overrun_ = -1;   // its overrun layer when the live room met it (retire), else a stale read
};

}  // namespace ikv
