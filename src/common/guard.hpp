// Run the body of a public call so that no exception crosses the C boundary:
// std::bad_alloc becomes IKV_E_NOMEM, anything else IKV_E_INTERNAL.
#pragma once

#include <new>

#include "common/error.hpp"

namespace ikv {

template <class Body>
ikv_status guarded(const char *fn, Body &&body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    } catch (...) {
        return fail(IKV_E_INTERNAL, "%s: unexpected exception", fn);
    }
}

// guarded() with the call named (CallName) for the sentences written below
// the API layer: the body of a public call that reaches the page stores.
template <class Body>
ikv_status api_call(const char *fn, Body &&body) noexcept {
    const CallName call(fn);
    return guarded(fn, static_cast<Body &&>(body));
}

}  // namespace ikv
