// The integer a C caller stored in an enum field. C allows any int there; in
// C++ loading an out-of-range value through the enum type is undefined, so
// validation reads the bytes as an int instead.
#pragma once

#include <cstring>
#include <type_traits>

namespace ikv {

template <class E>
int raw_enum(const E &e) {
    static_assert(std::is_enum<E>::value && sizeof(E) == sizeof(int), "C enums are int-sized");
    int v;
    std::memcpy(&v, &e, sizeof v);
    return v;
}

// True when the stored value is in [0, count).
template <class E>
bool enum_below(const E &e, int count) {
    const int v = raw_enum(e);
    return v >= 0 && v < count;
}

}  // namespace ikv
