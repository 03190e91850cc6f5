#include "common/page_format.hpp"
#include "plan/plan.hpp"
#include "plan/plan_build.hpp"

namespace ikv {

// Every product and sum is checked: a shape of 32-bit fields can pass 64
// bits (4 * head_dim * n_q_heads * n_layers alone, and times seq_len), and
// such a cost is refused rather than wrapped.
namespace {
struct Checked {
    bool ok = true;
    uint64_t mul(uint64_t a, uint64_t b) {
        uint64_t r = 0;
        ok = ok && !__builtin_mul_overflow(a, b, &r);
        return r;
    }
    uint64_t add(uint64_t a, uint64_t b) {
        uint64_t r = 0;
        ok = ok && !__builtin_add_overflow(a, b, &r);
        return r;
    }
};
}  // namespace

bool plan_cost(const ikv_plan &plan, const ikv_model_shape &shape, ikv_plan_cost *out) {
    Checked k;
    ikv_plan_cost c{};
    const uint32_t P = plan.summary.page_size;
    const uint64_t subpages = k.mul(shape.n_layers, shape.n_kv_heads);
    // subpage_read_bytes is exact in 64 bits: page_size <= 128, head_dim < 2^32.
    // Counted per entry, as the decoders count what they read
    // (ikv_decoder_last_bytes_read): each run of tokens of a page brings its
    // rows and the page's scales, so two runs of one page read the scales twice.
    for (const auto &e : plan.pages) {
        const ikv_format f = static_cast<ikv_format>(e.format);
        const uint32_t tokens = e.token_end - e.token_begin;
        c.bytes_by_format[f] = k.add(c.bytes_by_format[f], k.mul(subpage_read_bytes(f, P, shape.head_dim, tokens), subpages));
    }
    for (uint64_t b : c.bytes_by_format) c.bytes_total = k.add(c.bytes_total, b);
    const uint32_t seq_len = plan.summary.seq_len;
    for (uint32_t p = 0; p < plan.summary.pages_total; ++p) {
        const uint32_t begin = p * P;
        const uint32_t tokens = seq_len - begin < P ? seq_len - begin : P;
        c.bytes_dense_f16 = k.add(c.bytes_dense_f16, k.mul(subpage_read_bytes(IKV_FMT_F16, P, shape.head_dim, tokens), subpages));
    }
    const uint64_t per_token = k.mul(k.mul(k.mul(4, shape.head_dim), shape.n_q_heads), shape.n_layers);
    c.flops = k.mul(per_token, plan.summary.tokens_selected);
    c.flops_dense = k.mul(per_token, seq_len);
    if (!k.ok) return false;
    *out = c;
    return true;
}

}  // namespace ikv
