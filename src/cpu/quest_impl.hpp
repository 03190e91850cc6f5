// The Quest-bound kernel (attn_kernel.hpp QuestTask), written once over the
// vector-ops type O of attn_impl.hpp and instantiated by each ISA file:
// include it INSIDE the same anonymous namespace, after attn_impl.hpp.
// A record is 4*D bytes (bf16 k_min, k_max), read once per query head of the
// group from L1; two accumulators (k_max with q+, k_min with q-) per head.

constexpr uint32_t kQuestPrefetch = 4;  // records ahead: each sits in another page, far from the last

inline void prefetch_record(const uint8_t *rec, uint32_t D) {
    for (uint32_t off = 0; off < 4 * D; off += 64) O::prefetch(rec + off);
}

void quest_bounds(const QuestTask &T) {
    const uint32_t D = T.D;
    for (uint32_t i = 0; i < kQuestPrefetch && i < T.n; ++i) prefetch_record(T.records[i], D);
    for (uint32_t i = 0; i < T.n; ++i) {
        if (i + kQuestPrefetch < T.n) prefetch_record(T.records[i + kQuestPrefetch], D);
        const uint8_t *kmin = T.records[i], *kmax = kmin + 2ull * D;
        float best = -INFINITY;
        for (uint32_t g = 0; g < T.group; ++g) {
            const float *qp = T.qpos + uint64_t(g) * D, *qn = T.qneg + uint64_t(g) * D;
            typename O::V hi = O::zero(), lo = O::zero();
            for (uint32_t d = 0; d < D; d += O::W) {
                hi = O::fma(O::load(qp + d), O::bf16(kmax + 2ull * d), hi);
                lo = O::fma(O::load(qn + d), O::bf16(kmin + 2ull * d), lo);
            }
            const float s = O::hsum(O::add(hi, lo));
            if (s > best) best = s;  // a NaN sum never wins
        }
        T.bounds[i] = best;
    }
}
