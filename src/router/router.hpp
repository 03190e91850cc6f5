// The router handle: a validated copy of ikv_router_config. Memory pressure is
// atomic so an engine may turn it while other threads route.
#pragma once

#include <atomic>

#include "intentkv.h"

struct ikv_router {
    explicit ikv_router(const ikv_router_config &c) : config(c), pressure(c.memory_pressure) {}
    ikv_router_config config;    // memory_pressure in here is the creation value; `pressure` is current
    std::atomic<float> pressure;

    ikv_router_config snapshot() const {
        ikv_router_config c = config;
        c.memory_pressure = pressure.load(std::memory_order_relaxed);
        return c;
    }
};

namespace ikv {

// Check every field of a router config; the sentence names the field.
ikv_status check_router_config(const ikv_router_config &c, const char *fn);

// Check a value that must be finite and in [0, 1]; `field` names it.
ikv_status check_unit_interval(float v, const char *field, const char *fn);

}  // namespace ikv
