// The Quest-bound kernel (attn_kernel.hpp QuestTask), written once over the
// vector-ops type O of attn_impl.hpp and instantiated by each ISA file:
// include it INSIDE the same anonymous namespace, after attn_impl.hpp.
// A record is 4*D bytes (bf16 k_min, k_max; 6*D with k_mean for the hybrid
// score), read once per query head of the group from L1; two accumulators
// (k_max with q+, k_min with q-; k_mean's term joins the first) per head.

constexpr uint32_t kQuestPrefetch = 4;  // records ahead: each sits in another page, far from the last

inline void prefetch_record(const uint8_t *rec, uint32_t bytes) {
    for (uint32_t off = 0; off < bytes; off += 64) O::prefetch(rec + off);
}

void quest_bounds(const QuestTask &T) {
    const uint32_t D = T.D, rec_bytes = (T.qmid ? 6 : 4) * D;  // k_min, k_max (+ k_mean)
    for (uint32_t i = 0; i < kQuestPrefetch && i < T.n; ++i) prefetch_record(T.records[i], rec_bytes);
    for (uint32_t i = 0; i < T.n; ++i) {
        if (i + kQuestPrefetch < T.n) prefetch_record(T.records[i + kQuestPrefetch], rec_bytes);
        const uint8_t *kmin = T.records[i], *kmax = kmin + 2ull * D, *kmean = kmax + 2ull * D;
        float best = -INFINITY;
        for (uint32_t g = 0; g < T.group; ++g) {
            const float *qp = T.qpos + uint64_t(g) * D, *qn = T.qneg + uint64_t(g) * D;
            typename O::V hi = O::zero(), lo = O::zero();
            for (uint32_t d = 0; d < D; d += O::W) {
                hi = O::fma(O::load(qp + d), O::bf16(kmax + 2ull * d), hi);
                lo = O::fma(O::load(qn + d), O::bf16(kmin + 2ull * d), lo);
            }
            if (T.qmid) {  // hybrid: the mean key's term
                const float *qm = T.qmid + uint64_t(g) * D;
                for (uint32_t d = 0; d < D; d += O::W) hi = O::fma(O::load(qm + d), O::bf16(kmean + 2ull * d), hi);
            }
            const float s = O::hsum(O::add(hi, lo));
            if (T.rows) {  // every row's sum
                T.rows[uint64_t(i) * T.group + g] = s;
                continue;
            }
            if (s > best) best = s;  // a NaN sum never wins
        }
        if (!T.rows) T.bounds[i] = best;
    }
}
