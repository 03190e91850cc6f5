/* Tiered KV memory (issue 22): a CUDA pool with a host tier moves whole pages
 * to pinned host memory (ikv_seq_offload) and back (ikv_seq_fetch); decode
 * reads host-tier pages in place. Checked against an all-resident pool fed
 * the same tokens: every decode output byte for byte (dense, a plan, hybrid
 * top-k), every read, in every format, before and after offloading, across a
 * fork (shared pages stay), truncation into an offloaded page, appends after
 * it, eviction and fetching back; moves enqueued on a stream are ordered
 * before the decode that follows on it; a move the target tier has no room
 * for changes nothing; accounting returns to zero.
 * The automatic policy (ikv_pool_tier_step) runs a pool through prefill and
 * a multi-turn session against an all-resident pool. The benchmark is
 * tests/bench_gpu_tiers.c.
 * Skips without a CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { L = 2, H = 2, D = 128, P = 16, G = 4, NQ = H * G, B = 2 };
static const uint32_t kLens[B] = {520, 200};

static ikv_pool *make_pool(ikv_format f, uint64_t host_capacity, uint64_t capacity) {
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = L, .n_kv_heads = H,
                                                          .head_dim = D, .page_size = P, .capacity_bytes = capacity,
                                                          .default_format = f});
    c.host_capacity_bytes = host_capacity;
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    return pool;
}

/* Bytes of one page of these pools in format f (asked of a small pool). */
static uint64_t page_bytes_of(ikv_format f) {
    ikv_pool *probe = make_pool(f, 0, 1u << 20);
    const uint64_t page = ikv_pool_page_bytes(probe, f);
    ikv_pool_destroy(probe);
    return page;
}

/* Both pools get the same n tokens (all layers) for sequence a / b. */
static void append_both(ikv_pool *pa, ikv_seq_id a, ikv_pool *pb, ikv_seq_id b, uint32_t n, ikvt_rng *rng) {
    const size_t elems = (size_t)L * n * H * D;
    float *k = malloc(elems * sizeof *k), *v = malloc(elems * sizeof *v);
    ikvt_fill_normal(rng, k, elems, 1.0f);
    ikvt_fill_normal(rng, v, elems, 1.0f);
    ikv_append ap = ikv_append_default(pa, n);
    ap.layer = IKV_ALL_LAYERS;
    ap.k = k;
    ap.v = v;
    IKVT_OK(ikv_pool_append(pa, a, &ap));
    IKVT_OK(ikv_pool_append(pb, b, &ap));
    free(k);
    free(v);
}

typedef struct decode_bufs {
    void *q, *out;
    float *lse;
} decode_bufs;

/* Device buffers of a step over B sequences with queries q ([B][NQ][D]). */
static decode_bufs upload_bufs(const float *q) {
    const size_t n = sizeof(float) * B * NQ * D;
    return (decode_bufs){ikvt_dev_upload(q, n), ikvt_dev_upload(NULL, n), ikvt_dev_upload(NULL, sizeof(float) * B * NQ)};
}
static void free_bufs(decode_bufs *d) {
    ikvt_rt.free_(d->q);
    ikvt_rt.free_(d->out);
    ikvt_rt.free_(d->lse);
}

/* One step over both sequences at layer 1; returns the output and lse on the host. */
static void decode_host(ikv_decoder *dec, ikv_pool *pool, const ikv_seq_id *seqs, const ikv_plan *const *plans,
                        int variant, const decode_bufs *d, void *stream, float *out, float *lse) {
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 1;
    a.n_seqs = B;
    a.seqs = seqs;
    a.plans = variant == 1 ? plans : NULL;
    a.n_q_heads = NQ;
    a.q = d->q;
    a.out = d->out;
    a.lse = d->lse;
    a.stream = stream;
    if (variant == 2) {
        a.topk_token_budget = 96;
        a.topk_score = IKV_TOPK_SCORE_HYBRID;
    }
    IKVT_OK(ikv_decode(dec, pool, &a));
    assert_int_equal(ikvt_rt.sync_(), 0);
    assert_int_equal(ikvt_rt.memcpy_(out, d->out, sizeof(float) * B * NQ * D, IKVT_D2H), 0);
    assert_int_equal(ikvt_rt.memcpy_(lse, d->lse, sizeof(float) * B * NQ, IKVT_D2H), 0);
}

/* Every variant's output and lse equal, byte for byte, and every layer's stored values. */
static void expect_same(ikv_decoder *dec, ikv_pool *pa, const ikv_seq_id *sa, ikv_pool *pb, const ikv_seq_id *sb,
                        const ikv_plan *const *plans, const decode_bufs *d, void *stream, const char *when) {
    float o1[B * NQ * D], o2[B * NQ * D], l1[B * NQ], l2[B * NQ];
    for (int variant = 0; variant < 3; ++variant) {
        decode_host(dec, pa, sa, plans, variant, d, NULL, o1, l1);
        decode_host(dec, pb, sb, plans, variant, d, stream, o2, l2);
        if (memcmp(o1, o2, sizeof o1) != 0 || memcmp(l1, l2, sizeof l1) != 0) {
            print_error("%s, variant %d: the tiered pool's decode differs from the all-resident pool's\n", when,
                        variant);
            fail();
        }
    }
    for (uint32_t b = 0; b < B; ++b) {
        uint32_t na = 0, nb = 0;
        IKVT_OK(ikv_seq_length(pa, sa[b], &na));
        IKVT_OK(ikv_seq_length(pb, sb[b], &nb));
        assert_int_equal(na, nb);
        const size_t elems = (size_t)na * H * D + 1;
        float *k1 = malloc(elems * 4), *v1 = malloc(elems * 4), *k2 = malloc(elems * 4), *v2 = malloc(elems * 4);
        for (uint32_t l = 0; l < L; ++l)
            for (uint32_t t0 = 0; t0 < na; t0 += P) { /* page by page: evicted pages cannot be read */
                const uint32_t t1 = t0 + P < na ? t0 + P : na;
                int evicted = 0;
                IKVT_OK(ikv_seq_is_evicted(pa, sa[b], t0, &evicted));
                if (evicted) continue;
                IKVT_OK(ikv_seq_read(pa, sa[b], l, t0, t1, k1, v1));
                IKVT_OK(ikv_seq_read(pb, sb[b], l, t0, t1, k2, v2));
                assert_memory_equal(k1, k2, 4 * (size_t)(t1 - t0) * H * D);
                assert_memory_equal(v1, v2, 4 * (size_t)(t1 - t0) * H * D);
            }
        free(k1), free(v1), free(k2), free(v2);
    }
}

static uint32_t host_pages_of(const ikv_pool *pool, ikv_seq_id seq, uint32_t n_pages) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < n_pages; ++p) {
        int on_host = 0;
        if (ikv_seq_page_tier(pool, seq, p, &on_host) == IKV_OK) n += (uint32_t)on_host;
    }
    return n;
}

static void test_tiered_pool_equals_all_resident(void **state) {
    (void)state;
    ikvt_rng rng = {2200};
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    float q[B * NQ * D];
    ikvt_fill_normal(&rng, q, B * NQ * D, 1.5f);
    decode_bufs d = upload_bufs(q);
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    static const ikv_token_range r0[] = {{0, 40}, {130, 300}, {480, 520}}, r1[] = {{16, 64}, {150, 200}};
    ikv_plan *plans[B];
    IKVT_OK(ikv_plan_from_ranges(r0, 3, kLens[0], P, IKV_FMT_F16, &plans[0]));
    IKVT_OK(ikv_plan_from_ranges(r1, 2, kLens[1], P, IKV_FMT_F16, &plans[1]));
    const ikv_plan *const *cplans = (const ikv_plan *const *)plans;

    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool *pa = make_pool((ikv_format)f, 0, 64u << 20), *pb = make_pool((ikv_format)f, 64u << 20, 64u << 20);
        const uint64_t page = ikv_pool_page_bytes(pb, (ikv_format)f);
        ikv_seq_id sa[B], sb[B];
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_create(pa, &sa[b]));
            IKVT_OK(ikv_seq_create(pb, &sb[b]));
            append_both(pa, sa[b], pb, sb[b], kLens[b], &rng);
        }
        expect_same(dec, pa, sa, pb, sb, cplans, &d, NULL, "all resident");
        const ikv_pool_stats before = ikvt_pool_stats(pb);

        /* offload on a stream; the decode right after on the same stream reads the moved pages */
        uint32_t moved = 0;
        IKVT_OK(ikv_seq_offload(pb, sb[0], 0, 320, stream, &moved));
        assert_int_equal(moved, 20);
        IKVT_OK(ikv_seq_offload(pb, sb[1], 100, 200, stream, &moved)); /* pages 6..11; page 12 is partial */
        assert_int_equal(moved, 6);
        expect_same(dec, pa, sa, pb, sb, cplans, &d, stream, "after offloading, decoded on the moves' stream");
        assert_int_equal(host_pages_of(pb, sb[0], 33), 20);
        int on_host = 0;
        IKVT_OK(ikv_seq_page_tier(pb, sb[1], 12, &on_host));
        assert_int_equal(on_host, 0);
        ikv_pool_stats st = ikvt_pool_stats(pb);
        assert_true(st.host_pages == 26 && st.host_used_bytes == 26 * page);
        assert_true(st.used_bytes == before.used_bytes - 26 * page && st.pages_used == before.pages_used);
        assert_true(st.bytes_offloaded == 26 * page && st.bytes_fetched == 0);
        IKVT_OK(ikv_seq_offload(pb, sb[0], 0, 320, NULL, &moved)); /* already there: nothing moves */
        assert_int_equal(moved, 0);

        /* a fork shares the pages: offloading through it moves none of them */
        ikv_seq_id fa, fb;
        IKVT_OK(ikv_seq_fork(pa, sa[0], &fa));
        IKVT_OK(ikv_seq_fork(pb, sb[0], &fb));
        IKVT_OK(ikv_seq_offload(pb, fb, 320, 512, NULL, &moved));
        assert_int_equal(moved, 0);
        /* truncate into an offloaded page (shared with the fork: copied), then append */
        IKVT_OK(ikv_seq_truncate(pa, sa[0], 250));
        IKVT_OK(ikv_seq_truncate(pb, sb[0], 250)); /* 270 tokens: page 16 of 14 tokens */
        append_both(pa, sa[0], pb, sb[0], 23, &rng);
        expect_same(dec, pa, sa, pb, sb, cplans, &d, NULL, "after truncate and append");
        IKVT_OK(ikv_seq_destroy(pa, fa));
        IKVT_OK(ikv_seq_destroy(pb, fb));
        /* evict an offloaded range, then bring everything back */
        IKVT_OK(ikv_seq_evict(pa, sa[0], 32, 96));
        IKVT_OK(ikv_seq_evict(pb, sb[0], 32, 96));
        expect_same(dec, pa, sa, pb, sb, cplans, &d, NULL, "after evicting offloaded pages");
        IKVT_OK(ikv_seq_fetch(pb, sb[0], 0, 293, stream, &moved));
        assert_int_equal(moved, 12); /* pages 0-1 and 6-15 (2-5 evicted, 16+ on the device) */
        IKVT_OK(ikv_seq_fetch(pb, sb[1], 0, 200, stream, &moved));
        assert_int_equal(moved, 6);
        expect_same(dec, pa, sa, pb, sb, cplans, &d, stream, "after fetching back");
        st = ikvt_pool_stats(pb);
        assert_true(st.host_pages == 0 && st.host_used_bytes == 0 && st.bytes_fetched == 18 * page);
        /* the pool is destroyed with pages in both tiers */
        IKVT_OK(ikv_seq_offload(pb, sb[1], 0, 200, NULL, &moved));
        for (uint32_t b = 0; b < B; ++b) IKVT_OK(ikv_seq_destroy(pa, sa[b]));
        IKVT_OK(ikv_seq_destroy(pb, sb[0]));
        st = ikvt_pool_stats(pb);
        assert_true(moved == 12 && st.host_pages == 12 && st.pages_used == 13); /* 12 full pages and the partial one */
        IKVT_OK(ikv_seq_destroy(pb, sb[1]));
        st = ikvt_pool_stats(pb);
        assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.host_used_bytes == 0 && st.host_pages == 0);
        ikv_pool_destroy(pa);
        ikv_pool_destroy(pb);
    }
    for (uint32_t b = 0; b < B; ++b) ikv_plan_destroy(plans[b]);
    assert_int_equal(ikvt_rt.stream_destroy_(stream), 0);
    free_bufs(&d);
    ikv_decoder_destroy(dec);
}

/* No room in the target tier: refused, nothing moved, nothing counted. */
static void test_moves_without_room_change_nothing(void **state) {
    (void)state;
    ikvt_rng rng = {2300};
    const uint64_t page = page_bytes_of(IKV_FMT_F16);
    ikv_pool *pb = make_pool(IKV_FMT_F16, 2 * page, 6 * page), *pa = make_pool(IKV_FMT_F16, 0, 16 * page);
    ikv_seq_id a, b;
    IKVT_OK(ikv_seq_create(pa, &a));
    IKVT_OK(ikv_seq_create(pb, &b));
    append_both(pa, a, pb, b, 4 * P, &rng);
    const ikv_pool_stats before = ikvt_pool_stats(pb);
    uint32_t moved = 7;
    IKVT_EXPECT_STATUS(ikv_seq_offload(pb, b, 0, 3 * P, NULL, &moved), IKV_E_NOMEM, "host_capacity_bytes");
    assert_int_equal(moved, 7); /* an error leaves it as it was */
    ikv_pool_stats after = ikvt_pool_stats(pb);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(host_pages_of(pb, b, 4), 0);
    IKVT_OK(ikv_seq_offload(pb, b, 0, 2 * P, NULL, &moved));
    assert_int_equal(moved, 2);
    /* fill the device, then a fetch that does not fit is refused */
    append_both(pa, a, pb, b, 4 * P, &rng); /* 8 pages: 6 on the device, 2 on the host */
    const ikv_pool_stats full = ikvt_pool_stats(pb);
    IKVT_EXPECT_STATUS(ikv_seq_fetch(pb, b, 0, 2 * P, NULL, &moved), IKV_E_NOMEM, "of capacity_bytes");
    after = ikvt_pool_stats(pb);
    assert_memory_equal(&full, &after, sizeof full);
    assert_int_equal(host_pages_of(pb, b, 8), 2);
    /* bad arguments */
    IKVT_EXPECT_STATUS(ikv_seq_offload(pb, b, 5, 4, NULL, NULL), IKV_E_RANGE, "ikv_seq_offload");
    IKVT_EXPECT_STATUS(ikv_seq_fetch(pb, b, 0, 9 * P, NULL, NULL), IKV_E_RANGE, "ikv_seq_fetch");
    IKVT_EXPECT_STATUS(ikv_seq_offload(pb, 999, 0, 1, NULL, NULL), IKV_E_NOT_FOUND, "999");
    IKVT_EXPECT_STATUS(ikv_seq_offload(pa, a, 0, P, NULL, NULL), IKV_E_UNSUPPORTED, "host tier");
    IKVT_OK(ikv_seq_offload(pb, b, 3 * P, 3 * P, NULL, &moved)); /* an empty range moves nothing */
    assert_int_equal(moved, 0);
    /* a stream capturing a graph is refused, nothing moved */
    void *cs = NULL, *graph = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&cs), 0);
    assert_int_equal(ikvt_rt.begin_capture_(cs, IKVT_CAPTURE_RELAXED), 0);
    const ikv_pool_stats pre = ikvt_pool_stats(pb);
    IKVT_EXPECT_STATUS(ikv_seq_offload(pb, b, 2 * P, 4 * P, cs, &moved), IKV_E_INVALID, "capturing");
    assert_int_equal(ikvt_rt.end_capture_(cs, &graph), 0);
    if (graph) ikvt_rt.graph_destroy_(graph);
    assert_int_equal(ikvt_rt.stream_destroy_(cs), 0);
    after = ikvt_pool_stats(pb);
    assert_memory_equal(&pre, &after, sizeof pre);
    ikv_pool_destroy(pa);
    ikv_pool_destroy(pb);
}

/* Moves back and forth while earlier copies still run reuse the pages those
 * copies free: after the first round, neither tier's slab memory grows
 * (until 2026-11-25 a batch of moved pages found not yet copied lost its
 * page list, and both tiers leaked the pages of every such batch). A 1 GiB
 * memset queued ahead of each round keeps the copies in flight when the
 * next allocation looks, whatever the device's speed. */
static void test_moves_in_flight_reuse_memory(void **state) {
    (void)state;
    ikvt_rng rng = {4711};
    const uint64_t page = page_bytes_of(IKV_FMT_F16);
    enum { N = 100 };
    ikv_pool *pool = make_pool(IKV_FMT_F16, 128 * page, 128 * page), *ref = make_pool(IKV_FMT_F16, 0, 128 * page);
    ikv_seq_id s, r;
    IKVT_OK(ikv_seq_create(pool, &s));
    IKVT_OK(ikv_seq_create(ref, &r));
    append_both(pool, s, ref, r, N * P, &rng);
    ikv_pool_stats first = ikvt_pool_stats(pool);
    void *busy = NULL;
    assert_int_equal(ikvt_rt.malloc_(&busy, (size_t)1 << 30), 0);
    for (int round = 0; round < 8; ++round) {
        uint32_t moved = 0;
        assert_int_equal(ikvt_rt.memset_async_(busy, round, (size_t)1 << 30, NULL), 0);
        IKVT_OK(ikv_seq_offload(pool, s, 0, N * P, NULL, &moved));
        assert_int_equal(moved, N);
        IKVT_OK(ikv_seq_fetch(pool, s, 0, N * P, NULL, &moved)); /* no wait: the offload's copies may run */
        assert_int_equal(moved, N);
        if (round == 0) {
            assert_int_equal(ikvt_rt.sync_(), 0);
            first = ikvt_pool_stats(pool);
        }
    }
    assert_int_equal(ikvt_rt.sync_(), 0);
    ikvt_rt.free_(busy);
    const ikv_pool_stats last = ikvt_pool_stats(pool);
    assert_true(last.reserved_bytes == first.reserved_bytes);
    assert_true(last.host_reserved_bytes == first.host_reserved_bytes);
    assert_true(first.host_reserved_bytes >= N * page && last.host_used_bytes == 0);
    /* and the pages hold what they held */
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    float q[B * NQ * D];
    ikvt_fill_normal(&rng, q, B * NQ * D, 1.5f);
    decode_bufs d = upload_bufs(q);
    const ikv_seq_id sa[B] = {s, s}, sb[B] = {r, r};
    expect_same(dec, ref, sb, pool, sa, NULL, &d, NULL, "after moving back and forth");
    free_bufs(&d);
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
    ikv_pool_destroy(ref);
}

/* ------------------------------------------------- the automatic tier policy */

static ikv_tier_step_report tier_step(ikv_pool *pool, const ikv_seq_id *seqs, const ikv_plan *const *plans,
                                      uint32_t n, void *stream) {
    ikv_tier_step_report r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    IKVT_OK(ikv_pool_tier_step(pool, seqs, plans, n, stream, &r));
    return r;
}

/* Pages of `plan` below `complete` (whole pages) that are in the host tier. */
static uint32_t plan_pages_on_host(const ikv_pool *pool, ikv_seq_id seq, const ikv_plan *plan, uint32_t complete) {
    const ikv_plan_page *pp = NULL;
    size_t np = 0;
    IKVT_OK(ikv_plan_pages(plan, &pp, &np));
    uint32_t n = 0;
    for (size_t i = 0; i < np; ++i) {
        int on_host = 0;
        if (pp[i].page < complete && (i == 0 || pp[i - 1].page != pp[i].page)) {
            IKVT_OK(ikv_seq_page_tier(pool, seq, pp[i].page, &on_host));
            n += (uint32_t)on_host;
        }
    }
    return n;
}

/* A pool whose device holds 78% of the session, run by the policy
 * through prefill and a multi-turn session in which the attended document
 * changes and returns: every decode equals an all-resident pool's byte for
 * byte, the device never exceeds its capacity, the plan's pages are on the
 * device before each step's decode (no host page read), and idle pages went
 * to the host; with IKV_TIER_NO_PREFETCH the plan's host pages stay there
 * and the decodes read them over the bus, still exact. */
static void test_tier_policy_session(void **state) {
    (void)state;
    ikvt_rng rng = {2400};
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    float q[B * NQ * D], out[B * NQ * D], lse[B * NQ];
    ikvt_fill_normal(&rng, q, B * NQ * D, 1.5f);
    decode_bufs d = upload_bufs(q);
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    /* turn plans: documents A, B, then A again (sequence 1 reads its own) */
    static const ikv_token_range turns0[3][2] = {{{16, 112}, {480, 520}}, {{208, 336}, {480, 520}},
                                                 {{16, 112}, {480, 520}}};
    static const ikv_token_range turns1[3][2] = {{{0, 48}, {176, 200}}, {{64, 128}, {176, 200}},
                                                 {{0, 48}, {176, 200}}};
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        const uint64_t page = page_bytes_of((ikv_format)f);
        ikv_pool *pa = make_pool((ikv_format)f, 0, 64u << 20), *pb = make_pool((ikv_format)f, 64 * page, 36 * page);
        ikv_seq_id sa[B], sb[B];
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_create(pa, &sa[b]));
            IKVT_OK(ikv_seq_create(pb, &sb[b]));
        }
        /* no policy yet: a step is refused */
        IKVT_EXPECT_STATUS(ikv_pool_tier_step(pb, sb, NULL, B, NULL, NULL), IKV_E_STATE, "ikv_pool_set_tier_policy");
        ikv_tier_policy policy;
        memset(&policy, 0, sizeof policy);
        policy.struct_size = sizeof policy;
        policy.idle_steps = 2; /* high 0.9, low 0.75 of 36 pages */
        IKVT_OK(ikv_pool_set_tier_policy(pb, &policy));
        /* prefill in 64-token chunks; the steps between them relieve the pressure */
        uint64_t step = 0;
        for (uint32_t done = 0; done < kLens[0]; done += 64)
            for (uint32_t b = 0; b < B; ++b) {
                if (done >= kLens[b]) continue;
                const uint32_t n = kLens[b] - done < 64 ? kLens[b] - done : 64;
                append_both(pa, sa[b], pb, sb[b], n, &rng);
                const ikv_tier_step_report r = tier_step(pb, NULL, NULL, 0, stream);
                assert_int_equal(r.step, ++step);
                assert_true(ikvt_pool_stats(pb).used_bytes <= (uint64_t)(0.9 * 36 * page));
            }
        ikv_pool_stats st = ikvt_pool_stats(pb);
        assert_true(st.host_pages >= 46 - 36 && st.used_bytes <= 36 * page);

        for (int turn = 0; turn < 3; ++turn) {
            ikv_plan *plans[B];
            uint32_t lens[B];
            for (uint32_t b = 0; b < B; ++b) {
                IKVT_OK(ikv_seq_length(pb, sb[b], &lens[b]));
                IKVT_OK(ikv_plan_from_ranges(b == 0 ? turns0[turn] : turns1[turn], 2, lens[b], P, IKV_FMT_F16,
                                             &plans[b]));
            }
            const ikv_plan *const *cplans = (const ikv_plan *const *)plans;
            for (int s = 0; s < 3; ++s) {
                const ikv_tier_step_report r = tier_step(pb, sb, cplans, B, stream);
                assert_int_equal(r.step, ++step);
                assert_int_equal(r.pages_on_host, 0);
                for (uint32_t b = 0; b < B; ++b) assert_int_equal(plan_pages_on_host(pb, sb[b], plans[b], 512), 0);
                st = ikvt_pool_stats(pb);
                assert_true(st.used_bytes <= 36 * page);
                /* the plan's decode reads no host page; its output is the all-resident pool's */
                const uint64_t reads = st.host_page_reads;
                float ref[B * NQ * D], rlse[B * NQ];
                decode_host(dec, pb, sb, cplans, 1, &d, stream, out, lse);
                decode_host(dec, pa, sa, cplans, 1, &d, NULL, ref, rlse);
                assert_memory_equal(out, ref, sizeof out);
                assert_memory_equal(lse, rlse, sizeof lse);
                assert_true(ikvt_pool_stats(pb).host_page_reads == reads);
                append_both(pa, sa[0], pb, sb[0], 1, &rng);
                append_both(pa, sa[1], pb, sb[1], 1, &rng);
            }
            /* dense and top-k read host pages over the bus: still exact */
            expect_same(dec, pa, sa, pb, sb, cplans, &d, stream, "under the tier policy");
            for (uint32_t b = 0; b < B; ++b) ikv_plan_destroy(plans[b]);
        }
        st = ikvt_pool_stats(pb);
        assert_true(st.bytes_offloaded > 0 && st.bytes_fetched > 0 && st.host_pages > 0);

        /* without prefetch the plan's host pages stay there and are read over the bus */
        policy.flags = IKV_TIER_NO_PREFETCH;
        IKVT_OK(ikv_pool_set_tier_policy(pb, &policy));
        static const ikv_token_range far0[] = {{128, 208}}, far1[] = {{128, 176}}; /* never planned: long idle */
        ikv_plan *plans[B];
        uint32_t lens[B];
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_length(pb, sb[b], &lens[b]));
            IKVT_OK(ikv_plan_from_ranges(b == 0 ? far0 : far1, 1, lens[b], P, IKV_FMT_F16, &plans[b]));
        }
        const ikv_plan *const *cplans = (const ikv_plan *const *)plans;
        uint32_t host_before = 0;
        for (uint32_t b = 0; b < B; ++b) host_before += plan_pages_on_host(pb, sb[b], plans[b], 512);
        assert_true(host_before > 0);
        const ikv_tier_step_report r = tier_step(pb, sb, cplans, B, stream);
        assert_int_equal(r.pages_fetched, 0);
        assert_int_equal(r.pages_on_host, host_before);
        const uint64_t reads = ikvt_pool_stats(pb).host_page_reads;
        float ref[B * NQ * D], rlse[B * NQ];
        decode_host(dec, pb, sb, cplans, 1, &d, stream, out, lse);
        decode_host(dec, pa, sa, cplans, 1, &d, NULL, ref, rlse);
        assert_memory_equal(out, ref, sizeof out);
        assert_true(ikvt_pool_stats(pb).host_page_reads == reads + host_before);

        /* a step's offloads run on the pool's own copy stream: a decode enqueued right after it on the
           engine's stream, reading the pages just offloaded over the bus, reads them after their copies */
        ikv_tier_policy low = policy;
        low.idle_steps = 1;
        low.device_high = 0.25f;
        low.device_low = 0.05f;
        IKVT_OK(ikv_pool_set_tier_policy(pb, &low));
        const uint64_t host_pages_before = ikvt_pool_stats(pb).host_pages;
        const ikv_tier_step_report ro = tier_step(pb, sb, cplans, B, stream);
        assert_true(ro.pages_offloaded > 0);
        assert_int_equal(ikvt_pool_stats(pb).host_pages, host_pages_before + ro.pages_offloaded);
        expect_same(dec, pa, sa, pb, sb, cplans, &d, stream, "right after a step's offloads");
        IKVT_OK(ikv_pool_set_tier_policy(pb, &policy));

        /* a refused step (bad plan, unknown sequence, capturing stream) changes nothing, not even the step count */
        ikv_plan *odd = NULL;
        static const ikv_token_range r8[] = {{0, 8}};
        IKVT_OK(ikv_plan_from_ranges(r8, 1, 64, 8, IKV_FMT_F16, &odd));
        const ikv_plan *mixed[B] = {plans[0], odd};
        const ikv_pool_stats pre = ikvt_pool_stats(pb);
        IKVT_EXPECT_STATUS(ikv_pool_tier_step(pb, sb, mixed, B, stream, NULL), IKV_E_INVALID, "page_size");
        const ikv_seq_id missing[1] = {999};
        IKVT_EXPECT_STATUS(ikv_pool_tier_step(pb, missing, NULL, 1, stream, NULL), IKV_E_NOT_FOUND, "999");
        void *cs = NULL, *graph = NULL; /* a stream capturing a graph */
        assert_int_equal(ikvt_rt.stream_create_(&cs), 0);
        assert_int_equal(ikvt_rt.begin_capture_(cs, IKVT_CAPTURE_RELAXED), 0);
        IKVT_EXPECT_STATUS(ikv_pool_tier_step(pb, sb, cplans, B, cs, NULL), IKV_E_INVALID, "capturing");
        assert_int_equal(ikvt_rt.end_capture_(cs, &graph), 0);
        if (graph) ikvt_rt.graph_destroy_(graph);
        assert_int_equal(ikvt_rt.stream_destroy_(cs), 0);
        assert_int_equal(ikvt_rt.sync_(), 0);
        st = ikvt_pool_stats(pb);
        assert_memory_equal(&pre, &st, sizeof pre);
        assert_int_equal(tier_step(pb, NULL, NULL, 0, stream).step, ro.step + 1);
        ikv_plan_destroy(odd);
        for (uint32_t b = 0; b < B; ++b) ikv_plan_destroy(plans[b]);
        /* turned off: a step is refused again */
        IKVT_OK(ikv_pool_set_tier_policy(pb, NULL));
        IKVT_EXPECT_STATUS(ikv_pool_tier_step(pb, NULL, NULL, 0, NULL, NULL), IKV_E_STATE, "tier policy");
        for (uint32_t b = 0; b < B; ++b) IKVT_OK(ikv_seq_destroy(pb, sb[b]));
        st = ikvt_pool_stats(pb);
        assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.host_used_bytes == 0 && st.host_pages == 0);
        ikv_pool_destroy(pa);
        ikv_pool_destroy(pb);
    }
    assert_int_equal(ikvt_rt.stream_destroy_(stream), 0);
    free_bufs(&d);
    ikv_decoder_destroy(dec);
}

int main(void) {
    ikvt_require_cuda_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiered_pool_equals_all_resident),
        cmocka_unit_test(test_moves_without_room_change_nothing),
        cmocka_unit_test(test_moves_in_flight_reuse_memory),
        cmocka_unit_test(test_tier_policy_session),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
