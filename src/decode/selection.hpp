// Which tokens a decode step reads, per sequence and kv-head: the plan's
// entries (or every live page) clipped to the stored length with evicted
// pages dropped, optionally narrowed by query-aware top-k (Quest bound).
#pragma once

#include <cstdint>
#include <vector>

#include "common/host_memory.hpp"
#include "common/page_format.hpp"
#include "pool/pool_view.hpp"

namespace ikv {

template <class T>
using dvec = std::vector<T, host_allocator<T>>;  // decoder memory comes from mimalloc

// A run of tokens of one logical page, absolute positions [begin, end).
struct Entry {
    uint32_t page;
    uint32_t begin;
    uint32_t end;
    bool mandatory;
};

// The entries a sequence reads: plan entries (plan != nullptr) or one per
// live page, each clipped to [page*P, min((page+1)*P, length)); entries of
// evicted pages, or that end up empty, are dropped. Order is kept. They are
// appended to out (both backends gather every sequence's into one list).
void collect_entries(const SeqSnapshot &snap, const ikv_plan *plan, uint32_t P, dvec<Entry> &out);

// qpos[e] = max(q[e], 0), qneg[e] = min(q[e], 0) for e < n: the query in the
// form the Quest-bound kernel takes.
void split_signs(const float *q, uint64_t n, float *qpos, float *qneg);

// The scored query rows in the forms the scoring kernel takes (the group's
// heads at the first query token, scaled, then any query-memory rows):
// qpos/qneg from split_signs, n_rows rows of D floats each; for
// IKV_TOPK_SCORE_HYBRID the three are halved and qmid holds the halved query
// itself (nullptr: Quest). per_row: keep every row's sum (combine_rows makes
// the bounds) instead of their max.
struct ScoreQuery {
    const float *qpos, *qneg, *qmid;
    uint32_t n_rows;
    bool per_row;
};

// Entries the scoring kernel takes per call (quest_bounds' scratch holds that
// many entries' per-row sums).
constexpr uint32_t kScoreBatch = 64;

// Scores of n entries of one sequence for one kv-head, with the active ISA's
// kernel (cpu/attn_kernel.hpp quest_bounds), from each entry's page key
// summary (bf16, outward-rounded). bounds[i] = max_r of row r's sum
//   sum_d max(q_rd * kmin_d, q_rd * kmax_d) (+ q_rd * kmean_d / 2 terms: hybrid),
// or with q.per_row rows[i * n_rows + r] = that sum. Mandatory entries get
// -inf (they are never ranked). scratch: kScoreBatch * n_rows floats when
// q.per_row (the caller's, per worker thread). No allocation.
void quest_bounds(const Entry *entries, uint32_t n, const SeqSnapshot &snap, const PageShape &shape, uint32_t layer,
                  uint32_t head, const ScoreQuery &q, float *bounds, float *rows, float *scratch);

// The bounds of one (sequence, kv-head) from per-row sums: with shift (the
// hybrid score) each row's sums less that row's largest over the
// non-mandatory entries; plus offset[r] (a query-memory row's log(decay),
// -inf for a row that must not count); bounds[i] = max_r. Mandatory entries
// get -inf; NaN sums never win. base: n_rows floats of scratch. No allocation.
void combine_rows(const Entry *entries, uint32_t n, const float *rows, uint32_t n_rows, const float *offset, bool shift,
                  float *bounds, float *base);

// How a step's query-aware selection sizes its budget (ikv_decode_args'
// topk_* fields; the header's ikv_topk_mode says the rule in full).
struct TopkRule {
    uint32_t budget = 0;      // fixed: the budget; mass: the upper limit (0 = none)
    bool mass = false;        // IKV_TOPK_MASS
    float mass_share = 0.0f;  // mass: estimated share to cover, (0, 1]
    uint32_t min_tokens = 0;  // mass: the lower limit
};

// The rule of one ikv_decode call (top-k is off when neither mode applies).
TopkRule topk_rule(const ikv_decode_args &a);
inline bool topk_enabled(const ikv_decode_args &a) { return a.topk_token_budget > 0 || a.topk_mode == IKV_TOPK_MASS; }

// Query-aware selection for one kv-head from the entries' bounds: keeps every
// mandatory entry; ranks the others by bound, descending (ties: earlier
// entry first; NaN last), and takes them while the tokens taken (mandatory ones
// included) plus the entry's span stay within the budget, stopping at the
// first that does not fit. The budget is rule.budget, or with rule.mass the
// one the estimated mass share asks for (mass_budget). The result is in page
// order. order and keep are scratch, reused across calls.
// Returns the budget it selected under.
uint64_t select_topk(const Entry *in, uint32_t n, const float *bounds, const TopkRule &rule, dvec<uint32_t> &order,
                     dvec<uint8_t> &keep, dvec<Entry> &out);

// select_topk's steps, for a caller that walks one ranking under two budgets
// (IKV_TOPK_SCORE_KEYS' first pass under the mass rule): the mandatory
// entries' tokens; order = the non-mandatory entries ranked (all of them with
// rule.mass, else the prefix a walk under rule.budget can reach); the walk,
// keep and out as in select_topk. No allocation beyond order, keep and out.
uint64_t mandatory_tokens(const Entry *in, uint32_t n);
void rank_topk(const Entry *in, uint32_t n, const float *bounds, const TopkRule &rule, uint64_t mandatory,
               dvec<uint32_t> &order);
void take_topk(const Entry *in, uint32_t n, const dvec<uint32_t> &order, uint64_t mandatory, uint64_t budget,
               dvec<uint8_t> &keep, dvec<Entry> &out);

// IKV_TOPK_SCORE_KEYS' first pass takes candidates for this many times the
// budget's non-mandatory tokens (bench/RESULTS.md section 6w measured 2 and 4).
constexpr uint64_t kKeysCandidateFactor = 2;

// The first pass's budget for a selection whose budget is `budget`, of which
// `mandatory` tokens are mandatory entries'.
inline uint64_t keys_candidate_budget(uint64_t budget, uint64_t mandatory) {
    return budget > mandatory ? mandatory + kKeysCandidateFactor * (budget - mandatory) : budget;
}

// IKV_TOPK_SCORE_KEYS' second pass for one (sequence, kv-head): each
// non-mandatory entry i of the candidates in[0, n) scored from its keys
// (dequantized as the decode reads them): for each row r of q (n_rows rows
// of head_dim floats, scaled as for attention) lse_r(i) = log sum over the
// entry's tokens of exp(logit), the logit softcapped when softcap > 0; then
// scores[i] = log sum_r exp(w_log[r] + lse_r(i) - Z_r), Z_r = log sum over
// the non-mandatory candidates of exp(lse_r(j)): the entry's share of each
// row's attention over the candidates, summed with weights exp(w_log[r])
// (-inf: a row that does not count). Mandatory entries get -inf. Dot
// products in float, exp/log sums in double; a -inf logit adds nothing. scratch: key_scratch_floats(...) floats. No allocation.
void key_share_scores(const Entry *in, uint32_t n, const SeqSnapshot &snap, const PageShape &shape, uint32_t layer,
                      uint32_t head, const float *q, const float *w_log, uint32_t n_rows, float softcap, float *scores,
                      float *scratch);

inline uint64_t key_scratch_floats(uint32_t page_size, uint32_t head_dim, uint32_t n, uint32_t n_rows) {
    return uint64_t(page_size) * head_dim + uint64_t(n) * n_rows + n_rows;
}

// Bytes key_share_scores reads of an entry of `tokens` tokens of a page in
// format f: the K rows and K's scales.
uint64_t key_read_bytes(ikv_format f, uint32_t D, uint32_t tokens);

// IKV_TOPK_MASS's budget: mandatory tokens plus the tokens of the shortest
// prefix of `order` (candidates by bound, descending) whose weights
// n_i * exp(bound_i - max bound) reach mass_share of their sum, clamped to
// [min_tokens, budget or unlimited]. Sums in double, in `order`.
uint64_t mass_budget(const Entry *in, const float *bounds, const uint32_t *order, uint32_t n_order,
                     uint64_t mandatory_tokens, const TopkRule &rule);

struct PageAverages;  // feedback/page_feedback.hpp

// The attention-feedback prior (ikv_decode_args.topk_feedback_weight) on the
// bounds of one (sequence, kv-head): bounds[i] = max(bounds[i] - the best
// non-mandatory bound, log(weight * avg[page])) for candidates whose page has
// an average > 0; avg may be null (no feedback: bounds unchanged).
void apply_feedback_prior(const Entry *entries, uint32_t n, const PageAverages *avg, float weight, float *bounds);

// Adds [begin, end) to runs (ascending), merged into the last run when it
// starts where that one ends: ikv_decoder_last_selection's form.
inline void add_run(std::vector<ikv_token_range> &runs, uint32_t begin, uint32_t end) {
    if (!runs.empty() && runs.back().end == begin)
        runs.back().end = end;
    else
        runs.push_back({begin, end});
}

}  // namespace ikv
