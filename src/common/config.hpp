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

// Write `value` into a caller's versioned struct: only the first
// out->struct_size bytes, which the caller set to the size it was built with,
// so a program built against an older header gets the fields it knows.
template <class T>
void write_versioned(T *out, const T &value) {
    const std::size_t n = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
    const auto size = out->struct_size;
    std::memcpy(static_cast<void *>(out), &value, n);
    out->struct_size = size < sizeof(T) ? size : static_cast<decltype(out->struct_size)>(sizeof(T));
}

// The first published layout of a struct that grew (Old, a prefix of T) filled
// from today's value, for the unversioned *_default symbols that programs
// built against the first header call with a return slot of Old's size.
template <class Old, class T>
Old first_layout(const T &value) {
    static_assert(sizeof(Old) <= sizeof(T), "an older layout is a prefix");
    Old old;
    std::memcpy(static_cast<void *>(&old), &value, sizeof old);
    old.struct_size = static_cast<decltype(old.struct_size)>(sizeof old);
    return old;
}

}  // namespace ikv
