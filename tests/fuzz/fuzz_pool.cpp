// Pool and decode calls from fuzzer bytes on a small CPU pool: appends with
// fuzzed counts, strides, layers, plans and values (NaN and inf included),
// fork, truncate, evict, format changes, room reserved ahead, reads,
// summaries, and decodes with fuzzed arguments (plans, top-k modes and
// scores, a query memory, feedback, the step's tokens appended with them).
// No call may crash; a refused call leaves every sequence's length and the
// pool's bytes in use as they were; a refused decode writes no output.
#include <cmath>
#include <cstring>
#include <vector>

#include "fuzz_input.hpp"
#include "intentkv.h"

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kMaxTokens = 40, kMaxD = 64, kMaxSeqs = 4;

struct State {
    ikv_pool *pool = nullptr;
    std::vector<ikv_seq_id> seqs;
    uint32_t D = 32;
};

// Lengths of every sequence and the pool's bytes in use: what a refused call must not change.
std::vector<uint64_t> observe(const State &s) {
    std::vector<uint64_t> o;
    for (ikv_seq_id q : s.seqs) {
        uint32_t len = 0;
        o.push_back(ikv_seq_length(s.pool, q, &len) == IKV_OK ? len : ~0ull);
    }
    ikv_pool_stats st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    ikv_pool_get_stats(s.pool, &st);
    o.push_back(st.used_bytes);
    o.push_back(st.n_sequences);
    return o;
}

ikv_seq_id pick(State &s, FuzzInput &in) {
    if (s.seqs.empty() || in.below(16) == 0) return in.take<uint32_t>();  // sometimes one that does not exist
    return s.seqs[in.below(uint32_t(s.seqs.size()))];
}

void fuzz_append(State &s, FuzzInput &in, ikv_plan *plan) {
    static float k[kLayers * kMaxTokens * kHeads * kMaxD * 2], v[sizeof k / sizeof *k];
    const uint32_t n = in.below(kMaxTokens + 1);
    ikv_append a = ikv_append_default(s.pool, n);
    a.layer = in.below(4) == 0 ? IKV_ALL_LAYERS : in.below(kLayers + 1);
    // Strides within what the buffers hold (twice the dense layout), or too small (refused).
    const int64_t row = int64_t(kHeads) * s.D;
    if (in.below(4) == 0) a.token_stride = int64_t(in.below(uint32_t(2 * row + 1)));
    if (in.below(4) == 0) a.head_stride = int64_t(in.below(uint32_t(s.D + 1)));
    const uint64_t count = uint64_t(kLayers) * n * row;
    for (uint64_t i = 0; i < count; ++i) {
        k[i] = in.below(64) == 0 ? in.value() : float(int(i % 17) - 8) / 8.0f;
        v[i] = in.below(64) == 0 ? in.value() : float(int(i % 13) - 6) / 8.0f;
    }
    a.k = in.below(32) == 0 ? nullptr : k;
    a.v = v;
    a.formats = in.below(2) ? plan : nullptr;
    a.flags = in.below(16) == 0 ? in.take<uint32_t>() : 0u;
    const std::vector<uint64_t> before = observe(s);
    if (ikv_pool_append(s.pool, pick(s, in), &a) != IKV_OK) {
        FUZZ_CHECK(observe(s) == before);
        FUZZ_CHECK(ikv_last_error()[0] != '\0');
    }
}

void fuzz_decode(State &s, FuzzInput &in, ikv_decoder *dec, ikv_plan *plan, ikv_query_memory *mem,
                 ikv_page_feedback *fb) {
    static float q[4 * 8 * kMaxD], out[4 * 8 * kMaxD], poison[4 * 8 * kMaxD];
    static const bool poisoned = (std::memset(poison, 0x5A, sizeof poison), true);  // not a value a decode writes
    (void)poisoned;
    const uint32_t B = 1 + in.below(2), nq = kHeads * (1 + in.below(2)), nqt = 1 + in.below(3);
    ikv_seq_id seqs[2] = {pick(s, in), pick(s, in)};
    for (uint32_t i = 0; i < B * nqt * nq * s.D; ++i) q[i] = in.below(64) == 0 ? in.value() : float(int(i % 9) - 4);
    const ikv_plan *plans[2] = {in.below(2) ? plan : nullptr, in.below(2) ? plan : nullptr};
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = in.below(kLayers + 1);
    a.n_seqs = in.below(8) == 0 ? 0 : B;
    a.seqs = seqs;
    a.plans = in.below(2) ? plans : nullptr;
    a.n_query_tokens = in.below(16) == 0 ? in.take<uint32_t>() : nqt;
    a.n_q_heads = in.below(16) == 0 ? in.below(9) : nq;
    a.q = q;
    a.out = out;
    a.q_dtype = ikv_dtype(in.below(16) == 0 ? int(in.below(5)) - 1 : 0);
    a.out_dtype = ikv_dtype(in.below(3));
    a.scale = in.below(4) == 0 ? in.value() : 0.0f;
    a.softcap = in.below(4) == 0 ? in.value() : 0.0f;
    a.topk_token_budget = in.below(2) ? in.below(3 * kMaxTokens) : 0;
    a.topk_mode = ikv_topk_mode(in.below(8) == 0 ? int(in.below(4)) - 1 : int(in.below(2)));
    a.topk_mass = in.below(4) == 0 ? in.value() : 0.8f;
    a.topk_min_tokens = in.below(2 * kMaxTokens);
    a.topk_score = ikv_topk_score(in.below(8) == 0 ? int(in.below(4)) - 1 : int(in.below(2)));
    a.query_memory = in.below(2) ? mem : nullptr;
    a.feedback = in.below(2) ? fb : nullptr;
    a.topk_feedback_weight = in.below(4) == 0 ? in.value() : 0.5f;
    // Sometimes the step's tokens with the decode (args->append): n per
    // sequence, at the decode's layer or (refused) another, values with NaN
    // and inf, a bad struct_size now and then.
    static float ak[2 * 3 * kHeads * kMaxD], av[sizeof ak / sizeof *ak];
    ikv_append app = ikv_append_default(s.pool, 1 + in.below(3));
    const bool with_append = in.below(3) == 0;
    if (with_append) {
        app.layer = in.below(8) == 0 ? in.below(kLayers + 1) : a.layer;
        for (size_t i = 0; i < sizeof ak / sizeof *ak; ++i) {
            ak[i] = in.below(64) == 0 ? in.value() : float(int(i % 11) - 5) / 4.0f;
            av[i] = in.below(64) == 0 ? in.value() : float(int(i % 7) - 3) / 4.0f;
        }
        app.k = ak;
        app.v = av;
        if (in.below(16) == 15) app.struct_size = in.below(uint32_t(sizeof app) + 8);  // not 0: spent input reads 0
        a.append = &app;
    }
    uint32_t layer_len[2] = {0, 0};
    for (uint32_t b = 0; b < 2; ++b) ikv_seq_layer_length(s.pool, seqs[b], a.layer, &layer_len[b]);
    const std::vector<uint64_t> before = observe(s);
    std::memcpy(out, poison, sizeof out);
    const ikv_status st = ikv_decode(dec, s.pool, &a);
    if (st != IKV_OK) {
        FUZZ_CHECK(std::memcmp(out, poison, sizeof out) == 0);
        FUZZ_CHECK(ikv_last_error()[0] != '\0');
        // Only running out of memory once the append began may leave tokens appended (the header).
        if (st != IKV_E_NOMEM) FUZZ_CHECK(observe(s) == before);
        return;
    }
    if (with_append)  // each sequence's layer grew by the step's tokens (the batch refuses a sequence twice)
        for (uint32_t b = 0; b < a.n_seqs; ++b) {
            uint32_t len = 0;
            FUZZ_CHECK(ikv_seq_layer_length(s.pool, seqs[b], a.layer, &len) == IKV_OK);
            FUZZ_CHECK(len == layer_len[b] + app.n_tokens);
        }
    for (uint32_t b = 0; b < a.n_seqs; ++b)
        for (uint32_t h = 0; h < kHeads; ++h) {
            size_t n = 0;
            FUZZ_CHECK(ikv_decoder_last_selection(dec, b, h, nullptr, 0, &n) == IKV_OK);
        }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in(data, size);
    State s;
    s.D = in.below(2) ? 32 : 64;
    ikv_pool_config pc = ikv_pool_default_config();
    pc.n_layers = kLayers;
    pc.n_kv_heads = kHeads;
    pc.head_dim = s.D;
    pc.page_size = 8u << in.below(2);
    pc.capacity_bytes = 16384u << in.below(6);  // small: capacity refusals are part of the game
    pc.default_format = ikv_format(in.below(5));
    pc.kv_dtype = IKV_DTYPE_F32;
    if (ikv_pool_create(&pc, &s.pool) != IKV_OK) return 0;
    ikv_decoder *dec = nullptr;
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = 1 + in.below(2);
    ikv_query_memory *mem = nullptr;
    ikv_query_memory_config mc = ikv_query_memory_default_config();
    mc.n_q_heads = kHeads;
    ikv_page_feedback *fb = nullptr;
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    ikv_plan *plan = nullptr;
    auto release = [&] {  // every destroy accepts NULL
        ikv_plan_destroy(plan);
        ikv_page_feedback_destroy(fb);
        ikv_query_memory_destroy(mem);
        ikv_decoder_destroy(dec);
        ikv_pool_destroy(s.pool);
        return 0;
    };
    const ikv_token_range ranges[2] = {{in.below(24), 24 + in.below(24)}, {50, 50 + in.below(30)}};
    if (ikv_decoder_create(&dc, &dec) != IKV_OK || ikv_query_memory_create(s.pool, &mc, &mem) != IKV_OK ||
        ikv_page_feedback_create(s.pool, &fc, &fb) != IKV_OK ||
        ikv_plan_from_ranges(ranges, 2, 80, pc.page_size, ikv_format(in.below(5)), &plan) != IKV_OK)
        return release();
    for (int op = 0; op < 32 && !in.empty(); ++op) {
        const std::vector<uint64_t> before = observe(s);
        ikv_status st = IKV_OK;
        bool changes = true;  // a refused call must not have changed what observe() sees
        switch (in.below(13)) {
            case 0:
                if (s.seqs.size() < kMaxSeqs) {
                    ikv_seq_id id;
                    if (ikv_seq_create(s.pool, &id) == IKV_OK) s.seqs.push_back(id);
                }
                changes = false;
                break;
            case 1:
            case 2: fuzz_append(s, in, plan); changes = false; break;
            case 3:
                if (s.seqs.size() < kMaxSeqs) {
                    ikv_seq_id child;
                    st = ikv_seq_fork(s.pool, pick(s, in), &child);
                    if (st == IKV_OK) s.seqs.push_back(child);
                }
                break;
            case 4: st = ikv_seq_truncate(s.pool, pick(s, in), in.below(2 * kMaxTokens)); break;
            case 5: st = ikv_seq_evict(s.pool, pick(s, in), pc.page_size * in.below(6), pc.page_size * in.below(8));
                break;
            case 6: st = ikv_seq_set_page_format(s.pool, pick(s, in), in.below(8), ikv_format(int(in.below(7)) - 1));
                break;
            case 7: st = ikv_seq_apply_plan_formats(s.pool, pick(s, in), plan); break;
            case 8: {
                static float kr[kMaxTokens * 4 * kHeads * kMaxD], vr[sizeof kr / sizeof *kr];
                const uint32_t b = in.below(2 * kMaxTokens), e = b + in.below(kMaxTokens);
                st = ikv_seq_read(s.pool, pick(s, in), in.below(kLayers + 1), b, e, kr, vr);
                float mn[kMaxD], mx[kMaxD], me[kMaxD];
                uint32_t n = 0;
                ikv_seq_page_summary(s.pool, pick(s, in), in.below(kLayers), in.below(kHeads), in.below(10), mn, mx, me,
                                     &n);
                break;
            }
            case 9: {
                static float qm[3 * kHeads * kMaxD];
                for (float &x : qm) x = in.below(32) == 0 ? in.value() : 0.25f;
                st = ikv_query_memory_remember(mem, pick(s, in), in.below(kLayers + 1), qm, IKV_DTYPE_F32,
                                               in.below(4));
                if (in.below(2)) ikv_query_memory_end_turn(mem, pick(s, in));
                changes = false;
                break;
            }
            case 10:
                if (!s.seqs.empty() && in.below(4) == 0) {
                    const uint32_t i = in.below(uint32_t(s.seqs.size()));
                    if (ikv_seq_destroy(s.pool, s.seqs[i]) == IKV_OK) {
                        ikv_query_memory_forget(mem, s.seqs[i]);
                        ikv_page_feedback_forget(fb, s.seqs[i]);
                        s.seqs.erase(s.seqs.begin() + i);
                    }
                }
                changes = false;
                break;
            case 11: {  // room ahead for one or two sequences (maybe the same twice, maybe ending it)
                const ikv_seq_id two[2] = {pick(s, in), pick(s, in)};
                st = ikv_pool_reserve(s.pool, two, 1 + in.below(2), in.below(3 * kMaxTokens));
                break;
            }
            default: fuzz_decode(s, in, dec, plan, mem, fb); changes = false; break;
        }
        if (st != IKV_OK && changes) {
            FUZZ_CHECK(observe(s) == before);
            FUZZ_CHECK(ikv_last_error()[0] != '\0');
        }
    }
    return release();
}
