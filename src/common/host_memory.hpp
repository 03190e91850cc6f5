// Host memory for the layout, router and plan handles: everything comes from
// mimalloc's own API (never the host program's malloc). Containers use
// mi_stl_allocator, which throws std::bad_alloc on failure; the API layer
// turns that into IKV_E_NOMEM.
#pragma once

#include <mimalloc.h>

#include <new>
#include <utility>
#include <vector>

namespace ikv {

template <class T>
using host_vector = std::vector<T, mi_stl_allocator<T>>;

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
