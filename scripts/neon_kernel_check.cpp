// Used by check_neon_build.sh: the NEON kernels against the portable ones
// (built for aarch64, run under qemu): attention on random sub-pages of every
// format, and the top-k Quest bounds on random key-summary records (also
// against float64).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/quant.hpp"
#include "cpu/attn_kernel.hpp"

static const char *const kNames[] = {"f16", "bf16", "fp8_e4m3", "int8", "int4"};

int main() {
    using namespace ikv;
    const uint32_t P = 16, D = 80, n_pages = 5;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int failures = 0;
    // (group, query tokens): 8 rows take the span-buffer path, 3 rows the
    // dequantize-on-load path
    const uint32_t cases[2][2] = {{4, 2}, {3, 1}};
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
    for (const auto &cs : cases) {
        const uint32_t group = cs[0], nqt = cs[1], R = group * nqt;
        SubpageLayout layouts[IKV_FMT_COUNT];
        for (int g = 0; g < IKV_FMT_COUNT; ++g) layouts[g] = subpage_layout(ikv_format(g), P, D);
        const SubpageLayout &L = layouts[f];
        std::vector<uint8_t> mem(L.bytes * n_pages + 64);
        std::vector<SpanRef> spans;
        for (uint32_t p = 0; p < n_pages; ++p) {
            std::vector<float> k(P * D), v(P * D);
            for (float &x : k) x = nd(rng);
            for (float &x : v) x = nd(rng);
            write_subpage(ikv_format(f), P, D, k.data(), v.data(), D, P, mem.data() + p * L.bytes);
            spans.push_back(SpanRef{mem.data() + p * L.bytes, uint32_t(f), p == 0 ? 3u : 0u, P, p * P});
        }
        std::vector<float> q(R * D);
        for (float &x : q) x = nd(rng) * 0.1f;
        std::vector<float> res[2];
        for (int which = 0; which < 2; ++which) {
            res[which].assign(R * D + 2 * R, 0.0f);
            std::vector<float> ws(R * logit_stride(P) + 2 * P * D + R * D);
            ChunkTask T{};
            T.spans = spans.data();
            T.n_spans = uint32_t(spans.size());
            T.q = q.data();
            T.R = R;
            T.group = group;
            T.D = D;
            T.P = P;
            T.q_pos0 = n_pages * P - nqt - 1;  // the last page has one token in every query's future
            T.softcap = 0.0f;
            T.layouts = layouts;
            T.logits = ws.data();
            T.kspan = ws.data() + R * logit_stride(P);
            T.vspan = T.kspan + P * D;
            T.qfold = T.vspan + P * D;
            T.m = res[which].data();
            T.l = res[which].data() + R;
            T.acc = res[which].data() + 2 * R;
            (which == 0 ? cpu_kernels_neon() : cpu_kernels_scalar()).attend_chunk(T);
        }
        double num = 0, den = 0;
        for (uint32_t i = 0; i < R * D + 2 * R; ++i) {
            num += double(res[0][i] - res[1][i]) * (res[0][i] - res[1][i]);
            den += double(res[1][i]) * res[1][i];
        }
        const double rel = std::sqrt(num / den);
        std::printf("format %-9s rows %2u: neon vs scalar rel L2 %.3g\n", kNames[f], R, rel);
        if (!(rel < 1e-5)) ++failures;
    }
    // Quest bounds: n records of bf16 k_min <= k_max, a group of 4 query heads.
    {
        const uint32_t n = 37, group = 4;
        std::vector<uint16_t> recs(size_t(n) * 3 * D);
        std::vector<const uint8_t *> ptr(n);
        for (uint32_t i = 0; i < n; ++i) {
            uint16_t *r = recs.data() + size_t(i) * 3 * D;
            for (uint32_t d = 0; d < D; ++d) {
                const float a = nd(rng), b = nd(rng);
                encode_summary(r, D, d, std::fmin(a, b), std::fmax(a, b), 0.5f * (a + b));
            }
            ptr[i] = reinterpret_cast<const uint8_t *>(r);
        }
        std::vector<float> q(group * D), qpos(q.size()), qneg(q.size());
        for (size_t e = 0; e < q.size(); ++e) {
            q[e] = nd(rng);
            qpos[e] = std::fmax(q[e], 0.0f);
            qneg[e] = std::fmin(q[e], 0.0f);
        }
        std::vector<float> out[2];
        for (int which = 0; which < 2; ++which) {
            out[which].assign(n, 0.0f);
            const QuestTask t{ptr.data(), n, qpos.data(), qneg.data(), group, D, out[which].data()};
            (which == 0 ? cpu_kernels_neon() : cpu_kernels_scalar()).quest_bounds(t);
        }
        double worst = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const uint16_t *r = recs.data() + size_t(i) * 3 * D;
            double best = -INFINITY, mag = 0;
            for (uint32_t g = 0; g < group; ++g) {
                double sum = 0, m = 0;
                for (uint32_t d = 0; d < D; ++d) {
                    const double qd = q[g * D + d], lo = bf16_to_f32(r[d]), hi = bf16_to_f32(r[D + d]);
                    sum += std::fmax(qd * lo, qd * hi);
                    m += std::fabs(qd) * std::fmax(std::fabs(lo), std::fabs(hi));
                }
                best = std::fmax(best, sum);
                mag = std::fmax(mag, m);
            }
            for (int which = 0; which < 2; ++which) worst = std::fmax(worst, std::fabs(out[which][i] - best) / (1.0 + mag));
        }
        std::printf("quest bounds (%u records, group %u): neon and scalar vs float64, worst scaled err %.3g\n", n, group,
                    worst);
        if (!(worst < 1e-5)) ++failures;
        // The per-row path with the mean key's term (IKV_TOPK_SCORE_HYBRID: halved queries, every row's sum).
        std::vector<float> hp(q.size()), hn(q.size()), hm(q.size()), rows[2];
        for (size_t e = 0; e < q.size(); ++e) hp[e] = 0.5f * qpos[e], hn[e] = 0.5f * qneg[e], hm[e] = 0.5f * q[e];
        for (int which = 0; which < 2; ++which) {
            rows[which].assign(size_t(n) * group, 0.0f);
            QuestTask t{ptr.data(), n, hp.data(), hn.data(), group, D, nullptr};
            t.qmid = hm.data();
            t.rows = rows[which].data();
            (which == 0 ? cpu_kernels_neon() : cpu_kernels_scalar()).quest_bounds(t);
        }
        double worst_rows = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const uint16_t *r = recs.data() + size_t(i) * 3 * D;
            for (uint32_t g = 0; g < group; ++g) {
                double s = 0, m = 0;
                for (uint32_t d = 0; d < D; ++d) {
                    const double qd = q[g * D + d], lo = bf16_to_f32(r[d]), hi = bf16_to_f32(r[D + d]);
                    const double mean = bf16_to_f32(r[2 * D + d]);
                    s += 0.5 * (std::fmax(qd * lo, qd * hi) + qd * mean);
                    m += std::fabs(qd) * std::fmax(std::fabs(lo), std::fabs(hi));
                }
                for (int which = 0; which < 2; ++which)
                    worst_rows = std::fmax(worst_rows, std::fabs(rows[which][size_t(i) * group + g] - s) / (1.0 + m));
            }
        }
        std::printf("hybrid per-row sums (%u records, group %u): neon and scalar vs float64, worst scaled err %.3g\n", n,
                    group, worst_rows);
        if (!(worst_rows < 1e-5)) ++failures;
    }
    std::printf(failures ? "FAILED\n" : "OK\n");
    return failures ? 1 : 0;
}
