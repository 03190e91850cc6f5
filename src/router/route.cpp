// The routing rules, in the order they apply:
//   1. The layout's blocks and the unlabeled gaps between them (routed as
//      ATTEND with unlabeled_score) become segments in start order.
//   2. Mandatory tokens: all of ALWAYS and GLOBAL blocks, and the part of any
//      non-SKIP segment inside the recent window [seq_len - recent_window,
//      seq_len). SKIP always wins.
//   3. Budget: mandatory tokens over token_budget fail (IKV_E_BUDGET) or are
//      kept with the plan flagged (IKV_OVER_BUDGET_KEEP).
//   4. ATTEND segments at or above attend_threshold, by descending score (ties:
//      newer first), are taken whole while their tokens outside the window
//      fit the budget left; one that does not fit is passed over and the next
//      is tried (greedy continue).
// Each segment's selection is then a suffix [sel, end) of it, of which the
// suffix [mand, end) is mandatory, so the plan is built from at most two runs
// per segment.
#include <algorithm>
#include <cstring>
#include <new>

#include "common/error.hpp"
#include "layout/layout.hpp"
#include "plan/plan.hpp"
#include "router/precision.hpp"
#include "router/route.hpp"

namespace ikv {
namespace {

struct Segment {
    uint32_t id;  // kGapBlockId for an unlabeled gap
    uint32_t start, end;
    ikv_policy policy;
    float score;
    ikv_format hint;
    uint32_t sel;   // selected tokens: [sel, end)
    uint32_t mand;  // mandatory tokens: [mand, end), mand >= sel
    ikv_reason reason;
    ikv_format format;
};

Segment make_segment(uint32_t id, uint32_t start, uint32_t end, ikv_policy policy, float score, ikv_format hint) {
    return Segment{id, start, end, policy, score, hint, end, end, IKV_REASON_POLICY_SKIP, IKV_FMT_F16};
}

host_vector<Segment> segments_of(const ikv_layout &layout, uint32_t seq_len, float unlabeled_score) {
    host_vector<Segment> segs;
    segs.reserve(2 * layout.blocks.size() + 1);
    uint32_t cursor = 0;
    for (const ikv_block_info &b : layout.blocks) {
        if (b.start > cursor)
            segs.push_back(make_segment(kGapBlockId, cursor, b.start, IKV_POLICY_ATTEND, unlabeled_score, IKV_FMT_AUTO));
        segs.push_back(make_segment(b.id, b.start, b.end, b.policy, b.score, b.precision_hint));
        cursor = b.end;
    }
    if (cursor < seq_len)
        segs.push_back(make_segment(kGapBlockId, cursor, seq_len, IKV_POLICY_ATTEND, unlabeled_score, IKV_FMT_AUTO));
    return segs;
}

// Step 2: mandatory suffix and the reason it has before the budget is spent.
void place_mandatory(Segment &s, uint32_t window_begin) {
    const uint32_t in_window = std::max(s.start, window_begin);
    switch (s.policy) {
        case IKV_POLICY_SKIP: s.mand = s.end; s.reason = IKV_REASON_POLICY_SKIP; break;
        case IKV_POLICY_ALWAYS: s.mand = s.start; s.reason = IKV_REASON_ALWAYS; break;
        case IKV_POLICY_GLOBAL: s.mand = s.start; s.reason = IKV_REASON_GLOBAL; break;
        case IKV_POLICY_RECENT:
            s.mand = std::min(in_window, s.end);
            s.reason = s.mand < s.end ? IKV_REASON_RECENT_WINDOW : IKV_REASON_OUTSIDE_WINDOW;
            break;
        default:  // ATTEND and gaps; step 4 may select more
            s.mand = std::min(in_window, s.end);
            s.reason = s.mand < s.end ? IKV_REASON_RECENT_WINDOW : IKV_REASON_BELOW_THRESHOLD;
            break;
    }
    s.sel = s.mand;
}

// Step 4 over the ATTEND segments; `left` is the budget left after mandatory tokens.
void select_attend(host_vector<Segment> &segs, float threshold, uint64_t left) {
    host_vector<Segment *> cands;
    // A segment wholly inside the recent window is a candidate too (it costs
    // nothing): read on its score, it keeps the precision table's format.
    for (Segment &s : segs)
        if (s.policy == IKV_POLICY_ATTEND && s.score >= threshold) cands.push_back(&s);
    std::sort(cands.begin(), cands.end(), [](const Segment *a, const Segment *b) {
        return a->score != b->score ? a->score > b->score : a->start > b->start;
    });
    for (Segment *s : cands) {
        const uint64_t cost = s->mand - s->start;
        if (cost <= left) {
            left -= cost;
            s->sel = s->start;
            s->reason = IKV_REASON_SCORE;
        } else if (s->mand == s->end) {
            s->reason = IKV_REASON_BUDGET_EXHAUSTED;  // else it keeps RECENT_WINDOW for its window part
        }
    }
}

FormatRole role_of(const Segment &s) {
    switch (s.policy) {
        case IKV_POLICY_ALWAYS: return FormatRole::Always;
        case IKV_POLICY_GLOBAL: return FormatRole::Global;
        case IKV_POLICY_RECENT: return FormatRole::Recent;
        case IKV_POLICY_SKIP: return FormatRole::Skip;
        default:
            // An ATTEND segment read only through the recent window is stored as recent tokens.
            return s.reason != IKV_REASON_SCORE && s.sel < s.end ? FormatRole::Recent : FormatRole::Attend;
    }
}

// Page formats: the highest precision among the segments with a selected token
// in the page; for a page with none, the lowest among all its segments.
void assign_page_formats(ikv_plan &plan, const host_vector<Segment> &segs) {
    const uint32_t P = plan.summary.page_size;
    const uint32_t n = plan.summary.pages_total;
    constexpr uint8_t kNone = 0xFF;
    host_vector<uint8_t> best_selected(n, kNone);
    plan.page_formats.assign(n, static_cast<uint8_t>(IKV_FMT_F16));
    host_vector<uint8_t> lowest_any(n, static_cast<uint8_t>(IKV_FMT_F16));
    for (const Segment &s : segs) {
        const uint8_t f = static_cast<uint8_t>(s.format);
        for (uint32_t p = s.start / P; p <= (s.end - 1) / P; ++p) lowest_any[p] = std::max(lowest_any[p], f);
        if (s.sel < s.end)
            for (uint32_t p = s.sel / P; p <= (s.end - 1) / P; ++p) best_selected[p] = std::min(best_selected[p], f);
    }
    for (uint32_t p = 0; p < n; ++p) plan.page_formats[p] = best_selected[p] != kNone ? best_selected[p] : lowest_any[p];
}

// Prefetch: first the page the next token lands in (seq_len / page_size; it is
// pages_total when seq_len is page aligned), then the unread pages of ATTEND
// segments that were not read whole, best score first (ties: newer first),
// each segment's pages in ascending order; pages read now are never hinted.
void assign_prefetch(ikv_plan &plan, const host_vector<Segment> &segs, uint32_t depth) {
    if (depth == 0) return;
    const uint32_t P = plan.summary.page_size;
    host_vector<uint8_t> taken(uint64_t(plan.summary.pages_total) + 1, 0);
    for (const ikv_plan_page &p : plan.pages) taken[p.page] = 1;
    auto offer = [&](uint32_t page) {
        if (plan.prefetch.size() < depth && !taken[page]) {
            taken[page] = 1;
            plan.prefetch.push_back(page);
        }
    };
    offer(plan.summary.seq_len / P);
    host_vector<const Segment *> missed;
    for (const Segment &s : segs)
        if (s.policy == IKV_POLICY_ATTEND && s.sel > s.start) missed.push_back(&s);
    std::sort(missed.begin(), missed.end(), [](const Segment *a, const Segment *b) {
        return a->score != b->score ? a->score > b->score : a->start > b->start;
    });
    for (const Segment *s : missed) {
        for (uint32_t p = s->start / P; p <= (s->sel - 1) / P && plan.prefetch.size() < depth; ++p) offer(p);
        if (plan.prefetch.size() >= depth) break;
    }
}

void assign_decisions(ikv_plan &plan, const host_vector<Segment> &segs) {
    plan.decisions.reserve(segs.size());
    for (const Segment &s : segs) {
        ikv_block_decision d;
        std::memset(&d, 0, sizeof d);
        d.block_id = s.id;
        d.start = s.start;
        d.end = s.end;
        d.tokens_selected = s.end - s.sel;
        d.selected = s.sel < s.end ? 1 : 0;
        d.format = static_cast<uint8_t>(s.format);
        d.reason = static_cast<uint16_t>(s.reason);
        plan.decisions.push_back(d);
    }
}

}  // namespace

ikv_status route_layout(const ikv_router_config &c, const ikv_layout &layout, uint32_t seq_len, ikv_plan **plan_out,
                        const char *fn) {
    if (seq_len == 0) return fail(IKV_E_INVALID, "%s: seq_len is 0, expected at least 1", fn);
    if (!layout.blocks.empty() && layout.blocks.back().end > seq_len) {
        // Blocks are sorted and disjoint, so ends increase too: name the first one past seq_len.
        const std::size_t i = layout_lower_index(layout, seq_len);
        std::size_t first = i > 0 && layout.blocks[i - 1].end > seq_len ? i - 1 : i;
        const ikv_block_info &b = layout.blocks[first];
        return fail(IKV_E_RANGE, "%s: block '%s' (id %u) [%u, %u) ends after seq_len %u", fn, b.name, b.id, b.start,
                    b.end, seq_len);
    }

    host_vector<Segment> segs = segments_of(layout, seq_len, c.unlabeled_score);
    const uint32_t window_begin = seq_len > c.recent_window ? seq_len - c.recent_window : 0;
    uint64_t mandatory = 0;
    for (Segment &s : segs) {
        place_mandatory(s, window_begin);
        mandatory += s.end - s.mand;
    }

    const bool over = c.token_budget != 0 && mandatory > c.token_budget;
    if (over && c.over_budget == IKV_OVER_BUDGET_FAIL)
        return fail(IKV_E_BUDGET,
                    "%s: mandatory tokens (ALWAYS, GLOBAL and the recent window) number %llu, over token_budget %u",
                    fn, static_cast<unsigned long long>(mandatory), c.token_budget);
    const uint64_t left = c.token_budget == 0 ? UINT64_MAX : over ? 0 : c.token_budget - mandatory;
    select_attend(segs, c.attend_threshold, left);
    if (over)  // a block read on its score keeps IKV_REASON_SCORE and its table format (the header's rule)
        for (Segment &s : segs)
            if (s.mand < s.end && s.reason != IKV_REASON_SCORE) s.reason = IKV_REASON_OVER_BUDGET_KEPT;
    for (Segment &s : segs)
        s.format = block_format(c.precision, c.memory_pressure, role_of(s), s.score, s.hint);

    ikv_plan *plan = new_handle<ikv_plan>();
    if (plan == nullptr) throw std::bad_alloc();
    try {
        plan->summary.seq_len = seq_len;
        plan->summary.page_size = c.page_size;
        plan->summary.pages_total = pages_for(seq_len, c.page_size);
        plan->summary.token_budget = c.token_budget;
        plan->summary.over_budget = over ? 1 : 0;
        assign_page_formats(*plan, segs);
        host_vector<TokenRun> runs;
        runs.reserve(2 * segs.size());
        for (const Segment &s : segs) {
            if (s.sel < s.mand) runs.push_back(TokenRun{s.sel, s.mand, false});
            if (s.mand < s.end) runs.push_back(TokenRun{s.mand, s.end, true});
        }
        plan_fill_pages(*plan, runs);
        assign_prefetch(*plan, segs, c.prefetch_depth);
        assign_decisions(*plan, segs);
    } catch (...) {
        delete_handle(plan);
        throw;
    }
    if (over)
        log(IKV_LOG_WARN, "%s: mandatory tokens %llu exceed token_budget %u; kept (IKV_OVER_BUDGET_KEEP)", fn,
            static_cast<unsigned long long>(mandatory), c.token_budget);
    *plan_out = plan;
    return IKV_OK;
}

}  // namespace ikv
