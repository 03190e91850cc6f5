// Page slabs, shared by the host and the device page stores. Pages of one
// format are carved at a fixed stride from slabs of at most slab_target bytes
// and a kSlabsPerCapacity-th of the capacity (at least one page).
// Freed pages go back to their slab and are reused first; a slab whose pages
// are all free is given back, except one empty slab per format, kept to avoid
// thrashing at a slab boundary (or every one: SlabMemory::keeps_empty_slabs).
// On host memory a new slab that would pass the capacity first makes the
// other formats give back their empty slabs, so reserved_bytes passes it only
// by free pages stranded in part-used slabs of other formats and by the new
// slab itself (slabs hold at most a kSlabsPerCapacity-th of it). Where slab
// memory comes from (mimalloc, cudaMalloc) is a SlabMemory. Not thread-safe:
// the pool serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/page_format.hpp"
#include "intentkv.h"

namespace ikv {

class SlabMemory {
public:
    virtual ~SlabMemory() = default;
    // Allocate `bytes` aligned to the store's alignment; on failure return
    // IKV_E_NOMEM (or IKV_E_DEVICE) with the sentence set via fail().
    virtual ikv_status allocate(uint64_t bytes, uint8_t **out) = 0;
    virtual void deallocate(uint8_t *base) = 0;
    // Keep every empty slab until the allocator goes, for memory whose
    // allocation is slow or synchronizes the device (pinned host memory:
    // cudaHostAlloc ~0.5 ms per MB, cudaFreeHost waits for the device), where
    // pages moving between tiers would otherwise free and re-allocate slabs
    // step after step.
    virtual bool keeps_empty_slabs() const { return false; }
    // Whether deallocate returns without waiting for a device (host heap
    // memory): only then does a new slab make other formats give back their
    // empty slabs (cudaFree would stall an asynchronous append).
    virtual bool frees_without_waiting() const { return true; }
};

class SlabAllocator {
public:
    static constexpr uint64_t kSlabsPerCapacity = 16;
    SlabAllocator(const PageShape &shape, uint64_t capacity_bytes, uint64_t align, uint64_t slab_target_bytes,
                  SlabMemory &memory);
    ~SlabAllocator();
    SlabAllocator(const SlabAllocator &) = delete;
    SlabAllocator &operator=(const SlabAllocator &) = delete;

    ikv_status alloc(ikv_format f, uint8_t **page);
    // Whether alloc(f) would find a free page without adding a slab.
    bool has_free(ikv_format f) const { return !with_free_[f].empty(); }
    void release(ikv_format f, uint8_t *page);
    // Slab memory held, live pages or free.
    uint64_t reserved_bytes() const { return reserved_; }
    // Whether page lies in one of this allocator's slabs (a store with two
    // allocators, device and host tier, tells their pages apart by it).
    bool owns(const uint8_t *page) const;

private:
    struct Slab {
        uint8_t *base = nullptr;
        ikv_format format = IKV_FMT_F16;
        uint32_t n_pages = 0;
        std::vector<uint32_t> free_pages;  // indices of free pages in this slab
    };

    ikv_status add_slab(ikv_format f);
    void drop_slab(Slab *s);
    void drop_empty_slabs();  // every format's (the capacity needs their memory)

    SlabMemory &memory_;
    uint64_t capacity_;
    uint64_t stride_[IKV_FMT_COUNT];
    uint32_t pages_per_slab_[IKV_FMT_COUNT];
    uint32_t empty_slabs_[IKV_FMT_COUNT] = {};
    uint32_t n_slabs_[IKV_FMT_COUNT] = {};  // slabs per format (with_free_[f]'s reserved size)
    std::vector<Slab *> with_free_[IKV_FMT_COUNT];
    std::map<uintptr_t, Slab *> slabs_;  // by base address, to find a page's slab
    uint64_t reserved_ = 0;
};

}  // namespace ikv
