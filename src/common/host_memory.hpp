// Host memory for the layout, router, plan, query-memory and feedback handles,
// the decoder's scratch and the host page slabs: mimalloc's own C API (never
// the host program's malloc, except in ThreadSanitizer builds: host_malloc). The pool's bookkeeping uses std containers (operator new, see
// docs/FORMATS.md "Memory"); its page slabs come from mimalloc. Containers here
// use host_allocator, which throws std::bad_alloc when mimalloc returns null; the
// API layer turns that into IKV_E_NOMEM. (Not mimalloc's mi_stl_allocator:
// it allocates through mi_new_n, which in the C build of libmimalloc that
// Debian ships calls abort() when memory runs out, and no call of the
// library may abort.)
#pragma once

#include <mimalloc.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

namespace ikv {

// The library's own host allocations. mimalloc's C API, except in
// ThreadSanitizer builds (IKV_HOST_MALLOC_SYSTEM, cmake/IntentkvOptions.cmake):
// mimalloc is not instrumented there, so memory it hands from a finished
// thread to a running one looks to TSan like a race on the library's data;
// malloc is TSan's own allocator, which it follows.
inline void *host_malloc(std::size_t n) noexcept {
#if defined(IKV_HOST_MALLOC_SYSTEM)
    return std::malloc(n);
#else
    return mi_malloc(n);
#endif
}
// n * size bytes; null where that overflows.
inline void *host_mallocn(std::size_t n, std::size_t size) noexcept {
#if defined(IKV_HOST_MALLOC_SYSTEM)
    if (size != 0 && n > SIZE_MAX / size) return nullptr;
    return std::malloc(n * size);
#else
    return mi_mallocn(n, size);
#endif
}
// align a power of two.
inline void *host_malloc_aligned(std::size_t n, std::size_t align) noexcept {
#if defined(IKV_HOST_MALLOC_SYSTEM)
    if (n > SIZE_MAX - align) return nullptr;
    return std::aligned_alloc(align, (n + align - 1) / align * align);  // a multiple of align, as C11 asks
#else
    return mi_malloc_aligned(n, align);
#endif
}
inline void host_free(void *p) noexcept {
#if defined(IKV_HOST_MALLOC_SYSTEM)
    std::free(p);
#else
    mi_free(p);
#endif
}

template <class T>
struct host_allocator {
    static_assert(alignof(T) <= alignof(std::max_align_t), "mi_mallocn aligns as malloc does, no more");
    using value_type = T;
    host_allocator() noexcept = default;
    template <class U>
    host_allocator(const host_allocator<U> &) noexcept {}
    T *allocate(std::size_t n) {
        void *p = host_mallocn(n, sizeof(T));  // null on overflow of n * sizeof(T) too
        if (p == nullptr) throw std::bad_alloc();
        return static_cast<T *>(p);
    }
    void deallocate(T *p, std::size_t) noexcept { host_free(p); }
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
    void *mem = host_malloc(sizeof(T));
    if (mem == nullptr) return nullptr;
    try {
        return new (mem) T(std::forward<Args>(args)...);
    } catch (...) {
        host_free(mem);
        return nullptr;
    }
}

template <class T>
void delete_handle(T *obj) noexcept {
    if (obj == nullptr) return;
    obj->~T();
    host_free(obj);
}

}  // namespace ikv
