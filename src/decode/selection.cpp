#include "decode/selection.hpp"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/target_clones.hpp"
#include "cpu/attn_kernel.hpp"
#include "cpu/dispatch.hpp"
#include "feedback/page_feedback.hpp"
#include "pool/host_codec.hpp"

namespace ikv {

// Writes the clipped entry at o and returns o + 1, or returns o (absent,
// evicted or empty). Fields are stored one by one into storage sized up
// front: push_back of an Entry temporary ran at ~11 ns per page (the
// temporary's scalar stores read back by one 16-byte load), most of the host
// time of a CUDA ikv_decode (bench/RESULTS.md section 1g); this runs at ~4.
static Entry *put_clipped(const SeqSnapshot &snap, uint32_t P, uint32_t page, uint32_t begin, uint32_t end,
                          bool mandatory, Entry *o) {
    if (page >= snap.pages.size() || snap.pages[page].base == nullptr) return o;  // absent or evicted
    const uint64_t lo = uint64_t(page) * P;
    const uint64_t hi = std::min<uint64_t>(lo + P, snap.length);
    const uint64_t b = std::max<uint64_t>(begin, lo), e = std::min<uint64_t>(end, hi);
    if (b >= e) return o;
    o->page = page;
    o->begin = uint32_t(b);
    o->end = uint32_t(e);
    o->mandatory = mandatory;
    return o + 1;
}

void collect_entries(const SeqSnapshot &snap, const ikv_plan *plan, uint32_t P, dvec<Entry> &out) {
    const ikv_plan_page *pages = nullptr;
    size_t n = 0;
    if (plan == nullptr)
        n = size_t((uint64_t(snap.length) + P - 1) / P);
    else if (ikv_plan_pages(plan, &pages, &n) != IKV_OK)
        return;  // checked by the API layer
    const size_t n0 = out.size();
    out.resize(n0 + n);  // at most one entry per page / plan entry; shrunk below
    Entry *o = out.data() + n0;
    if (plan == nullptr) {
        for (uint32_t p = 0; p < uint32_t(n); ++p) o = put_clipped(snap, P, p, p * P, (p + 1) * P, false, o);
    } else {
        for (size_t i = 0; i < n; ++i)
            o = put_clipped(snap, P, pages[i].page, pages[i].token_begin, pages[i].token_end,
                            (pages[i].flags & IKV_PAGE_MANDATORY) != 0, o);
    }
    out.resize(size_t(o - out.data()));
}

void split_signs(const float *q, uint64_t n, float *qpos, float *qneg) {
    for (uint64_t e = 0; e < n; ++e) {
        qpos[e] = std::max(q[e], 0.0f);
        qneg[e] = std::min(q[e], 0.0f);
    }
}

void quest_bounds(const Entry *entries, uint32_t n, const SeqSnapshot &snap, const PageShape &shape, uint32_t layer,
                  uint32_t head, const ScoreQuery &q, float *bounds, float *rows, float *scratch) {
    const uint32_t D = shape.head_dim, group = q.n_rows;
    const CpuKernels &K = cpu_kernels();
    constexpr uint32_t kBatch = kScoreBatch;  // records per kernel call
    const uint8_t *recs[kBatch];
    uint32_t idx[kBatch];
    float out[kBatch];
    uint32_t m = 0;
    float *row_out = scratch;  // per-row: a batch's [m][n_rows] sums
    auto flush = [&] {
        QuestTask t{recs, m, q.qpos, q.qneg, group, D, out};
        t.qmid = q.qmid;
        t.rows = q.per_row ? row_out : nullptr;
        K.quest_bounds(t);
        for (uint32_t k = 0; k < m; ++k) {
            if (q.per_row)
                std::copy_n(row_out + uint64_t(k) * group, group, rows + uint64_t(idx[k]) * group);
            else
                bounds[idx[k]] = out[k];
        }
        m = 0;
    };
    for (uint32_t i = 0; i < n; ++i) {
        bounds[i] = -INFINITY;
        if (entries[i].mandatory) continue;
        const PageRef &ref = snap.pages[entries[i].page];
        recs[m] = ref.base + summary_offset(shape, ref.format, layer, head);
        idx[m++] = i;
        if (m == kBatch) flush();
    }
    if (m) flush();
}

TopkRule topk_rule(const ikv_decode_args &a) {
    TopkRule r;
    r.budget = a.topk_token_budget;
    r.mass = a.topk_mode == IKV_TOPK_MASS;
    r.mass_share = a.topk_mass;
    r.min_tokens = a.topk_min_tokens;
    return r;
}

uint64_t mass_budget(const Entry *in, const float *bounds, const uint32_t *order, uint32_t n_order,
                     uint64_t mandatory_tokens, const TopkRule &rule) {
    // order is bound-descending with NaN last: the first bound is the largest.
    const double top = n_order ? double(bounds[order[0]]) : 0.0;
    auto weight = [&](uint32_t c) {
        const double b = double(bounds[c]);
        const double n = double(in[c].end - in[c].begin);
        if (top == -INFINITY) return 0.0;                   // no candidate has an estimate: none is taken for it
        if (!std::isfinite(top)) return b == top ? n : 0.0;  // an infinite top bound takes its equals only
        return b == b ? n * std::exp(b - top) : 0.0;           // NaN bounds weigh nothing
    };
    double total = 0.0;
    for (uint32_t k = 0; k < n_order; ++k) total += weight(order[k]);
    const double target = double(rule.mass_share) * total;
    double taken_w = 0.0;
    uint64_t tokens = mandatory_tokens;
    for (uint32_t k = 0; k < n_order && taken_w < target; ++k) {  // the same sums in the same order as total
        taken_w += weight(order[k]);
        tokens += in[order[k]].end - in[order[k]].begin;
    }
    tokens = std::max<uint64_t>(tokens, rule.min_tokens);
    if (rule.budget > 0) tokens = std::min<uint64_t>(tokens, rule.budget);
    return tokens;
}

void combine_rows(const Entry *entries, uint32_t n, const float *rows, uint32_t n_rows, const float *offset, bool shift,
                  float *bounds, float *base) {
    std::fill(base, base + n_rows, shift ? -INFINITY : 0.0f);  // what each row's sums are measured from
    if (shift)
        for (uint32_t i = 0; i < n; ++i)
            if (!entries[i].mandatory)
                for (uint32_t r = 0; r < n_rows; ++r)
                    base[r] = std::max(base[r], rows[uint64_t(i) * n_rows + r]);  // NaN never wins
    for (uint32_t i = 0; i < n; ++i) {
        float best = -INFINITY;
        if (!entries[i].mandatory)
            for (uint32_t r = 0; r < n_rows; ++r) {
                const float s = rows[uint64_t(i) * n_rows + r] - base[r] + offset[r];
                if (s > best) best = s;
            }
        bounds[i] = best;
    }
}

void apply_feedback_prior(const Entry *entries, uint32_t n, const PageAverages *avg, float weight, float *bounds) {
    if (avg == nullptr) return;
    float best = -INFINITY;
    for (uint32_t i = 0; i < n; ++i)
        if (!entries[i].mandatory) best = std::max(best, bounds[i]);  // NaN never wins
    for (uint32_t i = 0; i < n; ++i) {
        if (entries[i].mandatory) continue;
        const float m = entries[i].page < avg->n_fed ? avg->avg[entries[i].page] : 0.0f;
        const float rel = best > -INFINITY ? bounds[i] - best : bounds[i];
        bounds[i] = m > 0.0f ? std::max(rel, std::log(weight * m)) : rel;  // (a NaN rel stays NaN without feedback)
    }
}

uint64_t mandatory_tokens(const Entry *in, uint32_t n) {
    uint64_t taken = 0;
    for (uint32_t i = 0; i < n; ++i) taken += in[i].mandatory ? in[i].end - in[i].begin : 0;
    return taken;
}

void rank_topk(const Entry *in, uint32_t n, const float *bounds, const TopkRule &rule, uint64_t mandatory,
               dvec<uint32_t> &order) {
    order.clear();
    for (uint32_t i = 0; i < n; ++i)
        if (!in[i].mandatory) order.push_back(i);
    // Bound descending, ties by entry index, NaN last (the device select's
    // order): a strict total order, so std::sort gives the stable order
    // without std::stable_sort's temporary buffer (an allocation per head and
    // step).
    const auto before = [&](uint32_t a, uint32_t b) {
        const float x = bounds[a], y = bounds[b];
        const bool xn = x != x, yn = y != y;
        if (xn != yn) return yn;
        if (!xn && x != y) return x > y;
        return a < b;
    };
    uint32_t shortest = UINT32_MAX, longest = 0;
    for (uint32_t c : order) {
        shortest = std::min(shortest, in[c].end - in[c].begin);
        longest = std::max(longest, in[c].end - in[c].begin);
    }
    if (rule.mass || shortest == 0 || order.empty()) {  // the mass rule reads the whole order
        std::sort(order.begin(), order.end(), before);
    } else {
        // The walk takes candidates in order until one does not fit: at most
        // (budget - mandatory) / shortest of them. Only that prefix needs to
        // be found (nth_element; the order is total, so it is the prefix a
        // full sort gives), and ordered only when spans differ. A 25% budget
        // of 2048 pages: ~3x less work than sorting them all.
        const uint64_t room = rule.budget > mandatory ? rule.budget - mandatory : 0;
        const size_t k = size_t(std::min<uint64_t>(room / shortest + (shortest == longest ? 0 : 1), order.size()));
        std::nth_element(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), before);
        if (shortest != longest) std::sort(order.begin(), order.begin() + std::ptrdiff_t(k), before);
        order.resize(k);
    }
}

void take_topk(const Entry *in, uint32_t n, const dvec<uint32_t> &order, uint64_t mandatory, uint64_t budget,
               dvec<uint8_t> &keep, dvec<Entry> &out) {
    keep.resize(n);
    for (uint32_t i = 0; i < n; ++i) keep[i] = in[i].mandatory;
    uint64_t taken = mandatory;
    for (uint32_t c : order) {
        const uint32_t span = in[c].end - in[c].begin;
        if (taken + span > budget) break;
        taken += span;
        keep[c] = 1;
    }
    out.clear();
    for (uint32_t i = 0; i < n; ++i)
        if (keep[i]) out.push_back(in[i]);
}

uint64_t select_topk(const Entry *in, uint32_t n, const float *bounds, const TopkRule &rule, dvec<uint32_t> &order,
                     dvec<uint8_t> &keep, dvec<Entry> &out) {
    const uint64_t mandatory = mandatory_tokens(in, n);
    rank_topk(in, n, bounds, rule, mandatory, order);
    const uint64_t budget =
        rule.mass ? mass_budget(in, bounds, order.data(), uint32_t(order.size()), mandatory, rule) : rule.budget;
    take_topk(in, n, order, mandatory, budget, keep, out);
    return budget;
}

// q . k of one key row in float, in 8 interleaved lanes (lane j: channels
// j, j + 8, ... in order), the lanes then added in a fixed tree, where one
// running sum was a chain of D dependent adds. (A plain loop over 8 lanes
// was vectorized across d instead, with shuffles: a vector type says what is
// meant.)
static inline float key_dot(const float *q, const float *k, uint32_t D) {
    typedef float v8 __attribute__((vector_size(32)));  // two SSE registers in the baseline copy
    v8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 8 <= D; d += 8) {
        v8 a, b;
        std::memcpy(&a, q + d, sizeof a);
        std::memcpy(&b, k + d, sizeof b);
        acc += a * b;
    }
    float lane[8];
    std::memcpy(lane, &acc, sizeof lane);
    for (uint32_t j = 0; d < D; ++d, ++j) lane[j] += q[d] * k[d];  // D % 8 channels
    return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// One entry's keys (nt rows from t0 of a sub-page) dequantized to `keys`,
// then lse[r] = log sum_t exp(logit) of each of n_rows query rows (the
// logit softcapped when softcap > 0; NaN when a logit is NaN; a -inf logit
// adds nothing). The AVX2 copy (with GCC, dequantization and dots inlined)
// keeps every IEEE operation and its order, so both copies give the same
// bits (as long as the library is not built with FMA contraction enabled,
// e.g. -march=x86-64-v3: common/target_clones.hpp). With one running sum per
// dot, libc row copies (dequant_rows' F16 rows, now decode_f16) and no
// prefetch, the keys score's CPU step was
// 12.5-13.2x a hybrid top-k step at 32K; 4.3-4.8x now (bench/RESULTS.md 6t).
IKV_AVX2_CLONES static void entry_key_lse(ikv_format f, uint32_t P, uint32_t D, const uint8_t *sub, uint32_t t0,
                                          uint32_t nt, const float *q, uint32_t n_rows, float softcap, float *keys,
                                          float *lse) {
    dequant_rows(f, P, D, sub, 0, t0, nt, keys, D);
    for (uint32_t r = 0; r < n_rows; ++r) {
        const float *qr = q + uint64_t(r) * D;
        double m = -INFINITY, sum = 0.0;  // running max and sum of exp(logit - max)
        for (uint32_t t = 0; t < nt; ++t) {
            const float l = key_dot(qr, keys + uint64_t(t) * D, D);
            const double x = softcap > 0.0f ? double(softcap) * std::tanh(double(l) / softcap) : double(l);
            if (!(x == x)) {
                m = x;  // a NaN logit makes the entry's score NaN (ranked last)
                break;
            }
            if (x == -INFINITY) continue;  // adds nothing (and exp(-inf - -inf) would be NaN)
            if (x > m) sum = sum * std::exp(m - x) + 1.0, m = x;
            else sum += std::exp(x - m);
        }
        lse[r] = float(m + std::log(sum));  // -inf + log(0): -inf; NaN stays NaN
    }
}

// Entries ahead whose K rows the keys pass prefetches (~ memory latency over
// one entry's work).
constexpr uint32_t kKeyPrefetchEntries = 2;

void key_share_scores(const Entry *in, uint32_t n, const SeqSnapshot &snap, const PageShape &shape, uint32_t layer,
                      uint32_t head, const float *q, const float *w_log, uint32_t n_rows, float softcap, float *scores,
                      float *scratch) {
    const uint32_t D = shape.head_dim, P = shape.page_size;
    float *keys = scratch, *lse = scratch + uint64_t(P) * D;  // one entry's K rows; [n][n_rows] log sums
    // K rows of entry j (not mandatory), whole cache lines.
    auto prefetch_keys = [&](uint32_t j) {
        if (j >= n || in[j].mandatory) return;
        const PageRef &pg = snap.pages[in[j].page];
        const uint64_t rb = row_bytes(pg.format, D);
        const uint8_t *k = pg.base + subpage_offset(shape, pg.format, layer, head) + subpage_layout(pg.format, P, D).k +
                           uint64_t(in[j].begin - in[j].page * P) * rb;
        const uintptr_t lo = reinterpret_cast<uintptr_t>(k) & ~uintptr_t(63);
        const uintptr_t hi = reinterpret_cast<uintptr_t>(k) + uint64_t(in[j].end - in[j].begin) * rb;
        for (uintptr_t a = lo; a < hi; a += 64) __builtin_prefetch(reinterpret_cast<const void *>(a));
    };
    for (uint32_t j = 0; j < kKeyPrefetchEntries; ++j) prefetch_keys(j);
    for (uint32_t i = 0; i < n; ++i) {
        prefetch_keys(i + kKeyPrefetchEntries);  // each entry once, kKeyPrefetchEntries ahead
        if (in[i].mandatory) continue;
        const PageRef &ref = snap.pages[in[i].page];
        entry_key_lse(ref.format, P, D, ref.base + subpage_offset(shape, ref.format, layer, head),
                      in[i].begin - in[i].page * P, in[i].end - in[i].begin, q, n_rows, softcap, keys,
                      lse + uint64_t(i) * n_rows);
    }
    float *z_log = lse + uint64_t(n) * n_rows;  // [n_rows] Z_r
    for (uint32_t r = 0; r < n_rows; ++r) {
        double m = -INFINITY, sum = 0.0;
        for (uint32_t i = 0; i < n; ++i) {
            const double x = in[i].mandatory ? -INFINITY : double(lse[uint64_t(i) * n_rows + r]);
            if (!(x > -INFINITY)) continue;  // -inf adds nothing; NaN is the entry's own (below)
            if (x > m) sum = sum * std::exp(m - x) + 1.0, m = x;
            else sum += std::exp(x - m);
        }
        z_log[r] = float(m + std::log(sum));  // -inf when no candidate has a number
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (in[i].mandatory) {
            scores[i] = -INFINITY;
            continue;
        }
        double share = 0.0;
        for (uint32_t r = 0; r < n_rows; ++r) {
            if (w_log[r] == -INFINITY || !std::isfinite(z_log[r])) continue;  // no share, or a non-finite query's row
            const double x = double(lse[uint64_t(i) * n_rows + r]);
            share += x == -INFINITY ? 0.0 : std::exp(double(w_log[r]) + x - double(z_log[r]));  // NaN propagates
        }
        scores[i] = float(std::log(share));  // log(0) = -inf: no share at all
    }
}

uint64_t key_read_bytes(ikv_format f, uint32_t D, uint32_t tokens) {
    const uint64_t scales = f == IKV_FMT_FP8_E4M3 ? 4 : f == IKV_FMT_INT8 || f == IKV_FMT_INT4 ? 4ull * D : 0;
    return row_bytes(f, D) * tokens + scales;
}

}  // namespace ikv
