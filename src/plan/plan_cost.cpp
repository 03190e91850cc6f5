#include "common/page_format.hpp"
#include "plan/plan.hpp"
#include "plan/plan_build.hpp"

namespace ikv {

// Sums are taken in 128 bits: a shape of 32-bit fields can pass 64 bits
// (4 * head_dim * n_q_heads * n_layers alone), and such a cost is refused
// rather than wrapped. A subpage's bytes fit 64 bits (page_size <= 128).
using wide = unsigned __int128;

bool plan_cost(const ikv_plan &plan, const ikv_model_shape &shape, ikv_plan_cost *out) {
    wide by_format[IKV_FMT_COUNT] = {}, dense = 0;
    const uint32_t P = plan.summary.page_size;
    const wide subpages = wide(shape.n_layers) * shape.n_kv_heads;
    // Entries of one page share its scales, so bytes are counted per page
    // from the page's total selected tokens.
    const auto &pages = plan.pages;
    for (std::size_t i = 0; i < pages.size();) {
        uint32_t tokens = 0;
        std::size_t j = i;
        for (; j < pages.size() && pages[j].page == pages[i].page; ++j) tokens += pages[j].token_end - pages[j].token_begin;
        const ikv_format f = static_cast<ikv_format>(pages[i].format);
        by_format[f] += wide(subpage_read_bytes(f, P, shape.head_dim, tokens)) * subpages;
        i = j;
    }
    const uint32_t seq_len = plan.summary.seq_len;
    for (uint32_t p = 0; p < plan.summary.pages_total; ++p) {
        const uint32_t begin = p * P;
        const uint32_t tokens = seq_len - begin < P ? seq_len - begin : P;
        dense += wide(subpage_read_bytes(IKV_FMT_F16, P, shape.head_dim, tokens)) * subpages;
    }
    const wide per_token = wide(4) * shape.head_dim * shape.n_q_heads * shape.n_layers;
    const wide flops = per_token * plan.summary.tokens_selected, flops_dense = per_token * seq_len;
    wide total = 0;
    for (wide b : by_format) total += b;
    const wide max = UINT64_MAX;
    if (total > max || dense > max || flops_dense > max) return false;  // each sum is at most these
    ikv_plan_cost c{};
    for (int f = 0; f < IKV_FMT_COUNT; ++f) c.bytes_by_format[f] = uint64_t(by_format[f]);
    c.bytes_total = uint64_t(total);
    c.bytes_dense_f16 = uint64_t(dense);
    c.flops = uint64_t(flops);
    c.flops_dense = uint64_t(flops_dense);
    *out = c;
    return true;
}

}  // namespace ikv
