// Host memory for the layout, router, plan, query-memory and feedback handles
// and the decoder's scratch: mimalloc's own C API (never the host program's
// malloc). The pool's bookkeeping uses std containers (operator new, see
// docs/FORMATS.md "Memory"); its page slabs come from mimalloc. Containers here
// use host_allocator, which throws std::bad_alloc when mimalloc returns null; the
// API layer turns that into IKV_E_NOMEM. (Not mimalloc's mi_stl_allocator:
// it allocates through mi_new_n, which in the C build of libmimalloc that
// Debian ships calls abort() when memory runs out, and no call of the
// library may abort.)
#pragma once

#include <mimalloc.h>

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace ikv {

template <class T>
struct host_allocator {
    static_assert(alignof(T) <= alignof(std::max_align_t), "mi_mallocn aligns as malloc does, no more");
    using value_type = T;
    host_allocator() noexcept = default;
    template <class U>
    host_allocator(const host_allocator<U> &) noexcept {}
    T *allocate(std::size_t n) {
        void *p = mi_mallocn(n, sizeof(T));  // null on overflow of n * sizeof(T) too
        if (p == nullptr) throw std::bad_alloc();
        return static_cast<T *>(p);
    }
    void deallocate(T *p, std::size_t) noexcept { mi_free(p); }
    template <class U>
    bool operator==(const host_allocator<U> &) const noexcept {
        return true;
    }
    template <class U>
    bool operator!=(const host_allocator<U> &) const noexcept {
        return false;
    }
};

template <class T>
using host_vector = std::vector<T, host_allocator<T>>;

// Construct a handle object in mimalloc memory; nullptr when out of memory
// (or when the constructor throws bad_alloc).
template <class T, class... Args>
T *new_handle(Args &&...args) noexcept {
    void *mem = mi_malloc(sizeof(T));
    if (mem == nullptr) return nullptr;
    try {
        return new (mem) T(std::forward<Args>(args)...);
    } catch (...) {
        mi_free(mem);
        return nullptr;
    }
}

template <class T>
void delete_handle(T *obj) noexcept {
    if (obj == nullptr) return;
    obj->~T();
    mi_free(obj);
}

}  // namespace ikv
