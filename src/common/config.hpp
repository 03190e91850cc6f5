// Versioned config structs: a caller built against an older header passes a
// smaller struct_size. Copy the bytes it knows over this library's defaults so
// newer fields take their default values.
#pragma once

#include <cstddef>
#include <cstring>

namespace ikv {

template <class T>
T read_config(const T &given, const T &defaults) {
    T out = defaults;
    std::size_t n = given.struct_size < sizeof(T) ? given.struct_size : sizeof(T);
    std::memcpy(static_cast<void *>(&out), &given, n);
    out.struct_size = static_cast<decltype(out.struct_size)>(sizeof(T));
    return out;
}

}  // namespace ikv
