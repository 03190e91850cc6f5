#include "pool/slab_allocator.hpp"

#include <algorithm>
#include <new>

#include "common/error.hpp"

namespace ikv {

SlabAllocator::SlabAllocator(const PageShape &shape, uint64_t capacity_bytes, uint64_t align,
                             uint64_t slab_target_bytes, SlabMemory &memory)
    : memory_(memory), capacity_(capacity_bytes) {
    // Slabs of at most a 16th of the capacity, so that the free pages stranded
    // in part-used slabs of other formats (what can take reserved_bytes past
    // the capacity) come in small pieces.
    const uint64_t target = std::min(slab_target_bytes, capacity_bytes / kSlabsPerCapacity);
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        stride_[f] = align_up(page_bytes(shape, ikv_format(f)), align);
        pages_per_slab_[f] = uint32_t(std::max<uint64_t>(target / stride_[f], 1));
    }
}

SlabAllocator::~SlabAllocator() {
    for (auto &kv : slabs_) {
        memory_.deallocate(kv.second->base);
        delete kv.second;
    }
}

ikv_status SlabAllocator::alloc(ikv_format f, uint8_t **page) {
    std::vector<Slab *> &avail = with_free_[f];
    if (avail.empty()) {
        const ikv_status st = add_slab(f);
        if (st != IKV_OK) return st;
    }
    Slab *s = avail.back();
    const uint32_t idx = s->free_pages.back();
    s->free_pages.pop_back();
    if (s->free_pages.size() + 1 == s->n_pages) --empty_slabs_[f];  // it was empty
    if (s->free_pages.empty()) avail.pop_back();
    *page = s->base + uint64_t(idx) * stride_[f];
    return IKV_OK;
}

bool SlabAllocator::owns(const uint8_t *page) const {
    auto it = slabs_.upper_bound(reinterpret_cast<uintptr_t>(page));
    if (it == slabs_.begin()) return false;
    --it;
    const Slab *s = it->second;
    return reinterpret_cast<uintptr_t>(page) < reinterpret_cast<uintptr_t>(s->base) + stride_[s->format] * s->n_pages;
}

void SlabAllocator::release(ikv_format f, uint8_t *page) {
    auto it = slabs_.upper_bound(reinterpret_cast<uintptr_t>(page));
    --it;  // the slab whose base is the greatest <= page
    Slab *s = it->second;
    const uint32_t idx = uint32_t((page - s->base) / stride_[f]);
    // Neither push_back allocates (a release cannot fail): free_pages holds
    // n_pages from the slab's start, with_free_[f] one entry per slab of f.
    if (s->free_pages.empty()) with_free_[f].push_back(s);
    s->free_pages.push_back(idx);
    if (s->free_pages.size() == s->n_pages) {
        if (empty_slabs_[f] >= 1 && !memory_.keeps_empty_slabs())
            drop_slab(s);
        else
            ++empty_slabs_[f];
    }
}

ikv_status SlabAllocator::add_slab(ikv_format f) {
    // Stay within the capacity where freeing is cheap: give back the empty
    // slabs kept for other formats first (not where a free waits for the
    // device, or for memory that keeps them).
    const uint32_t n_pages = pages_per_slab_[f];
    const uint64_t bytes = stride_[f] * n_pages;
    if (memory_.frees_without_waiting() && !memory_.keeps_empty_slabs() && reserved_ + bytes > capacity_)
        drop_empty_slabs();
    uint8_t *base = nullptr;
    const ikv_status st = memory_.allocate(bytes, &base);
    if (st != IKV_OK) return st;
    Slab *s = nullptr;
    try {
        s = new Slab;
        s->base = base;
        s->format = f;
        s->n_pages = n_pages;
        s->free_pages.reserve(s->n_pages);
        for (uint32_t i = s->n_pages; i-- > 0;) s->free_pages.push_back(i);  // lowest index first out
        // Room for every slab of f at once, so that release() never grows it.
        with_free_[f].reserve(uint64_t(n_slabs_[f]) + 1);
        slabs_.emplace(reinterpret_cast<uintptr_t>(base), s);
        with_free_[f].push_back(s);  // cannot throw: reserved above
    } catch (const std::bad_alloc &) {
        delete s;
        memory_.deallocate(base);
        return fail(IKV_E_NOMEM, "%s: out of host memory for slab bookkeeping", current_call());
    }
    ++empty_slabs_[f];
    ++n_slabs_[f];
    reserved_ += bytes;
    return IKV_OK;
}

void SlabAllocator::drop_empty_slabs() {
    for (auto it = slabs_.begin(); it != slabs_.end();) {  // no list of them: nothing here allocates
        Slab *s = (it++)->second;                          // (drop_slab erases s's entry, not the next)
        if (s->free_pages.size() == s->n_pages) {
            --empty_slabs_[s->format];
            drop_slab(s);
        }
    }
}

void SlabAllocator::drop_slab(Slab *s) {
    std::vector<Slab *> &avail = with_free_[s->format];
    avail.erase(std::find(avail.begin(), avail.end(), s));
    slabs_.erase(reinterpret_cast<uintptr_t>(s->base));
    reserved_ -= stride_[s->format] * s->n_pages;
    --n_slabs_[s->format];
    memory_.deallocate(s->base);
    delete s;
}

}  // namespace ikv
