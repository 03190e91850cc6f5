/* Benchmarks of tiered KV memory on a CUDA pool (bench/RESULTS.md section 9),
 * through the public API. Not a CTest test: run by hand or by the device
 * scripts, `build/tests/bench_gpu_tiers [moves|trace] [steps per turn]` (default both, 64).
 *   moves: 4 sequences of 32K tokens, 25% plans; step time with the plan's
 *          pages on the device and the rest on the host, with everything on
 *          the host (read over the bus), and fetching first.
 *   trace: an agentic multi-turn session (synthetic layouts, the router at a
 *          25% budget, hybrid top-k inside the plan, a per-layer one-token
 *          append and decode per step) on a pool whose device holds 30% of
 *          the session's KV, run by the automatic tier policy with prefetch
 *          on and off, against the same session all resident: step time,
 *          peak device-resident KV, bytes moved and host pages read per step,
 *          and the outputs compared byte for byte. IKVT_TIER_DIAG=1 waits for
 *          the device after every tier step and prints where its time went
 *          (host vs copies); IKVT_TIER_DIAG=2 prints the tier steps whose host
 *          time exceeds 1 ms, without waiting.
 *          A step's time ends when the engine's stream is done (the pool's
 *          offloads run on a stream of their own); IKVT_TIER_SYNC=device
 *          waits for the whole device instead.
 * Skips without a CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { D = 128, P = 16 };

/* n seeded N(0, 1) values as f16 (malloc'd; the caller frees). */
static uint16_t *random_f16(ikvt_rng *rng, size_t n) {
    uint16_t *out = malloc(n * sizeof *out);
    float tmp[4096];
    for (size_t i = 0; i < n; i += 4096) {
        const size_t m = n - i < 4096 ? n - i : 4096;
        ikvt_fill_normal(rng, tmp, m, 1.0f);
        ikvt_to_f16(tmp, out + i, m);
    }
    return out;
}

/* ------------------------------------------------------------------ moves */


static double step_ms(ikv_decoder *dec, ikv_pool *pool, const ikv_decode_args *base, uint32_t layers, int reps) {
    ikv_decode_args a = *base;
    for (int w = 0; w < 2; ++w)
        for (uint32_t l = 0; l < layers; ++l) {
            a.layer = l;
            IKVT_OK(ikv_decode(dec, pool, &a));
        }
    assert_int_equal(ikvt_rt.sync_(), 0);
    const double t0 = ikvt_now_us();
    for (int r = 0; r < reps; ++r)
        for (uint32_t l = 0; l < layers; ++l) {
            a.layer = l;
            IKVT_OK(ikv_decode(dec, pool, &a));
        }
    assert_int_equal(ikvt_rt.sync_(), 0);
    return (ikvt_now_us() - t0) / 1000.0 / reps;
}

static void bench_tiers(void) {
    enum { BL = 8, BH = 8, BG = 4, BQ = BH * BG, BB = 4, CTX = 32768, REPS = 20 };
    ikvt_rng rng = {9};
    const size_t per_seq = (size_t)BL * CTX * BH * D;
    uint16_t *kv = random_f16(&rng, per_seq);
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = BL,
                                                          .n_kv_heads = BH, .head_dim = D, .page_size = P,
                                                          .capacity_bytes = 8ull << 30, .kv_dtype = IKV_DTYPE_F16});
    c.host_capacity_bytes = 8ull << 30;
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    ikv_seq_id seqs[BB];
    ikv_plan *plans[BB];
    const uint32_t n_pages = CTX / P;
    for (uint32_t b = 0; b < BB; ++b) {
        IKVT_OK(ikv_seq_create(pool, &seqs[b]));
        ikv_append ap = ikv_append_default(pool, CTX);
        ap.layer = IKV_ALL_LAYERS;
        ap.k = kv;
        ap.v = kv;
        IKVT_OK(ikv_pool_append(pool, seqs[b], &ap));
        /* a 25% plan: seeded random pages plus the newest 32 */
        ikv_token_range *r = malloc(sizeof *r * n_pages);
        size_t nr = 0;
        for (uint32_t p = 0; p < n_pages; ++p)
            if (p >= n_pages - 32 || ikvt_uniform(&rng) < 0.24) r[nr++] = (ikv_token_range){p * P, (p + 1) * P};
        IKVT_OK(ikv_plan_from_ranges(r, nr, CTX, P, IKV_FMT_F16, &plans[b]));
        free(r);
    }
    float *q = malloc(sizeof(float) * BB * BQ * D);
    ikvt_fill_normal(&rng, q, (size_t)BB * BQ * D, 1.0f);
    void *dq = ikvt_dev_upload(q, sizeof(float) * BB * BQ * D), *dout = ikvt_dev_upload(NULL, sizeof(float) * BB * BQ * D);
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = BB;
    a.seqs = seqs;
    a.plans = (const ikv_plan *const *)plans;
    a.n_q_heads = BQ;
    a.q = dq;
    a.out = dout;
    float *ref = malloc(sizeof(float) * BB * BQ * D), *got = malloc(sizeof(float) * BB * BQ * D);
    const uint64_t all = ikvt_pool_stats(pool).used_bytes;
    const double t_all = step_ms(dec, pool, &a, BL, REPS);
    assert_int_equal(ikvt_rt.memcpy_(ref, dout, sizeof(float) * BB * BQ * D, IKVT_D2H), 0);
    /* the plan's pages stay, the rest goes to the host */
    const double m0 = ikvt_now_us();
    for (uint32_t b = 0; b < BB; ++b) {
        const ikv_plan_page *pp = NULL;
        size_t np = 0;
        IKVT_OK(ikv_plan_pages(plans[b], &pp, &np));
        uint32_t next = 0;
        for (size_t i = 0; i <= np; ++i) {
            const uint32_t upto = i < np ? pp[i].page : n_pages;
            if (upto > next) IKVT_OK(ikv_seq_offload(pool, seqs[b], next * P, upto * P, NULL, NULL));
            next = i < np ? pp[i].page + 1 : n_pages;
        }
    }
    assert_int_equal(ikvt_rt.sync_(), 0);
    const double offload_ms = (ikvt_now_us() - m0) / 1000.0;
    const ikv_pool_stats st = ikvt_pool_stats(pool);
    const double t_plan = step_ms(dec, pool, &a, BL, REPS);
    assert_int_equal(ikvt_rt.memcpy_(got, dout, sizeof(float) * BB * BQ * D, IKVT_D2H), 0);
    const int same1 = memcmp(ref, got, sizeof(float) * BB * BQ * D) == 0;
    /* everything on the host: the plan's pages read over the bus */
    for (uint32_t b = 0; b < BB; ++b) IKVT_OK(ikv_seq_offload(pool, seqs[b], 0, CTX, NULL, NULL));
    const double t_host = step_ms(dec, pool, &a, BL, REPS);
    assert_int_equal(ikvt_rt.memcpy_(got, dout, sizeof(float) * BB * BQ * D, IKVT_D2H), 0);
    const int same2 = memcmp(ref, got, sizeof(float) * BB * BQ * D) == 0;
    /* fetch the plan's pages first, then decode (the step that waits) */
    const uint64_t fetched0 = ikvt_pool_stats(pool).bytes_fetched;
    const double f0 = ikvt_now_us();
    for (uint32_t b = 0; b < BB; ++b) {
        const ikv_plan_page *pp = NULL;
        size_t np = 0;
        IKVT_OK(ikv_plan_pages(plans[b], &pp, &np));
        for (size_t i = 0; i < np;) { /* runs of consecutive pages, one call each */
            size_t j = i + 1;
            while (j < np && pp[j].page == pp[j - 1].page + 1) ++j;
            IKVT_OK(ikv_seq_fetch(pool, seqs[b], pp[i].page * P, (pp[j - 1].page + 1) * P, NULL, NULL));
            i = j;
        }
    }
    assert_int_equal(ikvt_rt.sync_(), 0);
    const double fetch_ms = (ikvt_now_us() - f0) / 1000.0;
    const uint64_t fetched = ikvt_pool_stats(pool).bytes_fetched - fetched0;
    const double t_fetched = step_ms(dec, pool, &a, BL, REPS);
    assert_int_equal(ikvt_rt.memcpy_(got, dout, sizeof(float) * BB * BQ * D, IKVT_D2H), 0);
    const int same3 = memcmp(ref, got, sizeof(float) * BB * BQ * D) == 0;
    printf("tier bench: B=%d, %d tokens each, %d layers, 8 kv-heads x 128, F16 pages, 25%% plans; ms per step "
           "(all layers)\n", BB, CTX, BL);
    printf("  all resident               %.3f ms  device-resident %.0f MB\n", t_all, all / 1e6);
    printf("  plan resident, rest offloaded %.3f ms (%.2fx)  device-resident %.0f MB (%.1f%% of all)  offload "
           "%.1f ms for %.0f MB  outputs %s\n", t_plan, t_plan / t_all, st.used_bytes / 1e6,
           100.0 * st.used_bytes / all, offload_ms, st.bytes_offloaded / 1e6, same1 ? "identical" : "DIFFER");
    printf("  everything on the host (bus) %.3f ms (%.2fx)  outputs %s\n", t_host, t_host / t_all,
           same2 ? "identical" : "DIFFER");
    printf("  fetch the plan's pages       %.1f ms for %.0f MB (%.1f GB/s), then %.3f ms (%.2fx)  outputs %s\n",
           fetch_ms, fetched / 1e6, fetched / 1e6 / fetch_ms, t_fetched, t_fetched / t_all, same3 ? "identical" : "DIFFER");
    assert_true(same1 && same2 && same3);
    ikv_decoder_destroy(dec);
    for (uint32_t b = 0; b < BB; ++b) ikv_plan_destroy(plans[b]);
    ikv_pool_destroy(pool);
    ikvt_rt.free_(dq);
    ikvt_rt.free_(dout);
    free(kv), free(q), free(ref), free(got);
}


/* ------------------------------------------------------------------ trace */

enum { TL = 8, TH = 8, TG = 4, TQ = TH * TG, TB = 4, TCTX = 32768, TURNS = 6, CHUNK = 2048 };
/* Decode steps per turn: 64, or the program's second argument. */
static int g_turn_steps = 64;

typedef struct trace_result {
    double step_ms;           /* decode-phase wall time per step (every layer's append + decode, the tier step) */
    double first_step_ms;     /* the mean of each timed turn's first step (the turn's moves) */
    double start_turn_ms;     /* the whole first turn (not in the means: every plan page fetched once) */
    uint64_t peak_device;     /* the most device-resident page bytes seen (after each tier step and append) */
    uint64_t session_bytes;   /* page bytes of the whole session at the end */
    double moved_mb_per_step; /* bytes offloaded + fetched during the decode phase, per step */
    double host_reads_per_step;
    double tier_step_us;      /* host time of one ikv_pool_tier_step call (enqueueing its moves included) */
    double rest_step_ms;      /* the mean of the timed turns' other steps (all but the first) */
    double tier_rest_us;      /* host time of the tier step on those other steps */
    double plan_share;        /* pages the plans select over the session's pages (the last turn) */
    uint64_t fetched, offloaded;
    float *outs;              /* each turn's last output, TURNS x TB x TQ x D */
} trace_result;

/* Raise three neighbouring documents, lower the rest: each turn one document
 * leaves the attended window and one enters; the window moves on, then back
 * (documents return). */
static void score_turn(ikv_layout *layout, int turn) {
    static const uint32_t kWindowStart[TURNS] = {0, 1, 2, 3, 2, 1};
    uint32_t doc = 0;
    for (size_t i = 0; i < ikv_layout_count(layout); ++i) {
        ikv_block_info info;
        IKVT_OK(ikv_layout_at(layout, i, &info));
        if (info.kind != IKV_KIND_RETRIEVED_DOC || info.policy != IKV_POLICY_ATTEND) continue;
        const int on = doc >= kWindowStart[turn] && doc < kWindowStart[turn] + 3;
        IKVT_OK(ikv_layout_set_score(layout, info.id, on ? 0.9f : 0.35f));
        ++doc;
    }
}

/* tiered: 0 = all resident; 1 = policy with prefetch; 2 = policy without. */
static trace_result run_trace(int tiered, const uint16_t *prefill, const void *dev_kv, const void *dq, void *dout,
                              uint64_t session_bytes) {
    trace_result res;
    memset(&res, 0, sizeof res);
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = TL,
                                                          .n_kv_heads = TH, .head_dim = D, .page_size = P,
                                                          .capacity_bytes = 16ull << 30, .kv_dtype = IKV_DTYPE_F16});
    if (tiered) {
        c.capacity_bytes = session_bytes * 3 / 10;
        c.host_capacity_bytes = session_bytes;
    }
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    if (tiered) {
        ikv_tier_policy policy;
        memset(&policy, 0, sizeof policy);
        policy.struct_size = sizeof policy;
        policy.idle_steps = 4;
        policy.flags = tiered == 2 ? IKV_TIER_NO_PREFETCH : 0;
        IKVT_OK(ikv_pool_set_tier_policy(pool, &policy));
    }
    ikv_router_config rc = ikv_router_default_config();
    rc.token_budget = TCTX / 4;
    ikv_router *router = NULL;
    IKVT_OK(ikv_router_create(&rc, &router));
    ikv_seq_id seqs[TB];
    ikv_layout *layouts[TB];
    ikv_plan *plans[TB] = {NULL};
    /* prefill in chunks; a tiered pool relieves its pressure between them */
    for (uint32_t b = 0; b < TB; ++b) {
        IKVT_OK(ikv_seq_create(pool, &seqs[b]));
        ikv_synth_config sc = ikv_synth_default_config();
        sc.seq_len = TCTX;
        sc.seed = 100 + b;
        IKVT_OK(ikv_synth_layout(&sc, &layouts[b]));
    }
    for (uint32_t t0 = 0; t0 < TCTX; t0 += CHUNK)
        for (uint32_t b = 0; b < TB; ++b) {
            ikv_append ap = ikv_append_default(pool, CHUNK);
            ap.layer = IKV_ALL_LAYERS;
            ap.k = prefill + (size_t)t0 * TH * D;
            ap.v = prefill + (size_t)t0 * TH * D;
            ap.layer_stride = (int64_t)TCTX * TH * D;
            IKVT_OK(ikv_pool_append(pool, seqs[b], &ap));
            if (tiered) IKVT_OK(ikv_pool_tier_step(pool, NULL, NULL, 0, NULL, NULL));
        }
    assert_int_equal(ikvt_rt.sync_(), 0);

    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = TB;
    a.seqs = seqs;
    a.n_q_heads = TQ;
    a.q = dq;
    a.out = dout;
    a.topk_token_budget = TCTX / 8; /* half the plan's tokens */
    a.topk_score = IKV_TOPK_SCORE_HYBRID;
    ikv_append ap = ikv_append_default(pool, 1);
    ap.k = dev_kv;
    ap.v = dev_kv;
    ap.src_on_device = 1;
    ap.flags = IKV_APPEND_ASYNC;
    ikv_pool_stats s0 = ikvt_pool_stats(pool); /* taken again when the timed turns begin */
    res.peak_device = s0.used_bytes;
    res.outs = malloc(sizeof(float) * TURNS * TB * TQ * D);
    double total_us = 0.0, first_us = 0.0, tier_us = 0.0, start_us = 0.0, tier_rest_us = 0.0;
    const int diag = getenv("IKVT_TIER_DIAG") ? atoi(getenv("IKVT_TIER_DIAG")) : 0;
    const int device_sync = getenv("IKVT_TIER_SYNC") && strcmp(getenv("IKVT_TIER_SYNC"), "device") == 0;
    for (int turn = 0; turn < TURNS; ++turn) {
        for (uint32_t b = 0; b < TB; ++b) {
            uint32_t len = 0;
            IKVT_OK(ikv_seq_length(pool, seqs[b], &len));
            score_turn(layouts[b], turn);
            ikv_plan_destroy(plans[b]);
            plans[b] = NULL;
            IKVT_OK(ikv_router_route(router, layouts[b], len + g_turn_steps, &plans[b]));
        }
        a.plans = (const ikv_plan *const *)plans;
        if (turn == 1) s0 = ikvt_pool_stats(pool);
        for (int s = 0; s < g_turn_steps; ++s) {
            const double t0 = ikvt_now_us();
            if (tiered) {
                const double c0 = ikvt_now_us();
                ikv_tier_step_report rep;
                memset(&rep, 0, sizeof rep);
                rep.struct_size = sizeof rep;
                IKVT_OK(ikv_pool_tier_step(pool, seqs, a.plans, TB, NULL, &rep));
                const double c1 = ikvt_now_us();
                if (turn > 0) tier_us += c1 - c0;
                if (turn > 0 && s > 0) tier_rest_us += c1 - c0;
                if (diag == 2 && c1 - c0 > 1000.0) /* long host time, without the sync below */
                    printf("    turn %d step %d: tier step host %.2f ms; fetched %u offloaded %u pages\n", turn, s,
                           (c1 - c0) / 1000.0, rep.pages_fetched, rep.pages_offloaded);
                if (diag == 1) { /* where a step's tier time goes: enqueueing (host) vs the copies (device) */
                    assert_int_equal(ikvt_rt.sync_(), 0);
                    if (s == 0 || rep.pages_fetched + rep.pages_offloaded > 0)
                        printf("    turn %d step %d: tier step host %.2f ms, copies done after %.2f ms more; "
                               "fetched %u offloaded %u pages, %u left on host\n", turn, s, (c1 - c0) / 1000.0,
                               (ikvt_now_us() - c1) / 1000.0, rep.pages_fetched, rep.pages_offloaded,
                               rep.pages_on_host);
                }
            }
            for (uint32_t l = 0; l < TL; ++l) {
                ap.layer = l;
                IKVT_OK(ikv_pool_append_batch(pool, seqs, TB, &ap));
                a.layer = l;
                IKVT_OK(ikv_decode(dec, pool, &a));
            }
            /* the time an engine sees: the step's work on its stream done (one sync per step; the
               pool's offload copies run on a stream of its own, and what reads their pages waits for them).
               IKVT_TIER_SYNC=device waits for the whole device instead (the offloads' copies too). */
            assert_int_equal(device_sync ? ikvt_rt.sync_() : ikvt_rt.stream_sync_(NULL), 0);
            const double us = ikvt_now_us() - t0;
            if (turn == 0) { /* the session's start (first fetch of every plan page, allocations): apart */
                start_us += us;
            } else {
                total_us += us;
                if (s == 0) first_us += us;
            }
            const uint64_t used = ikvt_pool_stats(pool).used_bytes;
            if (used > res.peak_device) res.peak_device = used;
        }
        IKVT_OK(ikv_pool_sync(pool));
        assert_int_equal(ikvt_rt.memcpy_(res.outs + (size_t)turn * TB * TQ * D, dout, sizeof(float) * TB * TQ * D,
                                         IKVT_D2H), 0);
    }
    const ikv_pool_stats s1 = ikvt_pool_stats(pool);
    const double steps = (double)(TURNS - 1) * g_turn_steps; /* the timed turns: all but the first */
    res.step_ms = total_us / 1000.0 / steps;
    res.first_step_ms = first_us / 1000.0 / (TURNS - 1);
    res.start_turn_ms = start_us / 1000.0;
    res.fetched = s1.bytes_fetched - s0.bytes_fetched;
    res.offloaded = s1.bytes_offloaded - s0.bytes_offloaded;
    res.moved_mb_per_step = (double)(res.fetched + res.offloaded) / 1e6 / steps;
    res.host_reads_per_step = (double)(s1.host_page_reads - s0.host_page_reads) / steps;
    res.session_bytes = s1.used_bytes + s1.host_used_bytes;
    res.tier_step_us = tier_us / steps;
    res.rest_step_ms = (total_us - first_us) / 1000.0 / (steps - (TURNS - 1));
    res.tier_rest_us = tier_rest_us / (steps - (TURNS - 1));
    uint64_t selected = 0;
    for (uint32_t b = 0; b < TB; ++b) {
        ikv_plan_summary sum;
        IKVT_OK(ikv_plan_get_summary(plans[b], &sum));
        selected += sum.pages_selected;
    }
    res.plan_share = (double)selected * ikv_pool_page_bytes(pool, IKV_FMT_F16) / (double)res.session_bytes;
    ikv_decoder_destroy(dec);
    for (uint32_t b = 0; b < TB; ++b) {
        ikv_plan_destroy(plans[b]);
        ikv_layout_destroy(layouts[b]);
    }
    ikv_router_destroy(router);
    ikv_pool_destroy(pool);
    return res;
}

static void bench_trace(void) {
    ikvt_rng rng = {31};
    const size_t per_seq = (size_t)TL * TCTX * TH * D;
    uint16_t *kv = random_f16(&rng, per_seq);
    uint16_t step_kv[TL * TB * TH * D];
    float stmp[TL * TB * TH * D];
    ikvt_fill_normal(&rng, stmp, TL * TB * TH * D, 1.0f);
    ikvt_to_f16(stmp, step_kv, TL * TB * TH * D);
    void *dev_kv = ikvt_dev_upload(step_kv, sizeof step_kv);
    float *q = malloc(sizeof(float) * TB * TQ * D);
    ikvt_fill_normal(&rng, q, (size_t)TB * TQ * D, 1.0f);
    void *dq = ikvt_dev_upload(q, sizeof(float) * TB * TQ * D), *dout = ikvt_dev_upload(NULL, sizeof(float) * TB * TQ * D);

    const trace_result all = run_trace(0, kv, dev_kv, dq, dout, 0);
    const trace_result on = run_trace(1, kv, dev_kv, dq, dout, all.session_bytes);
    const trace_result off = run_trace(2, kv, dev_kv, dq, dout, all.session_bytes);
    const size_t nout = sizeof(float) * TURNS * TB * TQ * D;
    const int same_on = memcmp(all.outs, on.outs, nout) == 0, same_off = memcmp(all.outs, off.outs, nout) == 0;
    printf("tier trace: B=%d sequences of %d tokens + %d turns x %d steps (timed: all but the first), %d layers, 8 kv-heads x 128, F16 pages; "
           "router budget 25%%, hybrid top-k 12.5%%; device capacity 30%% of the session's %.0f MB\n",
           TB, TCTX, TURNS, g_turn_steps, TL, all.session_bytes / 1e6);
    const trace_result *rows[3] = {&all, &on, &off};
    const char *names[3] = {"all resident", "tier policy, prefetch on", "tier policy, prefetch off"};
    for (int i = 0; i < 3; ++i) {
        const trace_result *r = rows[i];
        printf("  %-26s step %.3f ms (%.2fx)  first step of a turn %.3f ms  other steps %.3f ms  first turn %.1f ms  "
               "peak device %.0f MB (%.1f%%)  moved %.1f MB/step  host pages read %.1f/step  tier step %.1f us "
               "(other steps %.1f us)  plans %.1f%% of pages  outputs %s\n",
               names[i], r->step_ms, r->step_ms / all.step_ms, r->first_step_ms, r->rest_step_ms, r->start_turn_ms,
               r->peak_device / 1e6, 100.0 * r->peak_device / all.peak_device, r->moved_mb_per_step,
               r->host_reads_per_step, r->tier_step_us, r->tier_rest_us, 100.0 * r->plan_share,
               i == 0 ? "reference" : (i == 1 ? same_on : same_off) ? "identical" : "DIFFER");
    }
    assert_true(same_on && same_off);
    for (int i = 0; i < 3; ++i) free(rows[i]->outs);
    ikvt_rt.free_(dq);
    ikvt_rt.free_(dout);
    ikvt_rt.free_(dev_kv);
    free(kv), free(q);
}

static void test_moves(void **state) {
    (void)state;
    const char *which = getenv("IKVT_BENCH_ONLY");
    if (which && strcmp(which, "moves") != 0) skip();
    bench_tiers();
}

static void test_trace(void **state) {
    (void)state;
    const char *which = getenv("IKVT_BENCH_ONLY");
    if (which && strcmp(which, "trace") != 0) skip();
    bench_trace();
}

int main(int argc, char **argv) {
    if (argc > 1) setenv("IKVT_BENCH_ONLY", argv[1], 1);
    if (argc > 2) g_turn_steps = atoi(argv[2]) > 0 ? atoi(argv[2]) : g_turn_steps;
    ikvt_require_cuda_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moves),
        cmocka_unit_test(test_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
