#include <algorithm>
#include <new>

#include "common/error.hpp"
#include "common/raw_enum.hpp"
#include "plan/plan.hpp"
#include "plan/plan_build.hpp"

namespace ikv {

ikv_status plan_from_ranges(const ikv_token_range *ranges, std::size_t n, uint32_t seq_len, uint32_t page_size,
                            ikv_format format, ikv_plan **plan_out, const char *fn) {
    if (seq_len == 0) return fail(IKV_E_INVALID, "%s: seq_len is 0, expected at least 1", fn);
    if (page_size < 8 || page_size > 128 || (page_size & (page_size - 1)) != 0)
        return fail(IKV_E_INVALID, "%s: page_size is %u, expected a power of two in [8, 128]", fn, page_size);
    if (!enum_below(format, IKV_FMT_COUNT))
        return fail(IKV_E_INVALID, "%s: format is %d, expected a storage format 0..%d (not AUTO)", fn,
                    raw_enum(format), IKV_FMT_COUNT - 1);
    for (std::size_t i = 0; i < n; ++i) {
        if (ranges[i].end <= ranges[i].begin)
            return fail(IKV_E_INVALID, "%s: ranges[%zu] [%u, %u) is empty; expected end > begin", fn, i,
                        ranges[i].begin, ranges[i].end);
        if (ranges[i].end > seq_len)
            return fail(IKV_E_RANGE, "%s: ranges[%zu] [%u, %u) ends after seq_len %u", fn, i, ranges[i].begin,
                        ranges[i].end, seq_len);
    }
    host_vector<TokenRun> runs;
    runs.reserve(n);
    for (std::size_t i = 0; i < n; ++i) runs.push_back(TokenRun{ranges[i].begin, ranges[i].end, false});
    std::sort(runs.begin(), runs.end(), [](const TokenRun &a, const TokenRun &b) { return a.begin < b.begin; });
    for (std::size_t i = 1; i < runs.size(); ++i)
        if (runs[i].begin < runs[i - 1].end)
            return fail(IKV_E_OVERLAP, "%s: ranges [%u, %u) and [%u, %u) overlap", fn, runs[i - 1].begin,
                        runs[i - 1].end, runs[i].begin, runs[i].end);

    ikv_plan *plan = new_handle<ikv_plan>();
    if (plan == nullptr) throw std::bad_alloc();
    try {
        plan->summary.seq_len = seq_len;
        plan->summary.page_size = page_size;
        plan->page_formats.assign(pages_for(seq_len, page_size), static_cast<uint8_t>(format));
        plan_fill_pages(*plan, runs);
    } catch (...) {
        delete_handle(plan);
        throw;
    }
    *plan_out = plan;
    return IKV_OK;
}

}  // namespace ikv
