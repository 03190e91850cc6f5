/* ikv_plan_from_ranges: exact bounds against a token-by-token expectation,
 * merging of touching ranges, and every bad input. */
#include <stdlib.h>
#include <string.h>

#include "support.h"

static void check_ranges_plan(const ikv_token_range *ranges, size_t n, uint32_t seq_len, uint32_t P, ikv_format fmt) {
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, n, seq_len, P, fmt, &plan));
    uint8_t *sel = calloc(seq_len, 1);
    for (size_t i = 0; i < n; ++i)
        for (uint32_t t = ranges[i].begin; t < ranges[i].end; ++t) sel[t] = 1;
    const ikv_plan_page *pages;
    size_t np, k = 0;
    IKVT_OK(ikv_plan_pages(plan, &pages, &np));
    uint32_t n_pages = (seq_len + P - 1) / P, selected = 0, pages_sel = 0, skipped = 0;
    const uint32_t *sk;
    size_t nsk;
    IKVT_OK(ikv_plan_skipped_pages(plan, &sk, &nsk));
    for (uint32_t p = 0; p < n_pages; ++p) {
        uint32_t pb = p * P, pe = pb + P < seq_len ? pb + P : seq_len;
        int any = 0;
        for (uint32_t t = pb; t < pe;) {
            if (!sel[t]) { ++t; continue; }
            uint32_t b = t;
            while (t < pe && sel[t]) ++t;
            assert_true(k < np);
            assert_int_equal(pages[k].page, p);
            assert_int_equal(pages[k].token_begin, b);
            assert_int_equal(pages[k].token_end, t);
            assert_int_equal(pages[k].format, fmt);
            assert_int_equal(pages[k].flags, (b != pb || t != pb + P) ? IKV_PAGE_PARTIAL : 0);
            selected += t - b;
            any = 1;
            ++k;
        }
        pages_sel += (uint32_t)any;
        if (!any) {
            assert_true(skipped < nsk);
            assert_int_equal(sk[skipped++], p);
        }
        ikv_format f;
        IKVT_OK(ikv_plan_page_format(plan, p, &f));
        assert_int_equal(f, fmt);
    }
    assert_int_equal(k, np);
    assert_int_equal(skipped, nsk);
    ikv_plan_summary s;
    IKVT_OK(ikv_plan_get_summary(plan, &s));
    assert_int_equal(s.seq_len, seq_len);
    assert_int_equal(s.page_size, P);
    assert_int_equal(s.tokens_selected, selected);
    assert_int_equal(s.tokens_skipped, seq_len - selected);
    assert_int_equal(s.tokens_by_format[fmt], selected);
    assert_int_equal(s.pages_selected, pages_sel);
    assert_int_equal(s.pages_total, n_pages);
    assert_int_equal(s.mandatory_tokens, 0);
    assert_int_equal(s.over_budget, 0);
    const uint32_t *pf;
    size_t npf;
    IKVT_OK(ikv_plan_prefetch(plan, &pf, &npf));
    assert_int_equal(npf, 0);
    const ikv_block_decision *d;
    size_t nd;
    IKVT_OK(ikv_plan_decisions(plan, &d, &nd));
    assert_int_equal(nd, 0);
    free(sel);
    ikv_plan_destroy(plan);
}

static void test_exact_bounds(void **state) {
    (void)state;
    /* Unsorted, touching ([40,50)+[50,70)), two runs in one page (page 0), partial tail. */
    const ikv_token_range r[] = {{50, 70}, {3, 5}, {9, 12}, {40, 50}, {96, 100}, {64 + 32, 64 + 32}};
    check_ranges_plan(r, 5, 100, 16, IKV_FMT_INT8);
    check_ranges_plan(r, 5, 100, 8, IKV_FMT_F16);
    const ikv_token_range whole[] = {{0, 128}};
    check_ranges_plan(whole, 1, 128, 128, IKV_FMT_INT4);
    check_ranges_plan(NULL, 0, 10, 8, IKV_FMT_BF16); /* nothing read: every page skipped */
    /* Random sets of disjoint ranges. */
    ikvt_rng rng = {99};
    for (int it = 0; it < 100; ++it) {
        uint32_t seq_len = 1 + (uint32_t)(ikvt_uniform(&rng) * 2000);
        ikv_token_range rs[64];
        size_t n = 0;
        uint32_t t = 0;
        while (n < 64) {
            t += (uint32_t)(ikvt_uniform(&rng) * 60);
            uint32_t len = 1 + (uint32_t)(ikvt_uniform(&rng) * 50);
            if (t + len > seq_len) break;
            rs[n].begin = t;
            rs[n].end = t + len;
            ++n;
            t += len;
        }
        for (size_t i = n; i > 1; --i) { /* shuffle: order must not matter */
            size_t j = ikvt_next(&rng) % i;
            ikv_token_range tmp = rs[i - 1];
            rs[i - 1] = rs[j];
            rs[j] = tmp;
        }
        check_ranges_plan(rs, n, seq_len, 8u << (ikvt_next(&rng) % 5), (ikv_format)(ikvt_next(&rng) % IKV_FMT_COUNT));
    }
}

static void test_bad_ranges(void **state) {
    (void)state;
    ikv_plan *plan = (ikv_plan *)0x1;
    const ikv_token_range ok[] = {{0, 10}};
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(NULL, 1, 100, 16, IKV_FMT_F16, &plan), IKV_E_NULL, "ranges");
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ok, 1, 100, 16, IKV_FMT_F16, NULL), IKV_E_NULL, "plan_out");
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ok, 1, 0, 16, IKV_FMT_F16, &plan), IKV_E_INVALID, "seq_len");
    const uint32_t bad_p[] = {0, 4, 24, 256};
    for (int i = 0; i < 4; ++i)
        IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ok, 1, 100, bad_p[i], IKV_FMT_F16, &plan), IKV_E_INVALID, "page_size");
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ok, 1, 100, 16, IKV_FMT_AUTO, &plan), IKV_E_INVALID, "format");
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ok, 1, 100, 16, IKV_FMT_COUNT, &plan), IKV_E_INVALID, "format");
    const ikv_token_range empty[] = {{0, 10}, {20, 20}};
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(empty, 2, 100, 16, IKV_FMT_F16, &plan), IKV_E_INVALID, "ranges[1]");
    const ikv_token_range rev[] = {{30, 20}};
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(rev, 1, 100, 16, IKV_FMT_F16, &plan), IKV_E_INVALID, "ranges[0]");
    const ikv_token_range past[] = {{0, 10}, {90, 101}};
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(past, 2, 100, 16, IKV_FMT_F16, &plan), IKV_E_RANGE, "seq_len 100");
    const ikv_token_range ov[] = {{50, 60}, {0, 10}, {55, 70}};
    IKVT_EXPECT_STATUS(ikv_plan_from_ranges(ov, 3, 100, 16, IKV_FMT_F16, &plan), IKV_E_OVERLAP, "overlap");
    assert_ptr_equal(plan, (ikv_plan *)0x1);
}

static void test_cost_from_ranges(void **state) {
    (void)state;
    /* One full INT8 page and 3 tokens of another, D = 64, 2 layers x 2 kv-heads. */
    const ikv_token_range r[] = {{0, 16}, {16, 19}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(r, 2, 40, 16, IKV_FMT_INT8, &plan));
    ikv_model_shape sh = ikvt_model_shape(2, 4, 2, 64);
    ikv_plan_cost c;
    IKVT_OK(ikv_plan_get_cost(plan, &sh, &c));
    const uint64_t D = 64, sub = 4;
    const uint64_t int8 = (2 * D * 16 + 4 * D + 4 * 16) + (2 * D * 3 + 4 * D + 4 * 3);
    assert_int_equal(c.bytes_by_format[IKV_FMT_INT8], int8 * sub);
    assert_int_equal(c.bytes_total, int8 * sub);
    assert_int_equal(c.bytes_dense_f16, 4 * D * 40 * sub);
    assert_int_equal(c.flops, 4ull * 19 * D * 4 * 2);
    assert_int_equal(c.flops_dense, 4ull * 40 * D * 4 * 2);
    /* Shapes whose figures pass 64 bits are refused, *out unchanged (never
     * wrapped). With n_q_heads = n_kv_heads = 2^20 and D = 64, bytes_dense_f16
     * = flops_dense = 4 * 64 * 40 * 2^20 * n_layers: 1717986918 layers is the
     * most that fits. */
    sh.n_q_heads = sh.n_kv_heads = 1u << 20;
    sh.n_layers = 1717986918u;
    IKVT_OK(ikv_plan_get_cost(plan, &sh, &c));
    assert_true(c.flops_dense == 4ull * 64 * 40 * (1ull << 20) * 1717986918u);
    assert_true(c.bytes_dense_f16 == c.flops_dense);
    const ikv_plan_cost before = c;
    sh.n_layers = 1717986919u;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &sh, &c), IKV_E_INVALID, "64 bits");
    assert_memory_equal(&before, &c, sizeof c);
    sh.n_layers = sh.n_q_heads = sh.n_kv_heads = UINT32_MAX;
    sh.head_dim = 0xFFFFFFF0u;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &sh, &c), IKV_E_INVALID, "64 bits");
    ikv_plan_destroy(plan);
    /* A plan that reads nothing: only its dense figures pass 64 bits. */
    IKVT_OK(ikv_plan_from_ranges(NULL, 0, 128000, 128, IKV_FMT_F16, &plan));
    sh.head_dim = 3291364672u;
    sh.n_layers = 3130009905u;
    sh.n_q_heads = sh.n_kv_heads = 2078799982u;
    IKVT_EXPECT_STATUS(ikv_plan_get_cost(plan, &sh, &c), IKV_E_INVALID, "64 bits");
    assert_memory_equal(&before, &c, sizeof c);
    ikv_plan_destroy(plan);
    /* INT4 near the largest head_dim: its ceil(D / 32) V groups counted without 32-bit wrap. */
    const ikv_token_range r10 = {0, 10};
    IKVT_OK(ikv_plan_from_ranges(&r10, 1, 100, 16, IKV_FMT_INT4, &plan));
    sh = ikvt_model_shape(1, 1, 1, 0xFFFFFFF0u);
    IKVT_OK(ikv_plan_get_cost(plan, &sh, &c));
    const uint64_t big = 0xFFFFFFF0ull, groups = (big + 31) / 32;
    assert_true(c.bytes_by_format[IKV_FMT_INT4] == 2 * (big / 2) * 10 + 4 * big + 4 * 10 * groups);
    ikv_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_bounds),
        cmocka_unit_test(test_bad_ranges),
        cmocka_unit_test(test_cost_from_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
