#include "decode/selection.hpp"

#include <algorithm>
#include <cmath>

#include "common/quant.hpp"

namespace ikv {

static void push_clipped(const SeqSnapshot &snap, uint32_t P, uint32_t page, uint32_t begin, uint32_t end,
                         bool mandatory, dvec<Entry> &out) {
    if (page >= snap.pages.size() || snap.pages[page].base == nullptr) return;  // absent or evicted
    const uint64_t lo = uint64_t(page) * P;
    const uint64_t hi = std::min<uint64_t>(lo + P, snap.length);
    const uint64_t b = std::max<uint64_t>(begin, lo), e = std::min<uint64_t>(end, hi);
    if (b < e) out.push_back(Entry{page, uint32_t(b), uint32_t(e), mandatory});
}

void collect_entries(const SeqSnapshot &snap, const ikv_plan *plan, uint32_t P, dvec<Entry> &out) {
    out.clear();
    if (plan == nullptr) {
        const uint32_t n_pages = uint32_t((uint64_t(snap.length) + P - 1) / P);
        for (uint32_t p = 0; p < n_pages; ++p) push_clipped(snap, P, p, p * P, (p + 1) * P, false, out);
        return;
    }
    const ikv_plan_page *pages = nullptr;
    size_t n = 0;
    if (ikv_plan_pages(plan, &pages, &n) != IKV_OK) return;  // checked by the API layer
    for (size_t i = 0; i < n; ++i)
        push_clipped(snap, P, pages[i].page, pages[i].token_begin, pages[i].token_end,
                     (pages[i].flags & IKV_PAGE_MANDATORY) != 0, out);
}

void select_topk(const dvec<Entry> &in, const SeqSnapshot &snap, const PageShape &shape, uint32_t layer,
                 uint32_t head, const float *q, uint32_t group, uint32_t budget, dvec<Entry> &out) {
    const uint32_t D = shape.head_dim;
    struct Ranked {
        float bound;
        uint32_t index;
    };
    dvec<Ranked> cand;
    cand.reserve(in.size());
    uint64_t taken = 0;
    for (uint32_t i = 0; i < in.size(); ++i) {
        const Entry &e = in[i];
        if (e.mandatory) {
            taken += e.end - e.begin;
            continue;
        }
        const PageRef &ref = snap.pages[e.page];
        const uint16_t *kmin =
            reinterpret_cast<const uint16_t *>(ref.base + summary_offset(shape, ref.format, layer, head));
        const uint16_t *kmax = kmin + D;
        float best = -INFINITY;
        for (uint32_t g = 0; g < group; ++g) {
            const float *qg = q + uint64_t(g) * D;
            float s = 0.0f;
            for (uint32_t d = 0; d < D; ++d)
                s += std::max(qg[d] * bf16_to_f32(kmin[d]), qg[d] * bf16_to_f32(kmax[d]));
            best = std::max(best, s);
        }
        cand.push_back(Ranked{best, i});
    }
    std::stable_sort(cand.begin(), cand.end(), [](const Ranked &a, const Ranked &b) { return a.bound > b.bound; });
    dvec<uint8_t> keep(in.size(), 0);
    for (uint32_t i = 0; i < in.size(); ++i) keep[i] = in[i].mandatory;
    for (const Ranked &c : cand) {
        const uint32_t span = in[c.index].end - in[c.index].begin;
        if (taken + span > budget) break;
        taken += span;
        keep[c.index] = 1;
    }
    out.clear();
    for (uint32_t i = 0; i < in.size(); ++i)
        if (keep[i]) out.push_back(in[i]);
}

}  // namespace ikv
