// extern "C" boundary of plans: immutable, every accessor O(1).
#include "common/error.hpp"
#include "common/guard.hpp"
#include "plan/plan.hpp"
#include "plan/plan_build.hpp"

namespace {

template <class T>
ikv_status hand_out(const ikv::host_vector<T> &v, const T **items, size_t *count) {
    *items = v.empty() ? nullptr : v.data();
    *count = v.size();
    return IKV_OK;
}

}  // namespace

extern "C" {

IKV_API ikv_status ikv_plan_from_ranges(const ikv_token_range *ranges, size_t n_ranges, uint32_t seq_len,
                                        uint32_t page_size, ikv_format format, ikv_plan **plan_out) {
    const char *fn = "ikv_plan_from_ranges";
    if (n_ranges > 0) IKV_CHECK_NULL(ranges, fn);
    IKV_CHECK_NULL(plan_out, fn);
    return ikv::guarded(fn, [&] {
        return ikv::plan_from_ranges(ranges, n_ranges, seq_len, page_size, format, plan_out, fn);
    });
}

IKV_API void ikv_plan_destroy(ikv_plan *plan) { ikv::delete_handle(plan); }

IKV_API ikv_status ikv_plan_get_summary(const ikv_plan *plan, ikv_plan_summary *out) {
    IKV_CHECK_NULL(plan, "ikv_plan_get_summary");
    IKV_CHECK_NULL(out, "ikv_plan_get_summary");
    *out = plan->summary;
    return IKV_OK;
}

IKV_API ikv_status ikv_plan_pages(const ikv_plan *plan, const ikv_plan_page **pages, size_t *count) {
    IKV_CHECK_NULL(plan, "ikv_plan_pages");
    IKV_CHECK_NULL(pages, "ikv_plan_pages");
    IKV_CHECK_NULL(count, "ikv_plan_pages");
    return hand_out(plan->pages, pages, count);
}

IKV_API ikv_status ikv_plan_skipped_pages(const ikv_plan *plan, const uint32_t **pages, size_t *count) {
    IKV_CHECK_NULL(plan, "ikv_plan_skipped_pages");
    IKV_CHECK_NULL(pages, "ikv_plan_skipped_pages");
    IKV_CHECK_NULL(count, "ikv_plan_skipped_pages");
    return hand_out(plan->skipped, pages, count);
}

IKV_API ikv_status ikv_plan_prefetch(const ikv_plan *plan, const uint32_t **pages, size_t *count) {
    IKV_CHECK_NULL(plan, "ikv_plan_prefetch");
    IKV_CHECK_NULL(pages, "ikv_plan_prefetch");
    IKV_CHECK_NULL(count, "ikv_plan_prefetch");
    return hand_out(plan->prefetch, pages, count);
}

IKV_API ikv_status ikv_plan_decisions(const ikv_plan *plan, const ikv_block_decision **decisions, size_t *count) {
    IKV_CHECK_NULL(plan, "ikv_plan_decisions");
    IKV_CHECK_NULL(decisions, "ikv_plan_decisions");
    IKV_CHECK_NULL(count, "ikv_plan_decisions");
    return hand_out(plan->decisions, decisions, count);
}

IKV_API ikv_status ikv_plan_page_format(const ikv_plan *plan, uint32_t page, ikv_format *out) {
    IKV_CHECK_NULL(plan, "ikv_plan_page_format");
    IKV_CHECK_NULL(out, "ikv_plan_page_format");
    if (page >= plan->summary.pages_total)
        return ikv::fail(IKV_E_RANGE, "ikv_plan_page_format: page %u is out of range; the plan has %u pages", page,
                         plan->summary.pages_total);
    *out = static_cast<ikv_format>(plan->page_formats[page]);
    return IKV_OK;
}

IKV_API ikv_model_shape ikv_model_shape_default(void) {
    ikv_model_shape s;
    s.struct_size = sizeof s;
    s.n_layers = 32;
    s.n_q_heads = 32;
    s.n_kv_heads = 8;
    s.head_dim = 128;
    return s;
}

IKV_API ikv_status ikv_plan_get_cost(const ikv_plan *plan, const ikv_model_shape *shape, ikv_plan_cost *out) {
    const char *fn = "ikv_plan_get_cost";
    IKV_CHECK_NULL(plan, fn);
    IKV_CHECK_NULL(shape, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(shape, sizeof(ikv_model_shape), fn);
    const struct {
        uint32_t value;
        const char *field;
    } counts[] = {{shape->n_layers, "shape->n_layers"},
                  {shape->n_q_heads, "shape->n_q_heads"},
                  {shape->n_kv_heads, "shape->n_kv_heads"},
                  {shape->head_dim, "shape->head_dim"}};
    for (const auto &f : counts)
        if (f.value == 0) return ikv::fail(IKV_E_INVALID, "%s: %s is 0, expected at least 1", fn, f.field);
    if (shape->head_dim % 16 != 0)
        return ikv::fail(IKV_E_INVALID, "%s: shape->head_dim is %u, expected a multiple of 16 (page rows are 16-byte aligned)",
                         fn, shape->head_dim);
    if (shape->n_q_heads % shape->n_kv_heads != 0)
        return ikv::fail(IKV_E_INVALID, "%s: shape->n_q_heads %u is not a multiple of shape->n_kv_heads %u", fn,
                         shape->n_q_heads, shape->n_kv_heads);
    if (!ikv::plan_cost(*plan, *shape, out))
        return ikv::fail(IKV_E_INVALID, "%s: the shape (n_layers %u, n_q_heads %u, n_kv_heads %u, head_dim %u) makes the "
                                        "plan's cost pass 64 bits", fn, shape->n_layers, shape->n_q_heads,
                         shape->n_kv_heads, shape->head_dim);
    return IKV_OK;
}

}  // extern "C"
