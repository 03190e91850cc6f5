// extern "C" boundary of routers: config checks and routing entry point; the
// rules live in src/router/.
#include <cstring>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "layout/layout.hpp"
#include "router/route.hpp"
#include "router/router.hpp"

extern "C" {

IKV_API ikv_router_config ikv_router_default_config(void) {
    ikv_router_config c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.page_size = 16;
    c.token_budget = 0;
    c.recent_window = 512;
    c.memory_pressure = 0.0f;
    c.attend_threshold = 0.3f;
    c.prefetch_depth = 4;
    c.unlabeled_score = 0.0f;
    c.over_budget = IKV_OVER_BUDGET_FAIL;
    c.precision.always_format = IKV_FMT_F16;
    c.precision.global_format = IKV_FMT_FP8_E4M3;
    c.precision.recent_format = IKV_FMT_F16;
    c.precision.attend_high = IKV_FMT_F16;
    c.precision.attend_mid = IKV_FMT_INT8;
    c.precision.attend_low = IKV_FMT_INT4;
    c.precision.attend_high_score = 0.8f;
    c.precision.attend_mid_score = 0.5f;
    c.precision.demote1_pressure = 0.5f;
    c.precision.demote2_pressure = 0.85f;
    return c;
}

IKV_API ikv_status ikv_router_create(const ikv_router_config *config, ikv_router **out) {
    const char *fn = "ikv_router_create";
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    // The first published ikv_router_config is the whole current struct.
    IKV_CHECK_STRUCT(config, sizeof(ikv_router_config), fn);
    const ikv_router_config c = ikv::read_config(*config, ikv_router_default_config());
    if (ikv_status s = ikv::check_router_config(c, fn)) return s;
    ikv_router *r = ikv::new_handle<ikv_router>(c);
    if (r == nullptr) return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    *out = r;
    return IKV_OK;
}

IKV_API void ikv_router_destroy(ikv_router *router) { ikv::delete_handle(router); }

IKV_API ikv_status ikv_router_get_config(const ikv_router *router, ikv_router_config *out) {
    IKV_CHECK_NULL(router, "ikv_router_get_config");
    IKV_CHECK_NULL(out, "ikv_router_get_config");
    IKV_CHECK_STRUCT(out, sizeof(ikv_router_config), "ikv_router_get_config");
    ikv::write_versioned(out, router->snapshot());
    return IKV_OK;
}

IKV_API ikv_status ikv_router_set_pressure(ikv_router *router, float memory_pressure) {
    const char *fn = "ikv_router_set_pressure";
    IKV_CHECK_NULL(router, fn);
    if (ikv_status s = ikv::check_unit_interval(memory_pressure, "memory_pressure", fn)) return s;
    router->pressure.store(memory_pressure, std::memory_order_relaxed);
    return IKV_OK;
}

IKV_API ikv_status ikv_router_route(const ikv_router *router, const ikv_layout *layout, uint32_t seq_len,
                                    ikv_plan **plan_out) {
    const char *fn = "ikv_router_route";
    IKV_CHECK_NULL(router, fn);
    IKV_CHECK_NULL(layout, fn);
    IKV_CHECK_NULL(plan_out, fn);
    const ikv_router_config c = router->snapshot();
    return ikv::guarded(fn, [&] { return ikv::route_layout(c, *layout, seq_len, plan_out, fn); });
}

}  // extern "C"
