/* Routers and plans: every reason code from a real routing, exact partial
 * page bounds against a plain token-by-token reference, budgets, pressure,
 * hints, over-budget FAIL/KEEP, the cost model, bad configs, and a seeded
 * property test over random layouts and configs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

/* ---------------------------------------------------------------------- */
/* Plain reference router: one byte per token, written from the rules in  */
/* intentkv.h and docs/ROUTING.md, independent of the library's code.     */
/* ---------------------------------------------------------------------- */

#define MAXSEG 256

typedef struct rseg {
    uint32_t id, start, end;
    int policy;
    float score;
    int hint;
    int reason, format, taken;
} rseg;

typedef struct ref_plan {
    uint32_t seq_len, P, n_pages;
    size_t nseg;
    rseg seg[MAXSEG];
    uint8_t *sel, *mand;
    int *seg_of;       /* token -> segment index */
    uint8_t *page_fmt; /* per page */
    uint64_t mandatory;
    int over, fails;
    uint32_t prefetch[64];
    size_t n_prefetch;
} ref_plan;

static int ref_demote(int f, int steps) {
    static const int rung_fmt[4] = {IKV_FMT_F16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    int rung = (f == IKV_FMT_F16 || f == IKV_FMT_BF16) ? 0 : f - 1;
    if (steps == 0) return f;
    rung += steps;
    return rung_fmt[rung > 3 ? 3 : rung];
}

static int ref_format(const ikv_router_config *c, const rseg *s, int selected) {
    const ikv_precision_policy *p = &c->precision;
    if (s->hint != IKV_FMT_AUTO) return s->hint;
    if (s->policy == IKV_POLICY_ALWAYS) return p->always_format;
    int base;
    if (s->policy == IKV_POLICY_GLOBAL) base = p->global_format;
    else if (s->policy == IKV_POLICY_RECENT) base = p->recent_format;
    else if (s->policy == IKV_POLICY_SKIP) base = p->attend_low;
    else if (selected && s->reason != IKV_REASON_SCORE) base = p->recent_format; /* read through the window only */
    else base = s->score >= p->attend_high_score ? p->attend_high
              : s->score >= p->attend_mid_score  ? p->attend_mid
                                                 : p->attend_low;
    int steps = c->memory_pressure >= p->demote2_pressure ? 2 : c->memory_pressure >= p->demote1_pressure ? 1 : 0;
    return ref_demote(base, steps);
}

static int by_score_newer_first(const void *a, const void *b) {
    const rseg *x = *(const rseg *const *)a, *y = *(const rseg *const *)b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->start > y->start ? -1 : 1;
}

static void ref_route(const ikv_router_config *c, const ikv_layout *l, uint32_t seq_len, ref_plan *r) {
    memset(r, 0, sizeof *r);
    r->seq_len = seq_len;
    r->P = c->page_size;
    r->n_pages = (seq_len + r->P - 1) / r->P;
    r->sel = calloc(seq_len, 1);
    r->mand = calloc(seq_len, 1);
    r->seg_of = calloc(seq_len, sizeof(int));
    r->page_fmt = calloc(r->n_pages, 1);
    /* Segments: blocks and gaps. */
    uint32_t cursor = 0;
    size_t nb = ikv_layout_count(l);
    for (size_t i = 0; i <= nb; ++i) {
        ikv_block_info b;
        uint32_t next = seq_len;
        if (i < nb) {
            IKVT_OK(ikv_layout_at(l, i, &b));
            next = b.start;
        }
        if (next > cursor) {
            rseg g = {UINT32_MAX, cursor, next, IKV_POLICY_ATTEND, c->unlabeled_score, IKV_FMT_AUTO, 0, 0, 0};
            r->seg[r->nseg++] = g;
        }
        if (i < nb) {
            rseg s = {b.id, b.start, b.end, b.policy, b.score, b.precision_hint, 0, 0, 0};
            r->seg[r->nseg++] = s;
            cursor = b.end;
        }
        assert_true(r->nseg < MAXSEG - 1);
    }
    uint32_t wb = seq_len > c->recent_window ? seq_len - c->recent_window : 0;
    for (size_t k = 0; k < r->nseg; ++k) {
        rseg *s = &r->seg[k];
        for (uint32_t t = s->start; t < s->end; ++t) {
            r->seg_of[t] = (int)k;
            int m = s->policy != IKV_POLICY_SKIP &&
                    (s->policy == IKV_POLICY_ALWAYS || s->policy == IKV_POLICY_GLOBAL || t >= wb);
            r->mand[t] = r->sel[t] = (uint8_t)m;
            r->mandatory += (uint64_t)m;
        }
    }
    r->over = c->token_budget != 0 && r->mandatory > c->token_budget;
    r->fails = r->over && c->over_budget == IKV_OVER_BUDGET_FAIL;
    if (r->fails) return;
    uint64_t left = c->token_budget == 0 ? UINT64_MAX : r->over ? 0 : c->token_budget - r->mandatory;
    rseg *cand[MAXSEG];
    size_t nc = 0;
    for (size_t k = 0; k < r->nseg; ++k) { /* wholly inside the window (cost 0): still read on its score */
        rseg *s = &r->seg[k];
        if (s->policy == IKV_POLICY_ATTEND && s->score >= c->attend_threshold) cand[nc++] = s;
    }
    qsort(cand, nc, sizeof cand[0], by_score_newer_first);
    for (size_t i = 0; i < nc; ++i) {
        rseg *s = cand[i];
        uint64_t cost = 0;
        for (uint32_t t = s->start; t < s->end; ++t) cost += !r->mand[t];
        if (cost <= left) {
            left -= cost;
            s->taken = 1;
            for (uint32_t t = s->start; t < s->end; ++t) r->sel[t] = 1;
        }
    }
    for (size_t k = 0; k < r->nseg; ++k) {
        rseg *s = &r->seg[k];
        int any_mand = 0, any_sel = 0;
        for (uint32_t t = s->start; t < s->end; ++t) {
            any_mand |= r->mand[t];
            any_sel |= r->sel[t];
        }
        if (s->policy == IKV_POLICY_SKIP) s->reason = IKV_REASON_POLICY_SKIP;
        else if (r->over && any_mand && !s->taken) s->reason = IKV_REASON_OVER_BUDGET_KEPT; /* read on its score: SCORE */
        else if (s->policy == IKV_POLICY_ALWAYS) s->reason = IKV_REASON_ALWAYS;
        else if (s->policy == IKV_POLICY_GLOBAL) s->reason = IKV_REASON_GLOBAL;
        else if (s->policy == IKV_POLICY_RECENT) s->reason = any_mand ? IKV_REASON_RECENT_WINDOW : IKV_REASON_OUTSIDE_WINDOW;
        else if (s->taken) s->reason = IKV_REASON_SCORE;
        else if (any_mand) s->reason = IKV_REASON_RECENT_WINDOW;
        else if (s->score < c->attend_threshold) s->reason = IKV_REASON_BELOW_THRESHOLD;
        else s->reason = IKV_REASON_BUDGET_EXHAUSTED;
        s->format = ref_format(c, s, any_sel);
    }
    /* Page formats: highest precision of selected tokens' blocks, else lowest of all. */
    for (uint32_t p = 0; p < r->n_pages; ++p) {
        int best = 255, low = 0;
        for (uint32_t t = p * r->P; t < (p + 1) * r->P && t < seq_len; ++t) {
            int f = r->seg[r->seg_of[t]].format;
            if (r->sel[t] && f < best) best = f;
            if (f > low) low = f;
        }
        r->page_fmt[p] = (uint8_t)(best != 255 ? best : low);
    }
    /* Prefetch. */
    uint8_t *hinted = calloc(r->n_pages + 1, 1);
    for (uint32_t t = 0; t < seq_len; ++t) hinted[t / r->P] |= r->sel[t];
    uint32_t depth = c->prefetch_depth < 64 ? c->prefetch_depth : 64;
#define OFFER(pg)                                                        \
    do {                                                                 \
        if (r->n_prefetch < depth && !hinted[pg]) {                      \
            hinted[pg] = 1;                                              \
            r->prefetch[r->n_prefetch++] = (pg);                         \
        }                                                                \
    } while (0)
    OFFER(seq_len / r->P);
    rseg *missed[MAXSEG];
    size_t nm = 0;
    for (size_t k = 0; k < r->nseg; ++k)
        if (r->seg[k].policy == IKV_POLICY_ATTEND && !r->sel[r->seg[k].start]) missed[nm++] = &r->seg[k];
    qsort(missed, nm, sizeof missed[0], by_score_newer_first);
    for (size_t i = 0; i < nm; ++i)
        for (uint32_t t = missed[i]->start; t < missed[i]->end && !r->sel[t]; ++t) OFFER(t / r->P);
#undef OFFER
    free(hinted);
}

static void ref_free(ref_plan *r) {
    free(r->sel);
    free(r->mand);
    free(r->seg_of);
    free(r->page_fmt);
}

/* Bytes a decode reads for n tokens of one sub-page, written out plainly. */
static uint64_t ref_read_bytes(int f, uint64_t D, uint64_t n) {
    switch (f) {
        case IKV_FMT_F16:
        case IKV_FMT_BF16: return 2 * 2 * D * n;
        case IKV_FMT_FP8_E4M3: return 2 * D * n + 8;
        case IKV_FMT_INT8: return 2 * D * n + 4 * D + 4 * n;
        default: return 2 * (D / 2) * n + 4 * D + 4 * n * ((D + 31) / 32); /* half scales and minimums */
    }
}

/* Compare a plan with the reference in full. */
static void check_plan(const ikv_plan *plan, const ref_plan *r, const ikv_router_config *c) {
    const ikv_plan_page *pages;
    size_t np;
    IKVT_OK(ikv_plan_pages(plan, &pages, &np));
    /* Expected entries, token by token. */
    size_t k = 0;
    uint32_t tok_by_fmt[IKV_FMT_COUNT] = {0}, selected = 0, mand = 0, pages_sel = 0;
    for (uint32_t p = 0; p < r->n_pages; ++p) {
        uint32_t pb = p * r->P, pe = pb + r->P < r->seq_len ? pb + r->P : r->seq_len;
        int any = 0;
        for (uint32_t t = pb; t < pe;) {
            if (!r->sel[t]) { ++t; continue; }
            uint32_t b = t;
            int m = 0;
            while (t < pe && r->sel[t]) m |= r->mand[t++];
            assert_true(k < np);
            assert_int_equal(pages[k].page, p);
            assert_int_equal(pages[k].token_begin, b);
            assert_int_equal(pages[k].token_end, t);
            assert_int_equal(pages[k].format, r->page_fmt[p]);
            int partial = b != pb || t != pb + r->P;
            assert_int_equal(pages[k].flags, (m ? IKV_PAGE_MANDATORY : 0) | (partial ? IKV_PAGE_PARTIAL : 0));
            tok_by_fmt[r->page_fmt[p]] += t - b;
            selected += t - b;
            ++k;
            any = 1;
        }
        pages_sel += (uint32_t)any;
        ikv_format f;
        IKVT_OK(ikv_plan_page_format(plan, p, &f));
        assert_int_equal(f, r->page_fmt[p]);
    }
    assert_int_equal(k, np);
    for (uint32_t t = 0; t < r->seq_len; ++t) mand += r->mand[t];
    ikv_plan_summary s;
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    assert_int_equal(s.seq_len, r->seq_len);
    assert_int_equal(s.page_size, r->P);
    assert_int_equal(s.tokens_selected, selected);
    assert_int_equal(s.tokens_skipped, r->seq_len - selected);
    assert_int_equal(s.pages_selected, pages_sel);
    assert_int_equal(s.pages_total, r->n_pages);
    assert_int_equal(s.mandatory_tokens, mand);
    assert_int_equal(s.token_budget, c->token_budget);
    assert_int_equal(s.over_budget, r->over);
    assert_memory_equal(s.tokens_by_format, tok_by_fmt, sizeof tok_by_fmt);
    /* Skipped pages. */
    const uint32_t *sk;
    size_t nsk;
    IKVT_OK(ikv_plan_skipped_pages(plan, &sk, &nsk));
    assert_int_equal(nsk, r->n_pages - pages_sel);
    for (size_t i = 0; i < nsk; ++i) {
        assert_true(i == 0 || sk[i] > sk[i - 1]);
        for (uint32_t t = sk[i] * r->P; t < (sk[i] + 1) * r->P && t < r->seq_len; ++t) assert_false(r->sel[t]);
    }
    /* Decisions. */
    const ikv_block_decision *d;
    size_t nd;
    IKVT_OK(ikv_plan_decisions(plan, &d, &nd));
    assert_int_equal(nd, r->nseg);
    for (size_t i = 0; i < nd; ++i) {
        const rseg *g = &r->seg[i];
        uint32_t n = 0;
        for (uint32_t t = g->start; t < g->end; ++t) n += r->sel[t];
        assert_int_equal(d[i].block_id, g->id);
        assert_int_equal(d[i].start, g->start);
        assert_int_equal(d[i].end, g->end);
        assert_int_equal(d[i].tokens_selected, n);
        assert_int_equal(d[i].selected, n > 0);
        assert_int_equal(d[i].reason, g->reason);
        assert_int_equal(d[i].format, g->format);
    }
    /* Prefetch. */
    const uint32_t *pf;
    size_t npf;
    IKVT_OK(ikv_plan_prefetch(plan, &pf, &npf));
    if (c->prefetch_depth <= 64) {
        assert_int_equal(npf, r->n_prefetch);
        for (size_t i = 0; i < npf; ++i) assert_int_equal(pf[i], r->prefetch[i]);
    }
    /* Cost vs a plain recomputation, for two shapes. */
    ikv_model_shape shapes[2] = {ikv_model_shape_default(), ikv_model_shape_default()};
    shapes[1].n_layers = 3;
    shapes[1].n_q_heads = 6;
    shapes[1].n_kv_heads = 2;
    shapes[1].head_dim = 80;
    for (int si = 0; si < 2; ++si) {
        const ikv_model_shape *sh = &shapes[si];
        uint64_t by_fmt[IKV_FMT_COUNT] = {0}, dense = 0, total = 0;
        /* Each run of selected tokens in a page is read with the page's scales
         * (as the decoders count it: ikv_decoder_last_bytes_read). */
        for (uint32_t p = 0; p < r->n_pages; ++p) {
            uint64_t run = 0, all = 0;
            for (uint32_t t = p * r->P; t < (p + 1) * r->P && t < r->seq_len; ++t) {
                ++all;
                if (r->sel[t]) ++run;
                const int ends = run && (!r->sel[t] || t + 1 == (p + 1) * r->P || t + 1 == r->seq_len);
                if (!ends) continue;
                by_fmt[r->page_fmt[p]] += ref_read_bytes(r->page_fmt[p], sh->head_dim, run) * sh->n_layers * sh->n_kv_heads;
                run = 0;
            }
            dense += ref_read_bytes(IKV_FMT_F16, sh->head_dim, all) * sh->n_layers * sh->n_kv_heads;
        }
        ikv_plan_cost cost;
        IKVT_OK(ikv_plan_get_cost(plan, sh, &cost));
        for (int f = 0; f < IKV_FMT_COUNT; ++f) {
            assert_int_equal(cost.bytes_by_format[f], by_fmt[f]);
            total += by_fmt[f];
        }
        assert_int_equal(cost.bytes_total, total);
        assert_int_equal(cost.bytes_dense_f16, dense);
        uint64_t per = 4ull * sh->head_dim * sh->n_q_heads * sh->n_layers;
        assert_int_equal(cost.flops, per * selected);
        assert_int_equal(cost.flops_dense, per * r->seq_len);
    }
}

/* Route, compare with the reference, and return the plan (or NULL on IKV_E_BUDGET). */
static ikv_plan *route_checked(const ikv_router_config *c, const ikv_layout *l, uint32_t seq_len) {
    ikv_router *router = NULL;
    IKVT_OK(ikv_router_create(c, &router));
    ref_plan r;
    ref_route(c, l, seq_len, &r);
    ikv_plan *plan = NULL;
    ikv_status st = ikv_router_route(router, l, seq_len, &plan);
    if (r.fails) {
        IKVT_EXPECT_STATUS(st, IKV_E_BUDGET, "token_budget");
        assert_null(plan);
    } else {
        IKVT_OK(st);
        check_plan(plan, &r, c);
    }
    ref_free(&r);
    ikv_router_destroy(router);
    return plan;
}

/* ---------------------------------------------------------------------- */
/* A hand-built agentic layout where every reason code shows up.          */
/* ---------------------------------------------------------------------- */

enum { SYS, SKIP0, SYS2, MEM, DOCA, DOCB, DOCE, DOCC, SKIPD, TOOL, TURN, SCRATCH, NEWT, NBLK };

static uint32_t g_ids[NBLK];

static ikv_layout *scenario(void) {
    static const struct {
        const char *name;
        uint32_t start, end;
        ikv_policy policy;
        float score;
    } spec[NBLK] = {
        {"sys", 0, 20, IKV_POLICY_ALWAYS, 1.0f},       {"skip0", 20, 25, IKV_POLICY_SKIP, 0.9f},
        {"sys2", 25, 40, IKV_POLICY_ALWAYS, 1.0f},     {"mem", 40, 90, IKV_POLICY_GLOBAL, 0.9f},
        {"docA", 90, 300, IKV_POLICY_ATTEND, 0.9f},    {"docB", 300, 500, IKV_POLICY_ATTEND, 0.6f},
        {"docE", 500, 520, IKV_POLICY_ATTEND, 0.5f},   {"docC", 520, 650, IKV_POLICY_ATTEND, 0.2f},
        {"skipd", 650, 700, IKV_POLICY_SKIP, 1.0f},    {"tool", 700, 760, IKV_POLICY_RECENT, 0.4f},
        /* gap [760, 800) */
        {"turn", 800, 920, IKV_POLICY_ATTEND, 0.1f},   {"scratch", 920, 950, IKV_POLICY_SKIP, 0.0f},
        {"new", 950, 1000, IKV_POLICY_RECENT, 1.0f},
    };
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    for (int i = NBLK - 1; i >= 0; --i) { /* added newest first: order must not matter */
        ikv_block_desc d = ikv_block_desc_default();
        d.name = spec[i].name;
        d.start = spec[i].start;
        d.end = spec[i].end;
        d.policy = spec[i].policy;
        d.score = spec[i].score;
        IKVT_OK(ikv_layout_add(l, &d, &g_ids[i]));
    }
    return l;
}

static ikv_router_config scenario_config(void) {
    ikv_router_config c = ikv_router_default_config();
    c.page_size = 16;
    c.recent_window = 100;
    c.token_budget = 400;
    c.attend_threshold = 0.3f;
    return c;
}

static const ikv_block_decision *decision_of(const ikv_plan *plan, uint32_t id) {
    const ikv_block_decision *d;
    size_t n;
    IKVT_OK(ikv_plan_decisions(plan, &d, &n));
    for (size_t i = 0; i < n; ++i)
        if (d[i].block_id == id) return &d[i];
    fail_msg("no decision for block %u", id);
    return NULL;
}

static void test_every_reason(void **state) {
    (void)state;
    ikv_layout *l = scenario();
    ikv_router_config c = scenario_config();
    ikv_plan *plan = route_checked(&c, l, 1000);
    /* mandatory = 20 + 15 + 50 + window [900,1000) minus scratch = 155; 245 left:
     * docA (210) fits, docB (200) does not, docE (20) still does. */
    static const struct {
        int blk;
        ikv_reason reason;
        uint32_t tokens;
    } want[] = {
        {SYS, IKV_REASON_ALWAYS, 20},          {SKIP0, IKV_REASON_POLICY_SKIP, 0},
        {SYS2, IKV_REASON_ALWAYS, 15},         {MEM, IKV_REASON_GLOBAL, 50},
        {DOCA, IKV_REASON_SCORE, 210},         {DOCB, IKV_REASON_BUDGET_EXHAUSTED, 0},
        {DOCE, IKV_REASON_SCORE, 20},          {DOCC, IKV_REASON_BELOW_THRESHOLD, 0},
        {SKIPD, IKV_REASON_POLICY_SKIP, 0},    {TOOL, IKV_REASON_OUTSIDE_WINDOW, 0},
        {TURN, IKV_REASON_RECENT_WINDOW, 20},  {SCRATCH, IKV_REASON_POLICY_SKIP, 0},
        {NEWT, IKV_REASON_RECENT_WINDOW, 50},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) {
        const ikv_block_decision *d = decision_of(plan, g_ids[want[i].blk]);
        assert_int_equal(d->reason, want[i].reason);
        assert_int_equal(d->tokens_selected, want[i].tokens);
    }
    const ikv_block_decision *gap = decision_of(plan, UINT32_MAX);
    assert_int_equal(gap->start, 760);
    assert_int_equal(gap->end, 800);
    assert_int_equal(gap->reason, IKV_REASON_BELOW_THRESHOLD);
    ikv_plan_summary s;
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    assert_int_equal(s.tokens_selected, 155 + 230);
    assert_int_equal(s.mandatory_tokens, 155);
    /* Page 1 [16, 32): sys and sys2 around skip0 -> two disjoint entries. */
    const ikv_plan_page *pages;
    size_t np;
    IKVT_OK(ikv_plan_pages(plan, &pages, &np));
    assert_int_equal(pages[1].page, 1);
    assert_int_equal(pages[1].token_begin, 16);
    assert_int_equal(pages[1].token_end, 20);
    assert_int_equal(pages[2].page, 1);
    assert_int_equal(pages[2].token_begin, 25);
    assert_int_equal(pages[2].token_end, 32);
    assert_int_equal(pages[2].flags, IKV_PAGE_MANDATORY | IKV_PAGE_PARTIAL);
    /* Prefetch: page 62 is read now; then docB's unread pages (page 18 is read for docA). */
    const uint32_t *pf;
    size_t npf;
    IKVT_OK(ikv_plan_prefetch(plan, &pf, &npf));
    assert_int_equal(npf, 4);
    assert_int_equal(pf[0], 19);
    assert_int_equal(pf[3], 22);
    ikv_plan_destroy(plan);

    /* Unlimited budget: docB now reads by score; a page-aligned length hints the next page first. */
    c.token_budget = 0;
    plan = route_checked(&c, l, 1000);
    assert_int_equal(decision_of(plan, g_ids[DOCB])->reason, IKV_REASON_SCORE);
    ikv_plan_destroy(plan);
    ikv_block_desc d = ikv_block_desc_default();
    d.name = "tail";
    d.start = 1000;
    d.end = 1024;
    d.policy = IKV_POLICY_RECENT;
    uint32_t tail;
    IKVT_OK(ikv_layout_add(l, &d, &tail));
    plan = route_checked(&c, l, 1024);
    IKVT_OK(ikv_plan_prefetch(plan, &pf, &npf));
    assert_true(npf >= 1);
    assert_int_equal(pf[0], 64);
    ikv_plan_destroy(plan);
    IKVT_OK(ikv_layout_remove(l, tail));
    ikv_layout_destroy(l);
}

/* An ATTEND block at or above the threshold lying wholly inside the recent
 * window is read on its score and keeps the precision table's format, as the
 * same block reaching one token out of the window does (it used to take
 * recent_format and RECENT_WINDOW there). */
static void test_attend_inside_window(void **state) {
    (void)state;
    ikv_router_config c = ikv_router_default_config();
    c.recent_window = 16;
    for (uint32_t start = 93; start <= 100; start += 7) {
        ikv_layout *l = NULL;
        IKVT_OK(ikv_layout_create(&l));
        ikv_block_desc b = ikv_block_desc_default();
        b.name = "old";
        b.start = 0;
        b.end = start;
        b.score = 0.0f;
        IKVT_OK(ikv_layout_add(l, &b, NULL));
        b.name = "doc";
        b.start = start;
        b.end = 110;
        b.score = 0.6f;
        uint32_t doc;
        IKVT_OK(ikv_layout_add(l, &b, &doc));
        ikv_plan *plan = route_checked(&c, l, 110);
        const ikv_block_decision *d = decision_of(plan, doc);
        assert_int_equal(d->reason, IKV_REASON_SCORE);
        assert_int_equal(d->tokens_selected, 110 - start);
        assert_int_equal(d->format, c.precision.attend_mid); /* 0.6: the table's middle rung */
        ikv_plan_destroy(plan);
        ikv_layout_destroy(l);
    }
}

typedef struct captured {
    int warnings;
    char text[512];
} captured;

static void capture(ikv_log_level level, const char *msg, void *user) {
    captured *c = (captured *)user;
    if (level == IKV_LOG_WARN) {
        c->warnings++;
        snprintf(c->text, sizeof c->text, "%s", msg);
    }
}

static void test_over_budget(void **state) {
    (void)state;
    ikv_layout *l = scenario();
    ikv_router_config c = scenario_config();
    c.token_budget = 100;
    c.over_budget = IKV_OVER_BUDGET_FAIL;
    ikv_router *r = NULL;
    IKVT_OK(ikv_router_create(&c, &r));
    ikv_plan *plan = NULL;
    IKVT_EXPECT_STATUS(ikv_router_route(r, l, 1000, &plan), IKV_E_BUDGET, "155");
    assert_non_null(strstr(ikv_last_error(), "100"));
    assert_null(plan);
    ikv_router_destroy(r);
    route_checked(&c, l, 1000); /* the reference agrees it fails */

    c.over_budget = IKV_OVER_BUDGET_KEEP;
    captured cap;
    memset(&cap, 0, sizeof cap);
    ikv_set_log_callback(capture, &cap, IKV_LOG_WARN);
    plan = route_checked(&c, l, 1000);
    ikv_set_log_callback(NULL, NULL, IKV_LOG_WARN);
    assert_int_equal(cap.warnings, 1);
    assert_non_null(strstr(cap.text, "155"));
    ikv_plan_summary s;
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    assert_int_equal(s.over_budget, 1);
    assert_int_equal(s.tokens_selected, 155);
    assert_int_equal(decision_of(plan, g_ids[SYS])->reason, IKV_REASON_OVER_BUDGET_KEPT);
    assert_int_equal(decision_of(plan, g_ids[MEM])->reason, IKV_REASON_OVER_BUDGET_KEPT);
    assert_int_equal(decision_of(plan, g_ids[TURN])->reason, IKV_REASON_OVER_BUDGET_KEPT);
    assert_int_equal(decision_of(plan, g_ids[NEWT])->reason, IKV_REASON_OVER_BUDGET_KEPT);
    assert_int_equal(decision_of(plan, g_ids[DOCA])->reason, IKV_REASON_BUDGET_EXHAUSTED);
    ikv_plan_destroy(plan);
    /* Budget exactly the mandatory tokens: no ATTEND block fits, not over. */
    c.token_budget = 155;
    plan = route_checked(&c, l, 1000);
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    assert_int_equal(s.over_budget, 0);
    assert_int_equal(s.tokens_selected, 155);
    ikv_plan_destroy(plan);
    ikv_layout_destroy(l);
}

/* An ATTEND block at or above the threshold wholly inside the recent window
 * is read on its score (IKV_REASON_SCORE) in the precision table's format,
 * also when the mandatory tokens exceed the budget and KEEP keeps them. */
static void test_over_budget_keeps_score_blocks(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    ikv_block_desc d = ikv_block_desc_default();
    d.name = "sys";
    d.start = 0;
    d.end = 64;
    d.policy = IKV_POLICY_ALWAYS;
    IKVT_OK(ikv_layout_add(l, &d, NULL));
    d.name = "doc";
    d.start = 160;
    d.end = 200;
    d.policy = IKV_POLICY_ATTEND;
    d.score = 0.6f;
    uint32_t doc = 0;
    IKVT_OK(ikv_layout_add(l, &d, &doc));
    ikv_router_config c = ikv_router_default_config();
    c.recent_window = 64;
    c.over_budget = IKV_OVER_BUDGET_KEEP;
    const uint32_t budgets[3] = {0, 1000, 100}; /* unlimited, ample, over (128 mandatory tokens) */
    ikv_format table_format = IKV_FMT_COUNT;
    for (int i = 0; i < 3; ++i) {
        c.token_budget = budgets[i];
        ikv_set_log_callback(capture, &(captured){0}, IKV_LOG_WARN); /* the over-budget warning */
        ikv_plan *plan = route_checked(&c, l, 200);
        ikv_set_log_callback(NULL, NULL, IKV_LOG_WARN);
        const ikv_block_decision *dd = decision_of(plan, doc);
        assert_int_equal(dd->reason, IKV_REASON_SCORE);
        assert_int_equal(dd->tokens_selected, 40);
        if (i == 0) table_format = (ikv_format)dd->format;
        assert_int_equal(dd->format, table_format);
        ikv_plan_destroy(plan);
    }
    assert_int_equal(table_format, ikv_router_default_config().precision.attend_mid);
    ikv_layout_destroy(l);
}

static void test_pressure_and_hints(void **state) {
    (void)state;
    ikv_layout *l = scenario();
    ikv_router_config c = scenario_config();
    c.token_budget = 0;
    /* docA 0.9 -> attend_high F16; mem GLOBAL FP8; docB 0.6 -> INT8; sys ALWAYS F16 at any pressure. */
    const float pressures[3] = {0.0f, 0.5f, 0.9f};
    const int want_doca[3] = {IKV_FMT_F16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8};
    const int want_mem[3] = {IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    const int want_docb[3] = {IKV_FMT_INT8, IKV_FMT_INT4, IKV_FMT_INT4};
    ikv_router *r = NULL;
    IKVT_OK(ikv_router_create(&c, &r));
    for (int i = 0; i < 3; ++i) {
        IKVT_OK(ikv_router_set_pressure(r, pressures[i]));
        ikv_router_config got;
        got.struct_size = sizeof got;
        IKVT_OK(ikv_router_get_config(r, &got));
        assert_true(got.memory_pressure == pressures[i]);
        ikv_plan *plan = NULL;
        IKVT_OK(ikv_router_route(r, l, 1000, &plan));
        assert_int_equal(decision_of(plan, g_ids[DOCA])->format, want_doca[i]);
        assert_int_equal(decision_of(plan, g_ids[MEM])->format, want_mem[i]);
        assert_int_equal(decision_of(plan, g_ids[DOCB])->format, want_docb[i]);
        assert_int_equal(decision_of(plan, g_ids[SYS])->format, IKV_FMT_F16);
        ikv_plan_destroy(plan);
        c.memory_pressure = pressures[i];
        ikv_plan_destroy(route_checked(&c, l, 1000)); /* full comparison too */
    }
    ikv_router_destroy(r);
    /* A hint wins over table and pressure. */
    ikv_block_info b;
    IKVT_OK(ikv_layout_get(l, g_ids[DOCB], &b));
    ikv_block_desc d = ikv_block_desc_default();
    d.name = b.name;
    d.start = b.start;
    d.end = b.end;
    d.score = b.score;
    d.precision_hint = IKV_FMT_BF16;
    IKVT_OK(ikv_layout_update(l, g_ids[DOCB], &d));
    c.memory_pressure = 0.9f;
    ikv_plan *plan = route_checked(&c, l, 1000);
    assert_int_equal(decision_of(plan, g_ids[DOCB])->format, IKV_FMT_BF16);
    /* Page 18 [288, 304) holds docA (INT8 now) and docB (BF16): the higher precision wins. */
    ikv_format f;
    IKVT_OK(ikv_plan_page_format(plan, 18, &f));
    assert_int_equal(f, IKV_FMT_BF16);
    ikv_plan_destroy(plan);
    ikv_layout_destroy(l);
}

static void test_router_config_errors(void **state) {
    (void)state;
    ikv_router_config def = ikv_router_default_config();
    assert_int_equal(def.struct_size, sizeof def);
    assert_int_equal(def.page_size, 16);
    assert_int_equal(def.token_budget, 0);
    assert_int_equal(def.recent_window, 512);
    assert_true(def.attend_threshold == 0.3f);
    assert_int_equal(def.prefetch_depth, 4);
    assert_int_equal(def.over_budget, IKV_OVER_BUDGET_FAIL);
    assert_int_equal(def.precision.global_format, IKV_FMT_FP8_E4M3);
    assert_int_equal(def.precision.attend_mid, IKV_FMT_INT8);
    assert_int_equal(def.precision.attend_low, IKV_FMT_INT4);
    assert_true(def.precision.demote2_pressure == 0.85f);

    ikv_router *r = (ikv_router *)0x1; /* must stay untouched on failure */
    IKVT_EXPECT_STATUS(ikv_router_create(NULL, &r), IKV_E_NULL, "config");
    IKVT_EXPECT_STATUS(ikv_router_create(&def, NULL), IKV_E_NULL, "out");
    ikv_router_config c = def;
    c.struct_size = 8;
    IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "struct_size");
    const uint32_t bad_pages[] = {0, 4, 12, 24, 256};
    for (size_t i = 0; i < 5; ++i) {
        c = def;
        c.page_size = bad_pages[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "page_size");
    }
    const float bad[] = {NAN, INFINITY, -0.5f, 1.5f};
    for (size_t i = 0; i < 4; ++i) {
        c = def; c.memory_pressure = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "memory_pressure");
        c = def; c.attend_threshold = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_threshold");
        c = def; c.unlabeled_score = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "unlabeled_score");
        c = def; c.precision.attend_high_score = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_high_score");
        c = def; c.precision.attend_mid_score = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_mid_score");
        c = def; c.precision.demote1_pressure = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "demote1_pressure");
        c = def; c.precision.demote2_pressure = bad[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "demote2_pressure");
    }
    c = def; c.precision.demote1_pressure = 0.9f; c.precision.demote2_pressure = 0.8f;
    IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "demote1_pressure");
    c = def; c.precision.attend_mid_score = 0.9f; c.precision.attend_high_score = 0.8f;
    IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_mid_score");
    c = def; c.over_budget = (ikv_over_budget)2;
    IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "over_budget");
    const ikv_format bad_formats[] = {IKV_FMT_COUNT, IKV_FMT_AUTO, (ikv_format)-1};
    for (size_t i = 0; i < 3; ++i) {
        c = def; c.precision.always_format = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "always_format");
        c = def; c.precision.global_format = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "global_format");
        c = def; c.precision.recent_format = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "recent_format");
        c = def; c.precision.attend_high = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_high");
        c = def; c.precision.attend_mid = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_mid");
        c = def; c.precision.attend_low = bad_formats[i];
        IKVT_EXPECT_STATUS(ikv_router_create(&c, &r), IKV_E_INVALID, "attend_low");
    }
    assert_ptr_equal(r, (ikv_router *)0x1);

    /* Bad calls on a good router leave its config unchanged. */
    IKVT_OK(ikv_router_create(&def, &r));
    IKVT_EXPECT_STATUS(ikv_router_set_pressure(r, NAN), IKV_E_INVALID, "memory_pressure");
    IKVT_EXPECT_STATUS(ikv_router_set_pressure(r, 1.01f), IKV_E_INVALID, "memory_pressure");
    IKVT_EXPECT_STATUS(ikv_router_set_pressure(NULL, 0.5f), IKV_E_NULL, "router");
    ikv_router_config got;
    memset(&got, 0, sizeof got);
    IKVT_EXPECT_STATUS(ikv_router_get_config(r, &got), IKV_E_INVALID, "struct_size");
    assert_int_equal(got.page_size, 0); /* unchanged */
    got.struct_size = sizeof got;
    IKVT_OK(ikv_router_get_config(r, &got));
    assert_memory_equal(&got, &def, sizeof def);
    IKVT_EXPECT_STATUS(ikv_router_get_config(NULL, &got), IKV_E_NULL, "router");
    IKVT_EXPECT_STATUS(ikv_router_get_config(r, NULL), IKV_E_NULL, "out");

    /* Route errors. */
    ikv_layout *l = scenario();
    ikv_plan *plan = (ikv_plan *)0x1;
    IKVT_EXPECT_STATUS(ikv_router_route(NULL, l, 1000, &plan), IKV_E_NULL, "router");
    IKVT_EXPECT_STATUS(ikv_router_route(r, NULL, 1000, &plan), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_router_route(r, l, 1000, NULL), IKV_E_NULL, "plan_out");
    IKVT_EXPECT_STATUS(ikv_router_route(r, l, 0, &plan), IKV_E_INVALID, "seq_len");
    IKVT_EXPECT_STATUS(ikv_router_route(r, l, 999, &plan), IKV_E_RANGE, "'new'");
    IKVT_EXPECT_STATUS(ikv_router_route(r, l, 700, &plan), IKV_E_RANGE, "'tool'");
    assert_ptr_equal(plan, (ikv_plan *)0x1);
    ikv_router_destroy(r);
    ikv_router_destroy(NULL);
    ikv_layout_destroy(l);

    /* An empty layout is all one unlabeled gap; a router may route it. */
    IKVT_OK(ikv_layout_create(&l));
    c = def;
    c.unlabeled_score = 0.5f;
    ikv_plan_destroy(route_checked(&c, l, 77));
    ikv_layout_destroy(l);
}

static void test_plan_accessor_errors(void **state) {
    (void)state;
    ikv_layout *l = scenario();
    ikv_router_config c = scenario_config();
    ikv_plan *plan = route_checked(&c, l, 1000);
    const ikv_plan_page *pages;
    const uint32_t *u;
    const ikv_block_decision *d;
    size_t n;
    ikv_plan_summary s;
    ikv_format f = IKV_FMT_AUTO;
    IKVT_EXPECT_STATUS(ikv_plan_get_summary(NULL, &s), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_get_summary(plan, NULL), IKV_E_NULL, "out");
    IKVT_EXPECT_STATUS(ikv_plan_pages(NULL, &pages, &n), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_pages(plan, NULL, &n), IKV_E_NULL, "pages");
    IKVT_EXPECT_STATUS(ikv_plan_pages(plan, &pages, NULL), IKV_E_NULL, "count");
    IKVT_EXPECT_STATUS(ikv_plan_skipped_pages(NULL, &u, &n), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_skipped_pages(plan, NULL, &n), IKV_E_NULL, "pages");
    IKVT_EXPECT_STATUS(ikv_plan_skipped_pages(plan, &u, NULL), IKV_E_NULL, "count");
    IKVT_EXPECT_STATUS(ikv_plan_prefetch(NULL, &u, &n), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_prefetch(plan, NULL, &n), IKV_E_NULL, "pages");
    IKVT_EXPECT_STATUS(ikv_plan_prefetch(plan, &u, NULL), IKV_E_NULL, "count");
    IKVT_EXPECT_STATUS(ikv_plan_decisions(NULL, &d, &n), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_decisions(plan, NULL, &n), IKV_E_NULL, "decisions");
    IKVT_EXPECT_STATUS(ikv_plan_decisions(plan, &d, NULL), IKV_E_NULL, "count");
    IKVT_EXPECT_STATUS(ikv_plan_page_format(NULL, 0, &f), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_page_format(plan, 0, NULL), IKV_E_NULL, "out");
    IKVT_EXPECT_STATUS(ikv_plan_page_format(plan, 63, &f), IKV_E_RANGE, "page 63");
    assert_int_equal(f, IKV_FMT_AUTO);
    ikv_model_shape sh = ikv_model_shape_default();
    assert_int_equal(sh.struct_size, sizeof sh);
    assert_int_equal(sh.n_layers, 32);
    assert_int_equal(sh.n_q_heads, 32);
    assert_int_equal(sh.n_kv_heads, 8);
    assert_int_equal(sh.head_dim, 128);
    ikv_plan_cost cost;
    memset(&cost, 0x5a, sizeof cost);
    ikv_plan_cost untouched = cost;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(NULL, &sh, &cost), IKV_E_NULL, "plan");
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, NULL, &cost), IKV_E_NULL, "shape");
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &sh, NULL), IKV_E_NULL, "out");
    ikv_model_shape b = sh; b.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "struct_size");
    b = sh; b.n_layers = 0;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "n_layers");
    b = sh; b.n_q_heads = 0;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "n_q_heads");
    b = sh; b.n_kv_heads = 0;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "n_kv_heads");
    b = sh; b.head_dim = 0;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "head_dim");
    b = sh; b.head_dim = 100;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "head_dim");
    b = sh; b.n_q_heads = 12;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &b, &cost), IKV_E_INVALID, "n_q_heads");
    assert_memory_equal(&cost, &untouched, sizeof cost);
    ikv_plan_destroy(plan);
    ikv_plan_destroy(NULL);
    ikv_layout_destroy(l);
}

/* ---------------------------------------------------------------------- */
/* Property test: random layouts under random configs.                    */
/* ---------------------------------------------------------------------- */

static void check_invariants(const ikv_plan *plan, const ikv_layout *l, const ikv_router_config *c) {
    ikv_plan_summary s;
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    const ikv_plan_page *pages;
    size_t np;
    IKVT_OK(ikv_plan_pages(plan, &pages, &np));
    if (c->token_budget && !s.over_budget) assert_true(s.tokens_selected <= c->token_budget);
    uint8_t *sel = calloc(s.seq_len, 1);
    uint32_t count = 0, distinct = 0;
    for (size_t i = 0; i < np; ++i) {
        const ikv_plan_page *p = &pages[i];
        assert_true(p->token_begin < p->token_end);
        assert_true(p->token_begin >= p->page * s.page_size);
        assert_true(p->token_end <= (p->page + 1) * s.page_size);
        assert_true(p->token_end <= s.seq_len);
        if (i > 0) {
            const ikv_plan_page *q = &pages[i - 1];
            assert_true(q->page < p->page || (q->page == p->page && q->token_end < p->token_begin));
        }
        distinct += i == 0 || pages[i - 1].page != p->page;
        for (uint32_t t = p->token_begin; t < p->token_end; ++t) sel[t] = 1;
        count += p->token_end - p->token_begin;
    }
    assert_int_equal(count, s.tokens_selected);
    assert_int_equal(distinct, s.pages_selected);
    uint32_t wb = s.seq_len > c->recent_window ? s.seq_len - c->recent_window : 0;
    for (size_t i = 0; i < ikv_layout_count(l); ++i) {
        ikv_block_info b;
        IKVT_OK(ikv_layout_at(l, i, &b));
        for (uint32_t t = b.start; t < b.end; ++t) {
            if (b.policy == IKV_POLICY_SKIP) assert_false(sel[t]);
            else if (b.policy == IKV_POLICY_ALWAYS || b.policy == IKV_POLICY_GLOBAL || t >= wb) assert_true(sel[t]);
        }
    }
    free(sel);
}

static void test_random_property(void **state) {
    (void)state;
    ikvt_rng rng = {20240607};
    int routed = 0, failed = 0;
    for (int iter = 0; iter < 300; ++iter) {
        uint32_t seq_len = 1 + (uint32_t)(ikvt_uniform(&rng) * 3000);
        ikv_layout *l = NULL;
        IKVT_OK(ikv_layout_create(&l));
        uint32_t t = (uint32_t)(ikvt_uniform(&rng) * 20);
        int nb = 0;
        while (t < seq_len && nb < 100) {
            uint32_t len = 1 + (uint32_t)(ikvt_uniform(&rng) * (seq_len / 8 + 1));
            if (t + len > seq_len) len = seq_len - t;
            ikv_block_desc d = ikv_block_desc_default();
            d.name = "b";
            d.start = t;
            d.end = t + len;
            d.policy = (ikv_policy)(ikvt_next(&rng) % IKV_POLICY_COUNT);
            d.kind = (ikv_block_kind)(ikvt_next(&rng) % IKV_KIND_COUNT);
            d.score = (float)((double)(ikvt_next(&rng) % 11) / 10.0); /* coarse: ties happen */
            d.precision_hint = ikvt_uniform(&rng) < 0.2 ? (ikv_format)(ikvt_next(&rng) % IKV_FMT_COUNT) : IKV_FMT_AUTO;
            IKVT_OK(ikv_layout_add(l, &d, NULL));
            ++nb;
            t += len + (ikvt_uniform(&rng) < 0.3 ? (uint32_t)(ikvt_uniform(&rng) * 40) : 0);
        }
        ikv_router_config c = ikv_router_default_config();
        c.page_size = 8u << (ikvt_next(&rng) % 5);
        c.token_budget = ikvt_uniform(&rng) < 0.25 ? 0 : (uint32_t)(ikvt_uniform(&rng) * seq_len);
        c.recent_window = (uint32_t)(ikvt_uniform(&rng) * (seq_len / 2 + 50));
        c.memory_pressure = (float)ikvt_uniform(&rng);
        c.attend_threshold = (float)((double)(ikvt_next(&rng) % 11) / 10.0);
        c.unlabeled_score = (float)ikvt_uniform(&rng);
        c.prefetch_depth = (uint32_t)(ikvt_next(&rng) % 8);
        c.over_budget = (ikv_over_budget)(ikvt_next(&rng) % 2);
        ikv_plan *plan = route_checked(&c, l, seq_len);
        if (plan) {
            check_invariants(plan, l, &c);
            ikv_plan_destroy(plan);
            ++routed;
        } else {
            ++failed;
        }
        ikv_layout_destroy(l);
    }
    assert_true(routed > 100);
    assert_true(failed > 0); /* FAIL over-budget cases were exercised */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_reason),       cmocka_unit_test(test_over_budget),
        cmocka_unit_test(test_over_budget_keeps_score_blocks),
        cmocka_unit_test(test_pressure_and_hints), cmocka_unit_test(test_router_config_errors),
        cmocka_unit_test(test_plan_accessor_errors), cmocka_unit_test(test_random_property),
        cmocka_unit_test(test_attend_inside_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
