// The CPU decode step: queries to fp32, selection to spans, spans to work
// items (sequence x kv-head x chunk, split-K), the ISA kernel per item, then
// an exact log-sum-exp merge of each (sequence, kv-head)'s chunks.
#include <algorithm>
#include <cmath>

#include "common/quant.hpp"
#include "cpu/dispatch.hpp"
#include "decode/decoder.hpp"
#include "feedback/page_feedback.hpp"
#include "pool/host_codec.hpp"
#include "query_memory/query_memory.hpp"

namespace ikv {
namespace {

void store_elem(void *base, ikv_dtype dt, uint64_t i, float x) {
    switch (dt) {
        case IKV_DTYPE_F16: static_cast<uint16_t *>(base)[i] = f32_to_f16(x); break;
        case IKV_DTYPE_BF16: static_cast<uint16_t *>(base)[i] = f32_to_bf16(x); break;
        default: static_cast<float *>(base)[i] = x; break;
    }
}

// Work items are cut at span boundaries once they hold this many tokens:
// enough items that every thread stays busy (4 per thread), never so small
// that merging costs more than it saves.
uint64_t chunk_tokens(uint64_t total_tokens, unsigned n_threads) {
    if (n_threads <= 1) return UINT64_MAX;
    const uint64_t per = (total_tokens + 4ull * n_threads - 1) / (4ull * n_threads);
    return std::max<uint64_t>(per, 512);
}

// Attention feedback (ikv_page_feedback): each read span's share of the
// softmax, sum over its tokens of exp(logit - lse) averaged over the R query
// rows (causal), from the keys read once more (dequant_rows) and the step's
// scaled queries; then per (sequence, kv-head) the shares of each page go to
// the feedback's averages. The lse each share is taken against is the row's
// own over the logits computed here, not the kernel's: the two sum in
// different orders, and where logits are huge (|logit| ~1e6 and more, whose
// fp32 rounding passes 0.1) shares against the kernel's lse summed far past 1.
// Against their own lse a row's shares sum to 1 (to double rounding). The
// kernel's lse still says which rows count: none that read nothing (-inf) or
// whose query is not finite (NaN).
void feed_back(ThreadPool &threads, DecodeScratch &S, const ikv_decode_args &a, const std::vector<SeqSnapshot> &snaps,
               const PageShape &shape, uint32_t R, uint32_t group) {
    const uint32_t D = shape.head_dim, P = shape.page_size, H = shape.n_kv_heads, nqt = a.n_query_tokens;
    const uint64_t RD = uint64_t(R) * D;
    auto measure = [&](std::size_t bh, unsigned w) {
        const float *q = S.q.data() + bh * RD, *lse = S.row_lse.data() + bh * R;
        const uint32_t qpos0 = snaps[bh / H].length - nqt;  // position of query token 0
        float *k = S.worker[w].data();                      // P rows of D (the kernels are done with it)
        const uint64_t lo = S.span_lo[bh], n = S.span_lo[bh + 1] - lo;
        // [span][row]: max logit and sum of exp(logit - max); then each row's own lse
        double *m = S.fb_worker[w].data(), *sum = m + n * R, *own = sum + n * R;
        for (uint64_t i = 0; i < n; ++i) {
            const SpanRef &sp = S.spans[lo + i];
            dequant_rows(ikv_format(sp.fmt), P, D, sp.sub, 0, sp.begin, sp.end - sp.begin, k, D);
            for (uint32_t r = 0; r < R; ++r) {
                double mr = -INFINITY, sr = 0.0;
                if (std::isfinite(lse[r]))
                    for (uint32_t t = sp.begin; t < sp.end && sp.pos0 + t <= qpos0 + r / group; ++t) {
                        const float *kt = k + uint64_t(t - sp.begin) * D;
                        float logit = 0.0f;
                        for (uint32_t d = 0; d < D; ++d) logit += q[uint64_t(r) * D + d] * kt[d];
                        if (a.softcap > 0.0f) logit = a.softcap * std::tanh(logit / a.softcap);
                        const double l = logit;
                        if (!(l > -INFINITY)) continue;  // exp(-inf - max) = 0
                        if (l > mr) sr = sr * std::exp(mr - l) + 1.0, mr = l;
                        else sr += std::exp(l - mr);
                    }
                m[i * R + r] = mr, sum[i * R + r] = sr;
            }
        }
        for (uint32_t r = 0; r < R; ++r) {  // each row's own lse over its spans
            double mx = -INFINITY, tot = 0.0;
            for (uint64_t i = 0; i < n; ++i) mx = std::max(mx, m[i * R + r]);
            for (uint64_t i = 0; i < n; ++i)
                if (sum[i * R + r] > 0.0) tot += sum[i * R + r] * std::exp(m[i * R + r] - mx);
            own[r] = mx + std::log(tot);  // not finite: the row read nothing here (or overflowed): adds nothing
        }
        for (uint64_t i = 0; i < n; ++i) {
            double share = 0.0;
            for (uint32_t r = 0; r < R; ++r)
                if (sum[i * R + r] > 0.0 && std::isfinite(own[r])) share += sum[i * R + r] * std::exp(m[i * R + r] - own[r]);
            S.span_share[lo + i] = float(share / R);
        }
    };
    threads.parallel_for(uint64_t(a.n_seqs) * H, measure);
    for (uint64_t bh = 0; bh < uint64_t(a.n_seqs) * H; ++bh) {  // a page's spans are consecutive: one share each
        S.fb_pages.clear();
        S.fb_share.clear();
        for (uint64_t i = S.span_lo[bh]; i < S.span_lo[bh + 1]; ++i) {
            const uint32_t page = S.spans[i].pos0 / P;
            if (!S.fb_pages.empty() && S.fb_pages.back() == page)
                S.fb_share.back() += S.span_share[i];
            else
                S.fb_pages.push_back(page), S.fb_share.push_back(S.span_share[i]);
        }
        a.feedback->add_step(a.seqs[bh / H], a.layer, uint32_t(bh % H), S.fb_pages.data(), S.fb_share.data(),
                             uint32_t(S.fb_pages.size()));
    }
}

// Whether list bh reads a token at or before position qpos (a row there reads at least one key).
bool reads_a_key(const DecodeScratch &S, uint64_t bh, uint32_t qpos) {
    for (uint64_t i = S.span_lo[bh]; i < S.span_lo[bh + 1]; ++i)
        if (S.spans[i].pos0 + S.spans[i].begin <= qpos) return true;
    return false;
}

}  // namespace

ikv_status cpu_decode(ThreadPool &threads, DecodeScratch &S, const ikv_pool *pool, const ikv_decode_args &a,
                      StepLists &lists, uint64_t *bytes_read) {
    const PageShape &shape = pool_shape(pool);
    const uint32_t D = shape.head_dim, P = shape.page_size, H = shape.n_kv_heads;
    const uint32_t B = a.n_seqs, nq = a.n_q_heads, nqt = a.n_query_tokens;
    const uint32_t group = nq / H, R = nqt * group, BH = B * H;
    const float scale = a.scale > 0.0f ? a.scale : 1.0f / std::sqrt(float(D));
    const uint64_t RD = uint64_t(R) * D;

    SubpageLayout layouts[IKV_FMT_COUNT];
    for (int f = 0; f < IKV_FMT_COUNT; ++f) layouts[f] = subpage_layout(ikv_format(f), P, D);

    // ---- queries: fp32, scaled, rows of each kv-head's group together; rows
    // holding a NaN or inf are marked (the kernels' maxima skip NaN logits,
    // which would read as a masked row: the merge writes NaN for them) ----
    S.q.resize(uint64_t(BH) * RD);
    S.q_bad.assign(uint64_t(BH) * R, 0);
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t t = 0; t < nqt; ++t)
            for (uint32_t hq = 0; hq < nq; ++hq) {
                const uint32_t h = hq / group, r = t * group + hq % group;
                float *dst = S.q.data() + (uint64_t(b) * H + h) * RD + uint64_t(r) * D;
                const uint64_t src = ((uint64_t(b) * nqt + t) * nq + hq) * D;
                for (uint32_t d = 0; d < D; ++d) dst[d] = load_dtype_elem(a.q, a.q_dtype, src + d) * scale;
                S.q_bad[(uint64_t(b) * H + h) * R + r] = row_has_nonfinite(a.q, a.q_dtype, int64_t(src), D);
            }

    // ---- the entries of every sequence (kept from the last call when still exact) ----
    if (!lists.reuse) {
        const ikv_status st = lists.take_snapshots();
        if (st != IKV_OK) return st;
        S.entries.clear();
        S.entry_lo.assign(1, 0);
        for (uint32_t b = 0; b < B; ++b) {
            collect_entries((*lists.snaps)[b], a.plans ? a.plans[b] : nullptr, P, S.entries);
            S.entry_lo.push_back(uint32_t(S.entries.size()));
        }
    }
    lists.keep = true;
    const std::vector<SeqSnapshot> &snaps = *lists.snaps;

    // ---- top-k: scores of every (sequence, kv-head), blocks of entries in parallel ----
    // (one thread scoring every page was most of a top-k step: bench_decode's top-k rows)
    const bool topk = topk_enabled(a);
    const TopkRule rule = topk_rule(a);
    const uint64_t n_all = S.entries.size();
    const bool keys = a.topk_score == IKV_TOPK_SCORE_KEYS;        // hybrid candidates, ranked again from their keys
    const bool hybrid = a.topk_score == IKV_TOPK_SCORE_HYBRID || keys;
    const ikv_query_memory *mem = topk ? a.query_memory : nullptr;
    // Scored query rows per (b, h): the group's heads at query token 0, then
    // with a query memory the memory's queries of the same heads.
    const uint32_t n_rows = group * (mem ? 2 : 1);
    const bool per_row = hybrid || mem;  // scores kept per row, combined in a second pass
    if (topk) {
        constexpr uint32_t kBoundBlock = 256;  // entries per task
        const uint64_t GD = uint64_t(group) * D, ND = uint64_t(n_rows) * D;
        // Per (b, h): q+ | q- (| q) of every row; the hybrid takes them halved, with the query itself.
        const uint32_t parts = hybrid ? 3 : 2;
        S.qsigns.resize(uint64_t(BH) * parts * ND);
        S.row_offset.resize(uint64_t(BH) * n_rows);
        for (uint32_t bh = 0; bh < BH; ++bh) {
            float *qs = S.qsigns.data() + bh * parts * ND, *off = S.row_offset.data() + uint64_t(bh) * n_rows;
            float *rows = qs + (parts - 1) * ND;  // the rows' queries, scaled, before the split (last part's room)
            std::copy_n(S.q.data() + uint64_t(bh) * RD, GD, rows);
            std::fill(off, off + group, 0.0f);
            if (mem) {
                // The memory's rows (what each head recalls, given its query now) count
                // log(decay) lower; a sequence it has nothing for at this layer gets rows
                // that never win.
                const bool m = mem->recall(a.seqs[bh / H], a.layer, (bh % H) * group, group, rows, rows + GD);
                for (uint64_t e = 0; e < GD; ++e) rows[GD + e] = m ? rows[GD + e] * scale : 0.0f;
                std::fill(off + group, off + n_rows, m ? std::log(mem->decay) : -INFINITY);
            }
            const float half = hybrid ? 0.5f : 1.0f;
            for (uint64_t e = 0; e < ND; ++e) rows[e] *= half;
            split_signs(rows, ND, qs, qs + ND);  // for Quest, rows is q-'s own room: overwritten last
        }
        S.bounds.resize(n_all * H);
        if (per_row) S.rows.resize(n_all * H * n_rows);
        S.bound_tasks.clear();
        for (uint32_t b = 0; b < B; ++b)
            for (uint32_t h = 0; h < H; ++h)
                for (uint32_t e0 = S.entry_lo[b]; e0 < S.entry_lo[b + 1]; e0 += kBoundBlock)
                    S.bound_tasks.push_back({b, h, e0, std::min(e0 + kBoundBlock, S.entry_lo[b + 1])});
        // Per-worker scratch of the per-row path, sized here: no allocation inside the tasks.
        const uint64_t row_scratch = per_row ? uint64_t(kScoreBatch + 1) * n_rows : 0;
        S.worker_rows.resize(uint64_t(threads.size()) * row_scratch);
        auto score = [&](std::size_t i, unsigned w) {
            const DecodeScratch::BoundTask &t = S.bound_tasks[i];
            const float *qs = S.qsigns.data() + (uint64_t(t.b) * H + t.h) * parts * ND;
            const ScoreQuery sq{qs, qs + ND, hybrid ? qs + 2 * ND : nullptr, n_rows, per_row};
            quest_bounds(S.entries.data() + t.e0, t.e1 - t.e0, snaps[t.b], shape, a.layer, t.h, sq,
                         S.bounds.data() + t.h * n_all + t.e0,
                         per_row ? S.rows.data() + (t.h * n_all + t.e0) * n_rows : nullptr,
                         S.worker_rows.data() + w * row_scratch);
        };
        threads.parallel_for(S.bound_tasks.size(), score);
        if (per_row) {  // a hybrid row's shift needs all of its sequence's entries: a second pass
            auto combine = [&](std::size_t bh, unsigned w) {
                const uint32_t b = uint32_t(bh) / H, h = uint32_t(bh) % H, lo = S.entry_lo[b];
                combine_rows(S.entries.data() + lo, S.entry_lo[b + 1] - lo, S.rows.data() + (h * n_all + lo) * n_rows,
                             n_rows, S.row_offset.data() + uint64_t(bh) * n_rows, hybrid,
                             S.bounds.data() + h * n_all + lo, S.worker_rows.data() + w * row_scratch);
            };
            threads.parallel_for(BH, combine);
        }
        if (a.feedback && a.topk_feedback_weight > 0.0f) {  // the averages as a prior (before this step's)
            auto prior = [&](std::size_t bh, unsigned) {
                const uint32_t b = uint32_t(bh) / H, h = uint32_t(bh) % H, lo = S.entry_lo[b];
                apply_feedback_prior(S.entries.data() + lo, S.entry_lo[b + 1] - lo,
                                     a.feedback->averages(a.seqs[b], a.layer, h), a.topk_feedback_weight,
                                     S.bounds.data() + h * n_all + lo);
            };
            threads.parallel_for(BH, prior);
        }
        if (keys) {  // both passes of every (b, h), in parallel: the second reads the candidates' keys
            // Everything the tasks write is sized here (a worker thread must not
            // allocate: an exception there would end the process, not the call).
            if (S.keys_worker.size() < threads.size()) S.keys_worker.resize(threads.size());
            uint32_t max_n = 0;
            for (uint32_t b = 0; b < B; ++b) max_n = std::max(max_n, S.entry_lo[b + 1] - S.entry_lo[b]);
            for (DecodeScratch::KeysWorker &K : S.keys_worker) {
                K.order.reserve(max_n);
                K.keep.reserve(max_n);
                K.candidates.reserve(max_n);
                K.q.resize(ND);
                K.scores.resize(max_n);
                K.scratch.resize(key_scratch_floats(P, D, max_n, n_rows));
            }
            S.keys_picked.resize(BH);
            for (uint32_t bh = 0; bh < BH; ++bh) S.keys_picked[bh].reserve(S.entry_lo[bh / H + 1] - S.entry_lo[bh / H]);
            S.keys_bytes.assign(BH, 0);
            const float softcap = a.softcap;
            auto rerank = [&](std::size_t bh, unsigned w) {
                const uint32_t b = uint32_t(bh) / H, h = uint32_t(bh) % H, lo = S.entry_lo[b], n = S.entry_lo[b + 1] - lo;
                DecodeScratch::KeysWorker &K = S.keys_worker[w];
                const Entry *in = S.entries.data() + lo;
                const float *bounds = S.bounds.data() + h * n_all + lo;
                // The rule's budget on the hybrid scores (a mass rule's from the whole
                // ranking), then the candidates for twice it from the same ranking.
                const uint64_t mandatory = mandatory_tokens(in, n);
                auto candidate_budget = [&](uint64_t b) {
                    return uint32_t(std::min<uint64_t>(keys_candidate_budget(b, mandatory), UINT32_MAX));
                };
                TopkRule first = rule;
                if (!rule.mass) first.budget = candidate_budget(rule.budget);
                rank_topk(in, n, bounds, first, mandatory, K.order);
                const uint64_t budget =
                    rule.mass ? mass_budget(in, bounds, K.order.data(), uint32_t(K.order.size()), mandatory, rule)
                              : rule.budget;
                take_topk(in, n, K.order, mandatory, candidate_budget(budget), K.keep, K.candidates);
                const uint32_t nc = uint32_t(K.candidates.size());
                const float *halved = S.qsigns.data() + uint64_t(bh) * parts * ND + 2 * ND;  // hybrid's q / 2
                for (uint64_t e = 0; e < ND; ++e) K.q[e] = 2.0f * halved[e];  // (sized above, as scores and scratch)
                const Entry *c = K.candidates.data();
                key_share_scores(c, nc, snaps[b], shape, a.layer, h, K.q.data(), S.row_offset.data() + bh * n_rows,
                                 n_rows, softcap, K.scores.data(), K.scratch.data());
                for (uint32_t i = 0; i < nc; ++i)
                    S.keys_bytes[bh] += c[i].mandatory ? 0 : key_read_bytes(snaps[b].pages[c[i].page].format, D, c[i].end - c[i].begin);
                TopkRule fixed;  // the budget among the candidates, by their keys' shares
                fixed.budget = uint32_t(std::min<uint64_t>(budget, UINT32_MAX));
                select_topk(c, nc, K.scores.data(), fixed, K.order, K.keep, S.keys_picked[bh]);
            };
            threads.parallel_for(BH, rerank);
        }
    }

    // ---- selection -> spans per (b, h) ----
    S.spans.clear();
    S.span_lo.assign(1, 0);
    uint64_t bytes = 0, total_tokens = 0;
    for (uint32_t b = 0; b < B; ++b) {
        const SeqSnapshot &snap = snaps[b];
        const uint32_t lo = S.entry_lo[b], n = S.entry_lo[b + 1] - lo;
        uint64_t scored = 0;  // the bounds top-k reads: k_min/k_max of every non-mandatory entry
        for (uint32_t i = lo; i < lo + n; ++i) scored += S.entries[i].mandatory ? 0 : 1;
        for (uint32_t h = 0; h < H; ++h) {
            const Entry *use = S.entries.data() + lo;
            uint32_t count = n;
            if (topk) {
                const dvec<Entry> &picked = keys ? S.keys_picked[b * H + h] : S.picked;
                if (keys)
                    bytes += S.keys_bytes[b * H + h];
                else
                    select_topk(use, n, S.bounds.data() + h * n_all + lo, rule, S.order, S.keep, S.picked);
                use = picked.data();
                count = uint32_t(picked.size());
                bytes += scored * (hybrid ? summary_hybrid_bytes(D) : summary_bound_bytes(D));
            }
            for (const Entry *e = use; e < use + count; ++e) {
                const PageRef &ref = snap.pages[e->page];
                const uint32_t pos0 = e->page * P;
                S.spans.push_back(SpanRef{ref.base + (uint64_t(a.layer) * H + h) * layouts[ref.format].bytes,
                                          uint32_t(ref.format), e->begin - pos0, e->end - pos0, pos0});
                bytes += subpage_read_bytes(ref.format, P, D, e->end - e->begin);
                total_tokens += e->end - e->begin;
            }
            S.span_lo.push_back(S.spans.size());
        }
    }

    // ---- work items: split each (b, h) at span boundaries ----
    // Each item keeps R*(D+2) floats of partial state, so with many query rows
    // (chunked prefill: R = T*group up to 2048*group) the cut grows until the
    // partials of the extra items fit kMaxPartialBytes; one item per (b, h),
    // the size of the output itself, is always allowed.
    constexpr uint64_t kMaxPartialBytes = 256ull << 20;
    const uint64_t item_bytes = (RD + 2ull * R) * sizeof(float);
    const uint64_t extra_items = std::max<uint64_t>(1, kMaxPartialBytes / item_bytes);
    // Without top-k every kv-head of a sequence reads the same entries, so the
    // kv-heads of a sequence and chunk run as one unit that reads each page's
    // sub-pages side by side (attend_chunks); the chunks are then cut per
    // head so that there are still ~4 units per thread.
    const bool by_page = !topk && H > 1;
    const uint64_t cut_tokens = by_page ? std::max<uint64_t>(chunk_tokens(total_tokens, threads.size()) / H, 64)
                                        : chunk_tokens(total_tokens, threads.size());
    const uint64_t cut = std::max(cut_tokens, (total_tokens + extra_items - 1) / extra_items);
    S.items.clear();
    S.item_lo.assign(1, 0);
    for (uint32_t bh = 0; bh < BH; ++bh) {
        uint64_t lo = S.span_lo[bh], tokens = 0;
        for (uint64_t i = lo; i < S.span_lo[bh + 1]; ++i) {
            tokens += S.spans[i].end - S.spans[i].begin;
            if (tokens >= cut) {
                S.items.push_back({bh, uint32_t(lo), uint32_t(i + 1)});
                lo = i + 1;
                tokens = 0;
            }
        }
        if (lo < S.span_lo[bh + 1] || S.items.size() == S.item_lo.back())  // tail, or an empty selection
            S.items.push_back({bh, uint32_t(lo), uint32_t(S.span_lo[bh + 1])});
        S.item_lo.push_back(uint32_t(S.items.size()));
    }
    const uint64_t stride = RD + 2ull * R;
    S.partial.resize(S.items.size() * stride);
    const uint64_t worker_floats = uint64_t(R) * logit_stride(P) + 2ull * P * D + RD;
    if (S.worker.size() < threads.size()) S.worker.resize(threads.size());
    for (auto &w : S.worker)
        if (w.size() < worker_floats) w.resize(worker_floats);

    // ---- attention feedback: everything it writes after the kernels is sized now, so a
    // failure (out of memory) happens before any output is written ----
    if (a.feedback) {
        uint64_t most = 0;
        for (uint32_t bh = 0; bh < BH; ++bh) {
            uint32_t pages = 0;
            for (uint64_t i = S.span_lo[bh]; i < S.span_lo[bh + 1]; ++i) pages = std::max(pages, S.spans[i].pos0 / P + 1);
            a.feedback->reserve(a.seqs[bh / H], a.layer, bh % H, pages);
            most = std::max<uint64_t>(most, S.span_lo[bh + 1] - S.span_lo[bh]);
        }
        S.row_lse.resize(uint64_t(BH) * R);
        S.span_share.resize(S.spans.size());
        if (S.fb_worker.size() < threads.size()) S.fb_worker.resize(threads.size());
        for (auto &w : S.fb_worker)
            if (w.size() < (2 * most + 1) * R) w.resize((2 * most + 1) * R);
        S.fb_pages.reserve(most);
        S.fb_share.reserve(most);
    }

    // ---- kernels ----
    const CpuKernels &K = cpu_kernels();
    auto make_task = [&](std::size_t i, unsigned w) {
        const DecodeScratch::Item &it = S.items[i];
        const uint32_t b = it.bh / H;
        float *part = S.partial.data() + i * stride;
        float *ws = S.worker[w].data();
        ChunkTask T;
        T.spans = S.spans.data() + it.span_begin;
        T.n_spans = it.span_end - it.span_begin;
        T.q = S.q.data() + uint64_t(it.bh) * RD;
        T.R = R;
        T.group = group;
        T.D = D;
        T.P = P;
        T.q_pos0 = snaps[b].length - nqt;
        T.softcap = a.softcap;
        T.layouts = layouts;
        T.logits = ws;
        T.kspan = ws + uint64_t(R) * logit_stride(P);
        T.vspan = T.kspan + uint64_t(P) * D;
        T.qfold = T.vspan + uint64_t(P) * D;
        T.m = part;
        T.l = part + R;
        T.acc = part + 2 * R;
        return T;
    };
    // Units of the by-page order: (sequence, chunk), when every kv-head of
    // each sequence was cut alike (it is, their spans being the same).
    S.units.clear();
    bool aligned = by_page;
    for (uint32_t b = 0; b < B && aligned; ++b) {
        const uint32_t n_chunks = S.item_lo[b * H + 1] - S.item_lo[b * H];
        for (uint32_t h = 1; h < H && aligned; ++h) {
            aligned = S.item_lo[b * H + h + 1] - S.item_lo[b * H + h] == n_chunks;
            for (uint32_t c = 0; c < n_chunks && aligned; ++c) {  // attend_chunks walks equal span counts
                const DecodeScratch::Item &x = S.items[S.item_lo[b * H] + c], &y = S.items[S.item_lo[b * H + h] + c];
                aligned = x.span_end - x.span_begin == y.span_end - y.span_begin;
            }
        }
        for (uint32_t c = 0; c < n_chunks && aligned; ++c) S.units.push_back({b, c});
    }
    if (aligned) {
        auto run_unit = [&](std::size_t u, unsigned w) {
            constexpr uint32_t kHeadsPerCall = 16;
            ChunkTask tasks[kHeadsPerCall];
            const DecodeScratch::Unit &un = S.units[u];
            for (uint32_t h0 = 0; h0 < H; h0 += kHeadsPerCall) {
                const uint32_t n = std::min(kHeadsPerCall, H - h0);
                for (uint32_t j = 0; j < n; ++j) tasks[j] = make_task(S.item_lo[un.b * H + h0 + j] + un.chunk, w);
                K.attend_chunks(tasks, n);
            }
        };
        threads.parallel_for(S.units.size(), run_unit);
    } else {
        auto run_item = [&](std::size_t i, unsigned w) { K.attend_chunk(make_task(i, w)); };
        threads.parallel_for(S.items.size(), run_item);
    }

    // ---- exact merge of the chunks of each (b, h), then the output dtype ----
    auto merge = [&](std::size_t bh, unsigned) {
        const uint32_t b = uint32_t(bh) / H, h = uint32_t(bh) % H;
        const uint32_t i0 = S.item_lo[bh], i1 = S.item_lo[bh + 1];
        for (uint32_t r = 0; r < R; ++r) {
            float M = -INFINITY;
            for (uint32_t i = i0; i < i1; ++i) M = std::max(M, S.partial[i * stride + r]);
            const uint32_t t = r / group, hq = h * group + r % group;
            const uint64_t row = (uint64_t(b) * nqt + t) * nq + hq;
            // A NaN or inf in the row's query, or no finite logit (M = -inf: every
            // logit overflowed fp32 or was NaN, which the maxima skip) in a row
            // that reads a key: its outputs are NaN (documented), not the empty
            // result, and attention feedback leaves the row out (feed_back skips
            // a NaN lse).
            if ((S.q_bad[uint64_t(bh) * R + r] || M == -INFINITY) && reads_a_key(S, bh, snaps[b].length - nqt + t)) {
                for (uint32_t d = 0; d < D; ++d) store_elem(a.out, a.out_dtype, row * D + d, NAN);
                if (a.lse) a.lse[row] = NAN;
                if (a.feedback) S.row_lse[uint64_t(bh) * R + r] = NAN;
                continue;
            }
            if (M == -INFINITY) {  // empty selection: out 0, lse -inf (documented)
                for (uint32_t d = 0; d < D; ++d) store_elem(a.out, a.out_dtype, row * D + d, 0.0f);
                if (a.lse) a.lse[row] = -INFINITY;
                if (a.feedback) S.row_lse[uint64_t(bh) * R + r] = -INFINITY;
                continue;
            }
            float o[256];  // head_dim <= 256
            std::fill(o, o + D, 0.0f);
            float L = 0.0f;
            for (uint32_t i = i0; i < i1; ++i) {
                const float *part = S.partial.data() + i * stride;
                if (part[r] == -INFINITY) continue;  // a chunk wholly in this row's future
                const float w = std::exp(part[r] - M);
                L += part[R + r] * w;
                const float *acc = part + 2 * R + uint64_t(r) * D;
                for (uint32_t d = 0; d < D; ++d) o[d] += acc[d] * w;
            }
            const float inv = 1.0f / L;
            for (uint32_t d = 0; d < D; ++d) store_elem(a.out, a.out_dtype, row * D + d, o[d] * inv);
            if (a.lse) a.lse[row] = M + std::log(L);
            if (a.feedback) S.row_lse[uint64_t(bh) * R + r] = M + std::log(L);
        }
    };
    threads.parallel_for(BH, merge);
    if (a.feedback) feed_back(threads, S, a, snaps, shape, R, group);
    *bytes_read = bytes;
    return IKV_OK;
}

void cpu_last_selection(const DecodeScratch &S, uint32_t bh, std::vector<ikv_token_range> &runs) {
    runs.clear();
    for (uint64_t i = S.span_lo[bh]; i < S.span_lo[bh + 1]; ++i)
        add_run(runs, S.spans[i].pos0 + S.spans[i].begin, S.spans[i].pos0 + S.spans[i].end);
}

}  // namespace ikv
