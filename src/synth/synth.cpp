// The shape of a session (in context order):
//   system prompt (ALWAYS, ~2%) | memory summary (GLOBAL, ~3%) |
//   documents (~45% together; seeded scores spread over [0, 1], every fourth
//   one SKIP) | older turns (ATTEND, ~25% with the newest turn; scores rising
//   with recency), each followed by its share of the tool outputs (~15%;
//   ATTEND, scores below 0.3) | scratchpad (SKIP, ~5%) | newest turn (RECENT).
// Sizes get a seeded jitter of x0.6..x1.4, and every block has >= 1 token; the
// rounding remainder goes to the newest turn so the blocks tile [0, seq_len).
#include "synth/synth.hpp"

#include <cmath>
#include <cstdio>

#include "common/host_memory.hpp"
#include "layout/layout.hpp"

namespace ikv {
namespace {

struct SplitMix64 {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

struct Planned {
    char name[IKV_NAME_MAX + 1];
    ikv_block_kind kind;
    ikv_policy policy;
    float score;
    uint32_t turn;
    double weight;
};

Planned planned(ikv_block_kind kind, ikv_policy policy, double score, uint32_t turn, double weight,
                const char *fmt, unsigned index) {
    Planned p{};
    std::snprintf(p.name, sizeof p.name, fmt, index);
    p.kind = kind;
    p.policy = policy;
    p.score = static_cast<float>(score < 0 ? 0 : score > 1 ? 1 : score);
    p.turn = turn;
    p.weight = weight;
    return p;
}

}  // namespace

void synth_fill(const ikv_synth_config &c, ikv_layout &layout) {
    SplitMix64 rng{c.seed};
    auto jitter = [&] { return 0.6 + 0.8 * rng.uniform(); };
    const uint32_t older_turns = c.n_turns - 1;
    host_vector<Planned> blocks;
    blocks.reserve(synth_block_count(c));

    blocks.push_back(planned(IKV_KIND_SYSTEM_PROMPT, IKV_POLICY_ALWAYS, 1.0, 0, 0.02, "system", 0));
    blocks.push_back(planned(IKV_KIND_MEMORY_SUMMARY, IKV_POLICY_GLOBAL, 0.9, 0, 0.03, "memory", 0));

    // Document scores are stratified (one per slice of [0, 1]) and shuffled,
    // so any seed spreads them over the whole range.
    host_vector<double> doc_scores(c.n_documents);
    for (uint32_t i = 0; i < c.n_documents; ++i) doc_scores[i] = (i + rng.uniform()) / c.n_documents;
    for (uint32_t i = c.n_documents; i > 1; --i) std::swap(doc_scores[i - 1], doc_scores[rng.next() % i]);
    for (uint32_t i = 0; i < c.n_documents; ++i) {
        const ikv_policy policy = i % 4 == 3 ? IKV_POLICY_SKIP : IKV_POLICY_ATTEND;  // scores are shuffled
        blocks.push_back(planned(IKV_KIND_RETRIEVED_DOC, policy, doc_scores[i], 0,
                                 0.45 / c.n_documents * jitter(), "doc%u", i));
    }

    // Tool outputs follow the older turns round-robin (or the documents when
    // there is no older turn).
    auto add_tools_after = [&](uint32_t turn, uint32_t slot, uint32_t slots) {
        for (uint32_t j = slot; j < c.n_tool_outputs; j += slots)
            blocks.push_back(planned(IKV_KIND_TOOL_OUTPUT, IKV_POLICY_ATTEND, 0.3 * rng.uniform(), turn,
                                     0.15 / c.n_tool_outputs * jitter(), "tool%u", j));
    };
    const double turn_weight = 0.25 / c.n_turns;
    if (older_turns == 0) add_tools_after(0, 0, 1);
    for (uint32_t t = 0; t < older_turns; ++t) {
        const double recency = older_turns > 1 ? static_cast<double>(t) / (older_turns - 1) : 1.0;
        blocks.push_back(planned(IKV_KIND_CONVERSATION, IKV_POLICY_ATTEND, 0.35 + 0.5 * recency + 0.1 * rng.uniform(),
                                 t, turn_weight * jitter(), "turn%u", t));
        add_tools_after(t, t, older_turns);
    }
    blocks.push_back(planned(IKV_KIND_SCRATCHPAD, IKV_POLICY_SKIP, 0.0, c.n_turns - 1, 0.05, "scratchpad", 0));
    blocks.push_back(planned(IKV_KIND_CONVERSATION, IKV_POLICY_RECENT, 1.0, c.n_turns - 1, turn_weight,
                             "turn%u", c.n_turns - 1));

    // Sizes: one token each, plus the rest shared by weight (floored); the
    // newest turn takes what rounding left, so the blocks tile exactly.
    double total_weight = 0;
    for (const Planned &p : blocks) total_weight += p.weight;
    const uint64_t spare = c.seq_len - blocks.size();
    uint64_t used = 0;
    uint32_t start = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
        const Planned &p = blocks[i];
        uint64_t extra = static_cast<uint64_t>(std::floor(spare * (p.weight / total_weight)));
        if (used + extra > spare) extra = spare - used;
        if (i + 1 == blocks.size()) extra = spare - used;
        used += extra;
        ikv_block_desc d = ikv_block_desc_default();
        d.name = p.name;
        d.kind = p.kind;
        d.policy = p.policy;
        d.score = p.score;
        d.turn = p.turn;
        d.start = start;
        d.end = start + 1 + static_cast<uint32_t>(extra);
        start = d.end;
        layout_add(layout, d, nullptr, "ikv_synth_layout");  // disjoint and valid by construction
    }
}

}  // namespace ikv
