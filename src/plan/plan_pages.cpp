#include "plan/plan.hpp"

namespace ikv {

void plan_fill_pages(ikv_plan &plan, const host_vector<TokenRun> &runs) {
    ikv_plan_summary &s = plan.summary;
    const uint32_t P = s.page_size;
    s.pages_total = pages_for(s.seq_len, P);
    s.tokens_selected = 0;
    s.mandatory_tokens = 0;
    for (uint32_t &n : s.tokens_by_format) n = 0;

    // Cut every run at page boundaries; a piece that continues the previous
    // entry in the same page extends it.
    for (const TokenRun &r : runs) {
        uint32_t b = r.begin;
        while (b < r.end) {
            const uint32_t page = b / P;
            const uint64_t page_end = uint64_t(page + 1) * P;
            const uint32_t e = page_end < r.end ? static_cast<uint32_t>(page_end) : r.end;
            const uint8_t flags = r.mandatory ? IKV_PAGE_MANDATORY : 0;
            if (!plan.pages.empty() && plan.pages.back().page == page && plan.pages.back().token_end == b) {
                plan.pages.back().token_end = e;
                plan.pages.back().flags |= flags;
            } else {
                plan.pages.push_back(ikv_plan_page{page, b, e, plan.page_formats[page], flags, 0});
            }
            const uint32_t n = e - b;
            s.tokens_selected += n;
            if (r.mandatory) s.mandatory_tokens += n;
            s.tokens_by_format[plan.page_formats[page]] += n;
            b = e;
        }
    }

    // Flags that need the final bounds, and the pages nothing was read from.
    uint32_t next_unseen = 0;  // pages below it were visited
    s.pages_selected = 0;
    for (ikv_plan_page &p : plan.pages) {
        if (p.token_begin != uint64_t(p.page) * P || p.token_end != uint64_t(p.page + 1) * P) p.flags |= IKV_PAGE_PARTIAL;
        if (p.page + 1 > next_unseen) {
            for (uint32_t q = next_unseen; q < p.page; ++q) plan.skipped.push_back(q);
            ++s.pages_selected;
            next_unseen = p.page + 1;
        }
    }
    for (uint32_t q = next_unseen; q < s.pages_total; ++q) plan.skipped.push_back(q);
    s.tokens_skipped = s.seq_len - s.tokens_selected;
}

}  // namespace ikv
