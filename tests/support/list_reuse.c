/* See list_reuse.h. The expectations are exact: which calls build their
 * lists and which reuse them (ikv_decoder_get_stats), and bitwise equality
 * of the output and LSE with a decoder that has never seen the pool. A missed
 * invalidation shows as a mismatch here (stale lists read other pages or
 * bounds), a missed reuse as a count. */
#include "list_reuse.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { NL = 2, H = 2, D = 64, P = 16, G = 2, HQ = H * G };

typedef struct {
    ikv_backend backend;
    ikv_pool *pool;
    ikv_decoder *dec;  /* the decoder under test: it keeps lists across calls */
    ikvt_rng rng;
} ctx_t;

static ikv_pool *new_pool(ikv_backend backend) {
    return ikvt_make_pool((ikvt_pool_spec){.backend = backend, .n_layers = NL, .n_kv_heads = H, .head_dim = D,
                                           .page_size = P, .capacity_bytes = 32u << 20, .default_format = IKV_FMT_INT8});
}

static ikv_decoder *new_decoder(void) {
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = 2; /* both decoders split work the same way: equal outputs are bitwise */
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    return dec;
}

/* n tokens of random K/V appended to `layer` (or IKV_ALL_LAYERS) of seq. */
static void append(ctx_t *c, ikv_seq_id seq, uint32_t layer, uint32_t n) {
    const size_t per = (size_t)n * H * D, total = per * (layer == IKV_ALL_LAYERS ? NL : 1);
    float *k = malloc(4 * total), *v = malloc(4 * total);
    ikvt_fill_normal(&c->rng, k, total, 1.0f);
    ikvt_fill_normal(&c->rng, v, total, 1.0f);
    ikv_append a = ikv_append_default(c->pool, n);
    a.layer = layer;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(c->pool, seq, &a));
    free(k), free(v);
}

/* One call on dec, out/lse on the host (staged through device memory on a CUDA pool). */
static void decode_host(ikv_decoder *dec, ikv_pool *pool, ikv_backend backend, ikv_decode_args a, float *out,
                        float *lse) {
    const size_t n_out = (size_t)a.n_seqs * HQ * D, n_lse = (size_t)a.n_seqs * HQ;
    if (backend == IKV_BACKEND_CPU) {
        a.out = out;
        a.lse = lse;
        IKVT_OK(ikv_decode(dec, pool, &a));
        return;
    }
    void *dq = ikvt_dev_upload(a.q, 4 * n_out), *dout = ikvt_dev_upload(NULL, 4 * n_out),
         *dlse = ikvt_dev_upload(NULL, 4 * n_lse);
    a.q = dq;
    a.out = dout;
    a.lse = dlse;
    IKVT_OK(ikv_decode(dec, pool, &a));
    assert_int_equal(ikvt_rt.sync_(), 0);
    assert_int_equal(ikvt_rt.memcpy_(out, dout, 4 * n_out, IKVT_D2H), 0);
    assert_int_equal(ikvt_rt.memcpy_(lse, dlse, 4 * n_lse, IKVT_D2H), 0);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout), ikvt_rt.free_(dlse);
}

static ikv_decoder_stats stats(const ikv_decoder *dec) {
    ikv_decoder_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    IKVT_OK(ikv_decoder_get_stats(dec, &s));
    return s;
}

/* Decode seqs (plans may be NULL) at `layer` with a fresh query on c->dec and
 * on a fresh decoder: the call must have reused its lists iff expect_reuse,
 * and both outputs must be identical. */
static void step(ctx_t *c, const ikv_seq_id *seqs, const ikv_plan *const *plans, uint32_t B, uint32_t layer,
                 uint32_t topk, int expect_reuse, const char *what) {
    const size_t n_out = (size_t)B * HQ * D, n_lse = (size_t)B * HQ;
    float *q = malloc(4 * n_out), *out = malloc(4 * n_out), *lse = malloc(4 * n_lse);
    float *out_fresh = malloc(4 * n_out), *lse_fresh = malloc(4 * n_lse);
    ikvt_fill_normal(&c->rng, q, n_out, 1.0f);
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = layer;
    a.n_seqs = B;
    a.seqs = seqs;
    a.plans = plans;
    a.n_q_heads = HQ;
    a.q = q;
    a.topk_token_budget = topk;
    const ikv_decoder_stats before = stats(c->dec);
    decode_host(c->dec, c->pool, c->backend, a, out, lse);
    const ikv_decoder_stats after = stats(c->dec);
    if (after.steps != before.steps + 1 || after.lists_reused != before.lists_reused + (expect_reuse ? 1 : 0) ||
        after.lists_built != before.lists_built + (expect_reuse ? 0 : 1))
        fail_msg("%s: expected the call to %s its page lists (built %llu -> %llu, reused %llu -> %llu)", what,
                 expect_reuse ? "reuse" : "build", (unsigned long long)before.lists_built,
                 (unsigned long long)after.lists_built, (unsigned long long)before.lists_reused,
                 (unsigned long long)after.lists_reused);
    ikv_decoder *fresh = new_decoder();
    decode_host(fresh, c->pool, c->backend, a, out_fresh, lse_fresh);
    ikv_decoder_destroy(fresh);
    if (memcmp(out, out_fresh, 4 * n_out) != 0 || memcmp(lse, lse_fresh, 4 * n_lse) != 0)
        fail_msg("%s: the output differs from a fresh decoder's", what);
    free(q), free(out), free(lse), free(out_fresh), free(lse_fresh);
}

void ikvt_list_reuse_scenario(ikv_backend backend) {
    ctx_t c = {backend, new_pool(backend), new_decoder(), {0x11575}};
    ikv_seq_id s[2], pair[2];
    for (int b = 0; b < 2; ++b) IKVT_OK(ikv_seq_create(c.pool, &s[b]));
    append(&c, s[0], IKV_ALL_LAYERS, 46); /* pages 0-2, 14 tokens in the tail */
    append(&c, s[1], IKV_ALL_LAYERS, 70);
    const ikv_token_range ranges[2] = {{0, 9}, {20, 40}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, 2, 46, P, IKV_FMT_F16, &plan));
    const ikv_plan *plans[2] = {plan, NULL};
    memcpy(pair, s, sizeof pair);

    /* One engine step: every layer, the same batch and plans. */
    step(&c, pair, plans, 2, 0, 0, 0, "first call");
    step(&c, pair, plans, 2, 1, 0, 1, "next layer");
    step(&c, pair, plans, 2, 1, 24, 1, "top-k over the same lists");
    step(&c, pair, NULL, 2, 1, 0, 0, "no plans");
    step(&c, pair, plans, 2, 1, 0, 0, "the plans again");

    /* A rejected call changes nothing. */
    ikv_decode_args bad = ikv_decode_args_default();
    bad.n_seqs = 2;
    bad.seqs = pair;
    bad.n_q_heads = HQ + 1;
    float dummy[1] = {0};
    bad.q = dummy;
    bad.out = dummy;
    IKVT_EXPECT_STATUS(ikv_decode(c.dec, c.pool, &bad), IKV_E_INVALID, "n_q_heads");
    step(&c, pair, plans, 2, 0, 0, 1, "after a rejected call");

    /* Per-layer appends (dense sequence s[1]: every new token is read).
     * Inside the tail page the layer's length changes (build) and the next
     * layer catches up to it (reuse). */
    append(&c, s[1], IKV_ALL_LAYERS, 9); /* 79 tokens */
    step(&c, pair, plans, 2, 0, 0, 0, "both layers longer");
    append(&c, s[1], 0, 1);
    step(&c, pair, plans, 2, 0, 0, 0, "layer 0 one token longer");
    append(&c, s[1], 1, 1);
    step(&c, pair, plans, 2, 1, 0, 1, "layer 1 caught up");
    /* 80 -> 81 tokens: layer 0's append opens page 5 (a block table
     * change); layer 1's token lands in it and is read through the reused lists. */
    append(&c, s[1], 0, 1);
    step(&c, pair, plans, 2, 0, 0, 0, "new page at layer 0");
    append(&c, s[1], 1, 1);
    step(&c, pair, plans, 2, 1, 0, 1, "layer 1 in the new page");

    /* Every other block table change. */
    IKVT_OK(ikv_seq_evict(c.pool, s[1], 16, 32));
    step(&c, pair, plans, 2, 1, 0, 0, "eviction");
    step(&c, pair, plans, 2, 0, 0, 1, "after the eviction");
    IKVT_OK(ikv_seq_evict(c.pool, s[1], 16, 32)); /* already evicted: "does nothing" (the header) */
    step(&c, pair, plans, 2, 1, 0, 1, "after evicting evicted pages again");
    IKVT_OK(ikv_seq_set_page_format(c.pool, s[0], 1, IKV_FMT_INT4));
    step(&c, pair, plans, 2, 0, 0, 0, "page format change");
    IKVT_OK(ikv_seq_apply_plan_formats(c.pool, s[0], plan)); /* the plan's F16 for every full page */
    step(&c, pair, plans, 2, 0, 24, 0, "plan formats applied");
    IKVT_OK(ikv_seq_truncate(c.pool, s[0], 3));
    step(&c, pair, plans, 2, 1, 0, 0, "truncation");

    /* A fork shares the block table but is another sequence. */
    ikv_seq_id child = 0;
    IKVT_OK(ikv_seq_fork(c.pool, s[0], &child));
    const ikv_seq_id forked[2] = {child, s[1]};
    step(&c, forked, plans, 2, 1, 0, 0, "the fork");
    step(&c, forked, plans, 2, 0, 0, 1, "the fork again");
    /* Layer 1 only: the shared tail is copied (a block table change) while
     * layer 0's length stays: its call must build, not read the parent's page. */
    append(&c, child, 1, 1);
    step(&c, forked, plans, 2, 0, 0, 0, "copy-on-write of the fork's tail");
    step(&c, pair, plans, 2, 1, 0, 0, "back to the parent");

    /* A new plan object, even with the same content, is another plan. */
    ikv_plan *plan2 = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, 2, 46, P, IKV_FMT_F16, &plan2));
    const ikv_plan *plans2[2] = {plan2, NULL};
    step(&c, pair, plans2, 2, 1, 0, 0, "another plan");
    step(&c, pair, plans2, 2, 1, 0, 1, "that plan again");

    /* Another pool with the same sequence ids. */
    ikv_pool *other = new_pool(backend), *first = c.pool;
    ikv_seq_id o[2];
    for (int b = 0; b < 2; ++b) IKVT_OK(ikv_seq_create(other, &o[b]));
    assert_int_equal(o[0], s[0]);
    c.pool = other;
    append(&c, o[0], IKV_ALL_LAYERS, 40);
    append(&c, o[1], IKV_ALL_LAYERS, 70);
    step(&c, o, plans2, 2, 1, 0, 0, "another pool");
    step(&c, o, plans2, 2, 0, 0, 1, "that pool again");
    c.pool = first;
    step(&c, pair, plans2, 2, 1, 0, 0, "the first pool again");

    const ikv_decoder_stats st = stats(c.dec);
    assert_int_equal(st.steps, st.lists_built + st.lists_reused);
    /* An older caller's smaller struct gets only the fields it knows. */
    ikv_decoder_stats old;
    memset(&old, 0xAB, sizeof old);
    old.struct_size = 16;
    IKVT_OK(ikv_decoder_get_stats(c.dec, &old));
    assert_int_equal(old.struct_size, 16);
    assert_int_equal(old.steps, st.steps);
    assert_int_equal(old.lists_built, 0xABABABABABABABABull);
    old.struct_size = 8;
    IKVT_EXPECT_STATUS(ikv_decoder_get_stats(c.dec, &old), IKV_E_INVALID, "struct_size");
    IKVT_EXPECT_STATUS(ikv_decoder_get_stats(NULL, &old), IKV_E_NULL, "decoder");
    IKVT_EXPECT_STATUS(ikv_decoder_get_stats(c.dec, NULL), IKV_E_NULL, "out");

    ikv_plan_destroy(plan);
    ikv_plan_destroy(plan2);
    ikv_decoder_destroy(c.dec);
    ikv_pool_destroy(other);
    ikv_pool_destroy(c.pool);
}
