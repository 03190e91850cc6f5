#include "common/page_format.hpp"
#include "plan/plan.hpp"
#include "plan/plan_build.hpp"

namespace ikv {

ikv_plan_cost plan_cost(const ikv_plan &plan, const ikv_model_shape &shape) {
    ikv_plan_cost c{};
    const uint32_t P = plan.summary.page_size;
    const uint64_t subpages = uint64_t(shape.n_layers) * shape.n_kv_heads;
    // Entries of one page share its scales, so bytes are counted per page
    // from the page's total selected tokens.
    const auto &pages = plan.pages;
    for (std::size_t i = 0; i < pages.size();) {
        uint32_t tokens = 0;
        std::size_t j = i;
        for (; j < pages.size() && pages[j].page == pages[i].page; ++j) tokens += pages[j].token_end - pages[j].token_begin;
        const ikv_format f = static_cast<ikv_format>(pages[i].format);
        c.bytes_by_format[f] += subpage_read_bytes(f, P, shape.head_dim, tokens) * subpages;
        i = j;
    }
    for (uint64_t b : c.bytes_by_format) c.bytes_total += b;
    const uint32_t seq_len = plan.summary.seq_len;
    for (uint32_t p = 0; p < plan.summary.pages_total; ++p) {
        const uint32_t begin = p * P;
        const uint32_t tokens = seq_len - begin < P ? seq_len - begin : P;
        c.bytes_dense_f16 += subpage_read_bytes(IKV_FMT_F16, P, shape.head_dim, tokens) * subpages;
    }
    const uint64_t per_token = 4ull * shape.head_dim * shape.n_q_heads * shape.n_layers;
    c.flops = per_token * plan.summary.tokens_selected;
    c.flops_dense = per_token * seq_len;
    return c;
}

}  // namespace ikv
