// Layout edits, router configs and routes, and ikv_plan_from_ranges from
// fuzzer bytes: no call may crash, a refused edit changes nothing, and every
// plan the library returns keeps the header's promises (entries sorted, inside
// the sequence, token counts consistent).
#include <cmath>
#include <vector>

#include "fuzz_input.hpp"
#include "intentkv.h"

namespace {

void check_plan(const ikv_plan *plan, uint32_t seq_len) {
    ikv_plan_summary sum;
    FUZZ_CHECK(ikv_plan_get_summary(plan, &sum) == IKV_OK);
    FUZZ_CHECK(sum.seq_len == seq_len);
    const ikv_plan_page *pages;
    size_t n;
    FUZZ_CHECK(ikv_plan_pages(plan, &pages, &n) == IKV_OK);
    uint64_t tokens = 0;
    for (size_t i = 0; i < n; ++i) {
        FUZZ_CHECK(pages[i].token_begin < pages[i].token_end && pages[i].token_end <= seq_len);
        FUZZ_CHECK(pages[i].token_begin / sum.page_size == pages[i].page);
        FUZZ_CHECK((pages[i].token_end - 1) / sum.page_size == pages[i].page);
        if (i > 0) FUZZ_CHECK(pages[i - 1].page < pages[i].page ||
                              (pages[i - 1].page == pages[i].page && pages[i - 1].token_end <= pages[i].token_begin));
        tokens += pages[i].token_end - pages[i].token_begin;
    }
    FUZZ_CHECK(tokens == sum.tokens_selected);
    const ikv_block_decision *dec;
    size_t nd;
    FUZZ_CHECK(ikv_plan_decisions(plan, &dec, &nd) == IKV_OK);
    ikv_model_shape shape = ikv_model_shape_default();
    ikv_plan_cost cost;
    FUZZ_CHECK(ikv_plan_get_cost(plan, &shape, &cost) == IKV_OK);
}

void fuzz_ranges(FuzzInput &in) {
    const uint32_t n = in.below(9), seq_len = in.take<uint16_t>(), page = 1u << in.below(9);
    std::vector<ikv_token_range> r(n);
    for (auto &x : r) x = {in.take<uint16_t>(), in.take<uint16_t>()};
    ikv_plan *plan = reinterpret_cast<ikv_plan *>(0x1);
    const ikv_status st = ikv_plan_from_ranges(n ? r.data() : nullptr, n, seq_len, page,
                                               ikv_format(in.below(7) == 6 ? 255 : in.below(6)), &plan);
    if (st != IKV_OK) {
        FUZZ_CHECK(ikv_last_error()[0] != '\0');
        return;
    }
    check_plan(plan, seq_len);
    ikv_plan_destroy(plan);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in(data, size);
    ikv_layout *layout = nullptr;
    if (ikv_layout_create(&layout) != IKV_OK) return 0;
    std::vector<uint32_t> ids;
    for (int op = 0; op < 24 && !in.empty(); ++op) {
        const size_t before = ikv_layout_count(layout);
        ikv_block_desc b = ikv_block_desc_default();
        const std::string name = in.text(70);
        b.name = in.below(8) == 0 ? nullptr : name.c_str();
        b.kind = ikv_block_kind(int(in.below(10)) - 1);
        b.policy = ikv_policy(int(in.below(7)) - 1);
        b.start = in.take<uint16_t>();
        b.end = b.start + in.below(3000) - 100;
        b.score = in.value();
        b.precision_hint = in.below(8) == 0 ? IKV_FMT_AUTO : ikv_format(in.below(7));
        b.turn = in.take<uint8_t>();
        const uint32_t pick = ids.empty() ? in.take<uint32_t>() : ids[in.below(uint32_t(ids.size()))];
        ikv_status st = IKV_OK;
        switch (in.below(5)) {
            case 0: {
                uint32_t id = 0;
                st = ikv_layout_add(layout, &b, &id);
                if (st == IKV_OK) ids.push_back(id);
                break;
            }
            case 1: st = ikv_layout_update(layout, pick, &b); break;
            case 2: st = ikv_layout_set_score(layout, pick, b.score); break;
            case 3: st = ikv_layout_remove(layout, pick); break;
            default: st = ikv_layout_validate(layout, in.take<uint16_t>()); break;
        }
        if (st != IKV_OK) {
            FUZZ_CHECK(ikv_layout_count(layout) == before);
            FUZZ_CHECK(ikv_last_error()[0] != '\0');
        }
    }
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = 1u << in.below(9);
    rc.token_budget = in.below(4) ? in.take<uint16_t>() : 0;
    rc.recent_window = in.take<uint16_t>() % 1024;
    rc.memory_pressure = in.below(2) ? in.value() : 0.0f;
    rc.attend_threshold = in.below(2) ? in.value() : 0.3f;
    rc.prefetch_depth = in.below(16);
    rc.unlabeled_score = in.below(2) ? in.value() : 0.0f;
    rc.over_budget = ikv_over_budget(in.below(3));
    if (in.below(4) == 0) rc.precision.attend_mid = ikv_format(in.below(7));
    ikv_router *router = nullptr;
    if (ikv_router_create(&rc, &router) == IKV_OK) {
        ikv_plan *plan = nullptr;
        const uint32_t seq_len = in.take<uint16_t>();
        if (ikv_router_route(router, layout, seq_len, &plan) == IKV_OK) {
            check_plan(plan, seq_len);
            ikv_plan_destroy(plan);
        } else {
            FUZZ_CHECK(ikv_last_error()[0] != '\0');
        }
        ikv_router_destroy(router);
    } else {
        FUZZ_CHECK(router == nullptr);
    }
    fuzz_ranges(in);
    ikv_layout_destroy(layout);
    return 0;
}
