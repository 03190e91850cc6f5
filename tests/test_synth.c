/* Synthetic agentic sessions: determinism, exact tiling, proportions and
 * policies at 8K/32K/128K, routable by a default router, and bad configs. */
#include <string.h>

#include "support.h"

#define MAXB 600

static size_t list(const ikv_layout *l, ikv_block_info *out) {
    size_t n = ikv_layout_count(l);
    assert_true(n <= MAXB);
    for (size_t i = 0; i < n; ++i) IKVT_OK(ikv_layout_at(l, i, &out[i]));
    return n;
}

static ikv_block_info g_a[MAXB], g_b[MAXB];

static void test_default_config(void **state) {
    (void)state;
    ikv_synth_config c = ikv_synth_default_config();
    assert_int_equal(c.struct_size, sizeof c);
    assert_int_equal(c.seq_len, 32768);
    assert_int_equal(c.n_documents, 8);
    assert_int_equal(c.n_tool_outputs, 4);
    assert_int_equal(c.n_turns, 6);
    assert_int_equal(c.seed, 42);
}

static void test_sizes_and_determinism(void **state) {
    (void)state;
    const uint32_t sizes[] = {8192, 32768, 131072, 1024};
    for (int si = 0; si < 4; ++si) {
        ikv_synth_config c = ikv_synth_default_config();
        c.seq_len = sizes[si];
        c.seed = 1000 + (uint64_t)si;
        ikv_layout *a = NULL, *b = NULL;
        IKVT_OK(ikv_synth_layout(&c, &a));
        IKVT_OK(ikv_synth_layout(&c, &b));
        size_t na = list(a, g_a), nb = list(b, g_b);
        assert_int_equal(na, nb);
        assert_memory_equal(g_a, g_b, na * sizeof g_a[0]); /* same seed, same layout */
        assert_int_equal(na, 3 + c.n_documents + c.n_tool_outputs + c.n_turns);
        /* Exact tiling of [0, seq_len). */
        assert_int_equal(g_a[0].start, 0);
        for (size_t i = 1; i < na; ++i) assert_int_equal(g_a[i].start, g_a[i - 1].end);
        assert_int_equal(g_a[na - 1].end, c.seq_len);
        IKVT_OK(ikv_layout_validate(a, c.seq_len));
        /* Shape: system ALWAYS ~2%, memory GLOBAL ~3%, newest turn RECENT last, scratchpad SKIP. */
        assert_int_equal(g_a[0].policy, IKV_POLICY_ALWAYS);
        assert_int_equal(g_a[0].kind, IKV_KIND_SYSTEM_PROMPT);
        double sys = (double)(g_a[0].end - g_a[0].start) / c.seq_len;
        assert_true(sys > 0.01 && sys < 0.03);
        assert_int_equal(g_a[1].policy, IKV_POLICY_GLOBAL);
        double mem = (double)(g_a[1].end - g_a[1].start) / c.seq_len;
        assert_true(mem > 0.02 && mem < 0.04);
        assert_int_equal(g_a[na - 1].policy, IKV_POLICY_RECENT);
        assert_int_equal(g_a[na - 2].kind, IKV_KIND_SCRATCHPAD);
        assert_int_equal(g_a[na - 2].policy, IKV_POLICY_SKIP);
        double lo = 1, hi = 0;
        int docs = 0, doc_skip = 0, tools = 0, turns_attend = 0;
        for (size_t i = 0; i < na; ++i) {
            if (g_a[i].kind == IKV_KIND_RETRIEVED_DOC) {
                ++docs;
                doc_skip += g_a[i].policy == IKV_POLICY_SKIP;
                if (g_a[i].score < lo) lo = g_a[i].score;
                if (g_a[i].score > hi) hi = g_a[i].score;
            }
            if (g_a[i].kind == IKV_KIND_TOOL_OUTPUT) {
                ++tools;
                assert_int_equal(g_a[i].policy, IKV_POLICY_ATTEND);
                assert_true(g_a[i].score < 0.3f);
            }
            if (g_a[i].kind == IKV_KIND_CONVERSATION && g_a[i].policy == IKV_POLICY_ATTEND) ++turns_attend;
        }
        assert_int_equal(docs, 8);
        assert_int_equal(tools, 4);
        assert_int_equal(turns_attend, 5);
        assert_true(doc_skip >= 1 && doc_skip < docs);
        assert_true(lo < 0.25 && hi > 0.75); /* spread over [0, 1] */
        /* Routable by the default router. */
        ikv_router *r = NULL;
        ikv_router_config rc = ikv_router_default_config();
        rc.token_budget = c.seq_len / 4;
        rc.over_budget = IKV_OVER_BUDGET_KEEP;
        IKVT_OK(ikv_router_create(&rc, &r));
        ikv_plan *plan = NULL;
        IKVT_OK(ikv_router_route(r, a, c.seq_len, &plan));
        ikv_plan_summary s;
        IKVT_OK(ikv_plan_get_summary(plan, &s));
        assert_true(s.tokens_selected > 0 && s.tokens_selected < c.seq_len);
        ikv_plan_destroy(plan);
        ikv_router_destroy(r);
        /* Another seed gives another layout. */
        c.seed += 7;
        ikv_layout *d = NULL;
        IKVT_OK(ikv_synth_layout(&c, &d));
        size_t nd = list(d, g_b);
        assert_int_equal(nd, na);
        assert_true(memcmp(g_a, g_b, na * sizeof g_a[0]) != 0);
        ikv_layout_destroy(d);
        ikv_layout_destroy(a);
        ikv_layout_destroy(b);
    }
}

static void test_extremes(void **state) {
    (void)state;
    ikv_synth_config c = ikv_synth_default_config();
    c.seq_len = 1024;
    c.n_documents = 0;
    c.n_tool_outputs = 0;
    c.n_turns = 1;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_synth_layout(&c, &l));
    size_t n = list(l, g_a);
    assert_int_equal(n, 4);
    assert_int_equal(g_a[n - 1].end, 1024);
    ikv_layout_destroy(l);
    c.seq_len = 131072;
    c.n_documents = 256;
    c.n_tool_outputs = 256;
    c.n_turns = 40;
    IKVT_OK(ikv_synth_layout(&c, &l));
    n = list(l, g_a);
    assert_int_equal(n, 3 + 256 + 256 + 40);
    for (size_t i = 1; i < n; ++i) assert_int_equal(g_a[i].start, g_a[i - 1].end);
    assert_int_equal(g_a[n - 1].end, 131072);
    ikv_layout_destroy(l);
}

static void test_bad_configs(void **state) {
    (void)state;
    ikv_layout *l = (ikv_layout *)0x1;
    ikv_synth_config def = ikv_synth_default_config(), c;
    IKVT_EXPECT_STATUS(ikv_synth_layout(NULL, &l), IKV_E_NULL, "config");
    IKVT_EXPECT_STATUS(ikv_synth_layout(&def, NULL), IKV_E_NULL, "out");
    c = def; c.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "struct_size");
    c = def; c.seq_len = 1023;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "seq_len");
    c = def; c.n_documents = 257;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "n_documents");
    c = def; c.n_tool_outputs = 257;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "n_tool_outputs");
    c = def; c.n_turns = 0;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "n_turns");
    c = def; c.seq_len = 1024; c.n_turns = 2000;
    IKVT_EXPECT_STATUS(ikv_synth_layout(&c, &l), IKV_E_INVALID, "blocks");
    assert_ptr_equal(l, (ikv_layout *)0x1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_config),
        cmocka_unit_test(test_sizes_and_determinism),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
