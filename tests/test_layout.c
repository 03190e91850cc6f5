/* Layouts: adding, ordering, ids, lookups, updates, clones, and every bad
 * input leaving the layout exactly as it was. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#define MAXB 64

typedef struct listing {
    size_t n;
    ikv_block_info b[MAXB];
} listing;

static void list_blocks(const ikv_layout *l, listing *out) {
    memset(out, 0, sizeof *out);
    out->n = ikv_layout_count(l);
    assert_true(out->n <= MAXB);
    for (size_t i = 0; i < out->n; ++i) IKVT_OK(ikv_layout_at(l, i, &out->b[i]));
}

static void assert_unchanged(const ikv_layout *l, const listing *before) {
    listing now;
    list_blocks(l, &now);
    assert_int_equal(now.n, before->n);
    assert_memory_equal(now.b, before->b, sizeof(ikv_block_info) * now.n);
}

static ikv_block_desc desc(const char *name, uint32_t start, uint32_t end, ikv_policy policy, float score) {
    ikv_block_desc d = ikv_block_desc_default();
    d.name = name;
    d.start = start;
    d.end = end;
    d.policy = policy;
    d.score = score;
    return d;
}

static uint32_t add(ikv_layout *l, const char *name, uint32_t start, uint32_t end) {
    ikv_block_desc d = desc(name, start, end, IKV_POLICY_ATTEND, 0.5f);
    uint32_t id = 12345;
    IKVT_OK(ikv_layout_add(l, &d, &id));
    return id;
}

static void test_defaults(void **state) {
    (void)state;
    ikv_block_desc d = ikv_block_desc_default();
    assert_int_equal(d.struct_size, sizeof d);
    assert_int_equal(d.kind, IKV_KIND_OTHER);
    assert_int_equal(d.policy, IKV_POLICY_ATTEND);
    assert_true(d.score == 0.5f);
    assert_int_equal(d.precision_hint, IKV_FMT_AUTO);
    assert_null(d.name);
    assert_int_equal(d.start, 0);
    assert_int_equal(d.end, 0);
    assert_int_equal(d.turn, 0);
    IKVT_EXPECT_STATUS(ikv_layout_create(NULL), IKV_E_NULL, "ikv_layout_create");
    assert_int_equal(ikv_layout_count(NULL), 0);
    ikv_layout_destroy(NULL);
}

static void test_sorted_ids_lookup(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    /* Added out of order, with gaps. */
    const uint32_t starts[] = {500, 100, 900, 0, 300};
    const uint32_t ends[] = {600, 200, 1000, 50, 400};
    const char *names[] = {"e", "b", "f", "a", "c"};
    uint32_t ids[5];
    for (int i = 0; i < 5; ++i) ids[i] = add(l, names[i], starts[i], ends[i]);
    for (int i = 0; i < 5; ++i)
        for (int j = 0; j < i; ++j) assert_int_not_equal(ids[i], ids[j]);
    assert_int_equal(ikv_layout_count(l), 5);
    listing ls;
    list_blocks(l, &ls);
    for (size_t i = 1; i < ls.n; ++i) assert_true(ls.b[i - 1].end <= ls.b[i].start);
    for (int i = 0; i < 5; ++i) {
        ikv_block_info info;
        IKVT_OK(ikv_layout_get(l, ids[i], &info));
        assert_int_equal(info.start, starts[i]);
        assert_int_equal(info.end, ends[i]);
        assert_string_equal(info.name, names[i]);
        assert_int_equal(info.id, ids[i]);
    }
    /* Every token: found in its block, or NOT_FOUND in a gap. */
    for (uint32_t t = 0; t < 1100; ++t) {
        int inside = -1;
        for (int i = 0; i < 5; ++i)
            if (t >= starts[i] && t < ends[i]) inside = i;
        uint32_t id = 777;
        if (inside >= 0) {
            IKVT_OK(ikv_layout_find_token(l, t, &id));
            assert_int_equal(id, ids[inside]);
        } else {
            IKVT_EXPECT_STATUS(ikv_layout_find_token(l, t, &id), IKV_E_NOT_FOUND, "token");
            assert_int_equal(id, 777);
        }
    }
    /* Ids are never reused after removal. */
    IKVT_OK(ikv_layout_remove(l, ids[2]));
    uint32_t again = add(l, "g", 900, 1000);
    for (int i = 0; i < 5; ++i) assert_int_not_equal(again, ids[i]);
    IKVT_EXPECT_STATUS(ikv_layout_get(l, ids[2], &ls.b[0]), IKV_E_NOT_FOUND, "id");
    /* Validate: all blocks end by 1000. */
    IKVT_OK(ikv_layout_validate(l, 1000));
    IKVT_EXPECT_STATUS(ikv_layout_validate(l, 999), IKV_E_RANGE, "'g'");
    ikv_layout_destroy(l);
}

static void test_update_score_clone(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    uint32_t a = add(l, "a", 0, 10);
    uint32_t b = add(l, "b", 10, 20);
    uint32_t c = add(l, "c", 30, 40);
    /* Multi-turn re-scoring. */
    IKVT_OK(ikv_layout_set_score(l, b, 0.25f));
    ikv_block_info info;
    IKVT_OK(ikv_layout_get(l, b, &info));
    assert_true(info.score == 0.25f);
    /* Update that moves a block past another keeps start order and the id. */
    ikv_block_desc d = desc("a-moved", 50, 60, IKV_POLICY_SKIP, 1.0f);
    d.kind = IKV_KIND_SCRATCHPAD;
    d.precision_hint = IKV_FMT_INT8;
    d.turn = 3;
    IKVT_OK(ikv_layout_update(l, a, &d));
    IKVT_OK(ikv_layout_at(l, 2, &info));
    assert_int_equal(info.id, a);
    assert_string_equal(info.name, "a-moved");
    assert_int_equal(info.kind, IKV_KIND_SCRATCHPAD);
    assert_int_equal(info.policy, IKV_POLICY_SKIP);
    assert_int_equal(info.precision_hint, IKV_FMT_INT8);
    assert_int_equal(info.turn, 3);
    IKVT_OK(ikv_layout_at(l, 0, &info));
    assert_int_equal(info.id, b);
    /* Update may overlap its own old range. */
    d = desc("c", 25, 45, IKV_POLICY_ATTEND, 0.5f);
    IKVT_OK(ikv_layout_update(l, c, &d));
    IKVT_OK(ikv_layout_get(l, c, &info));
    assert_int_equal(info.start, 25);
    /* A clone is independent. */
    ikv_layout *k = NULL;
    IKVT_OK(ikv_layout_clone(l, &k));
    listing before;
    list_blocks(l, &before);
    assert_unchanged(k, &before);
    IKVT_OK(ikv_layout_set_score(k, b, 0.75f));
    IKVT_OK(ikv_layout_remove(k, c));
    uint32_t knew = add(k, "new", 100, 110);
    assert_unchanged(l, &before);
    /* Both keep handing out fresh ids. */
    uint32_t lnew = add(l, "new", 100, 110);
    assert_int_equal(lnew, knew);
    assert_true(lnew > c);
    IKVT_EXPECT_STATUS(ikv_layout_clone(NULL, &k), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_clone(l, NULL), IKV_E_NULL, "out");
    ikv_layout_destroy(k);
    ikv_layout_destroy(l);
}

static void test_names(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    char longest[IKV_NAME_MAX + 1];
    memset(longest, 'x', IKV_NAME_MAX);
    longest[IKV_NAME_MAX] = '\0';
    ikv_block_desc d = desc(longest, 0, 5, IKV_POLICY_ATTEND, 0.5f);
    uint32_t id;
    IKVT_OK(ikv_layout_add(l, &d, &id));
    longest[0] = 'y'; /* the layout copied the name */
    ikv_block_info info;
    IKVT_OK(ikv_layout_get(l, id, &info));
    assert_int_equal(strlen(info.name), IKV_NAME_MAX);
    assert_int_equal(info.name[0], 'x');
    ikv_layout_destroy(l);
}

/* Every bad input: status, sentence, and the layout unchanged. */
static void test_bad_inputs(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    uint32_t a = add(l, "a", 100, 200);
    uint32_t b = add(l, "b", 300, 400);
    listing before;
    list_blocks(l, &before);
    uint32_t id = 999;

    ikv_block_desc d = desc("n", 0, 10, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_add(NULL, &d, &id), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_add(l, NULL, &id), IKV_E_NULL, "block");
    d.name = NULL;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_NULL, "name");
    d.name = "";
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "empty");
    char too_long[IKV_NAME_MAX + 2];
    memset(too_long, 'z', IKV_NAME_MAX + 1);
    too_long[IKV_NAME_MAX + 1] = '\0';
    d.name = too_long;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "IKV_NAME_MAX");
    d = desc("n", 0, 10, IKV_POLICY_ATTEND, 0.5f);
    d.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "struct_size");

    /* Overlaps: inside, left edge, right edge, identical, enclosing. */
    const uint32_t ov[][2] = {{120, 130}, {50, 101}, {199, 250}, {100, 200}, {90, 410}, {399, 401}};
    for (size_t i = 0; i < sizeof ov / sizeof ov[0]; ++i) {
        d = desc("ov", ov[i][0], ov[i][1], IKV_POLICY_ATTEND, 0.5f);
        IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_OVERLAP, "overlaps");
    }
    /* Empty and reversed ranges. */
    d = desc("r", 10, 10, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_RANGE, "end");
    d = desc("r", 900, 800, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_RANGE, "[900, 800)");
    /* Scores. */
    const float bad_scores[] = {NAN, INFINITY, -INFINITY, -0.01f, 1.01f};
    for (size_t i = 0; i < 5; ++i) {
        d = desc("s", 0, 10, IKV_POLICY_ATTEND, bad_scores[i]);
        IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "score");
        IKVT_EXPECT_STATUS(ikv_layout_set_score(l, a, bad_scores[i]), IKV_E_INVALID, "score");
        d.start = 100;
        d.end = 150;
        IKVT_EXPECT_STATUS(ikv_layout_update(l, a, &d), IKV_E_INVALID, "score");
    }
    /* Enums. */
    d = desc("k", 0, 10, IKV_POLICY_ATTEND, 0.5f);
    d.kind = IKV_KIND_COUNT;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "kind");
    d.kind = (ikv_block_kind)-1;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "kind");
    d = desc("p", 0, 10, IKV_POLICY_COUNT, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "policy");
    d.policy = (ikv_policy)-3;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "policy");
    d = desc("h", 0, 10, IKV_POLICY_ATTEND, 0.5f);
    d.precision_hint = IKV_FMT_COUNT;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "precision_hint");
    d.precision_hint = (ikv_format)254;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, &id), IKV_E_INVALID, "precision_hint");

    /* Update: unknown id, overlapping another block, bad range. */
    d = desc("u", 0, 10, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_update(l, 4242, &d), IKV_E_NOT_FOUND, "4242");
    IKVT_EXPECT_STATUS(ikv_layout_update(NULL, a, &d), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_update(l, a, NULL), IKV_E_NULL, "block");
    d = desc("u", 150, 350, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_update(l, a, &d), IKV_E_OVERLAP, "'b'");
    d = desc("u", 150, 100, IKV_POLICY_ATTEND, 0.5f);
    IKVT_EXPECT_STATUS(ikv_layout_update(l, b, &d), IKV_E_RANGE, "end");
    /* Set score / remove / get / at / find with bad handles or ids. */
    IKVT_EXPECT_STATUS(ikv_layout_set_score(NULL, a, 0.5f), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_set_score(l, 4242, 0.5f), IKV_E_NOT_FOUND, "4242");
    IKVT_EXPECT_STATUS(ikv_layout_remove(NULL, a), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_remove(l, 4242), IKV_E_NOT_FOUND, "4242");
    ikv_block_info info;
    IKVT_EXPECT_STATUS(ikv_layout_get(l, 4242, &info), IKV_E_NOT_FOUND, "4242");
    IKVT_EXPECT_STATUS(ikv_layout_get(NULL, a, &info), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_get(l, a, NULL), IKV_E_NULL, "out");
    IKVT_EXPECT_STATUS(ikv_layout_at(l, 2, &info), IKV_E_RANGE, "index 2");
    IKVT_EXPECT_STATUS(ikv_layout_at(NULL, 0, &info), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_at(l, 0, NULL), IKV_E_NULL, "out");
    IKVT_EXPECT_STATUS(ikv_layout_find_token(l, 250, &id), IKV_E_NOT_FOUND, "250");
    IKVT_EXPECT_STATUS(ikv_layout_find_token(l, UINT32_MAX, &id), IKV_E_NOT_FOUND, "token");
    IKVT_EXPECT_STATUS(ikv_layout_find_token(NULL, 150, &id), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_find_token(l, 150, NULL), IKV_E_NULL, "id_out");
    IKVT_EXPECT_STATUS(ikv_layout_validate(NULL, 10), IKV_E_NULL, "layout");
    IKVT_EXPECT_STATUS(ikv_layout_validate(l, 0), IKV_E_RANGE, "seq_len 0");
    assert_int_equal(id, 999); /* no output written on any failure */
    assert_unchanged(l, &before);
    ikv_layout_destroy(l);
}

/* Random adds/updates/removes against a plain array model. */
static void test_random_against_model(void **state) {
    (void)state;
    ikvt_rng r = {7};
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    uint8_t owner[2000]; /* 0 = free, else index+1 into model */
    memset(owner, 0, sizeof owner);
    uint32_t model_id[MAXB], model_start[MAXB], model_end[MAXB];
    int live[MAXB];
    int n = 0;
    for (int step = 0; step < 400; ++step) {
        uint32_t s = (uint32_t)(ikvt_uniform(&r) * 1900), e = s + 1 + (uint32_t)(ikvt_uniform(&r) * 100);
        int clash = 0;
        for (uint32_t t = s; t < e; ++t) clash |= owner[t] != 0;
        double u = ikvt_uniform(&r);
        if (u < 0.6 && n < MAXB) {
            ikv_block_desc d = desc("blk", s, e, IKV_POLICY_ATTEND, 0.5f);
            uint32_t id;
            ikv_status st = ikv_layout_add(l, &d, &id);
            assert_int_equal(st, clash ? IKV_E_OVERLAP : IKV_OK);
            if (!clash) {
                model_id[n] = id; model_start[n] = s; model_end[n] = e; live[n] = 1;
                for (uint32_t t = s; t < e; ++t) owner[t] = (uint8_t)(n + 1);
                ++n;
            }
        } else if (n > 0) {
            int k = (int)(ikvt_uniform(&r) * n);
            if (!live[k]) continue;
            if (u < 0.8) {
                IKVT_OK(ikv_layout_remove(l, model_id[k]));
                for (uint32_t t = model_start[k]; t < model_end[k]; ++t) owner[t] = 0;
                live[k] = 0;
            } else {
                int clash_other = 0;
                for (uint32_t t = s; t < e; ++t) clash_other |= owner[t] != 0 && owner[t] != k + 1;
                ikv_block_desc d = desc("moved", s, e, IKV_POLICY_ATTEND, 0.5f);
                ikv_status st = ikv_layout_update(l, model_id[k], &d);
                assert_int_equal(st, clash_other ? IKV_E_OVERLAP : IKV_OK);
                if (!clash_other) {
                    for (uint32_t t = model_start[k]; t < model_end[k]; ++t) owner[t] = 0;
                    model_start[k] = s; model_end[k] = e;
                    for (uint32_t t = s; t < e; ++t) owner[t] = (uint8_t)(k + 1);
                }
            }
        }
        /* Token ownership agrees everywhere. */
        if (step % 50 == 0)
            for (uint32_t t = 0; t < 2000; ++t) {
                uint32_t id;
                if (owner[t]) {
                    IKVT_OK(ikv_layout_find_token(l, t, &id));
                    assert_int_equal(id, model_id[owner[t] - 1]);
                } else {
                    assert_int_equal(ikv_layout_find_token(l, t, &id), IKV_E_NOT_FOUND);
                }
            }
    }
    listing ls;
    list_blocks(l, &ls);
    size_t live_n = 0;
    for (int k = 0; k < n; ++k) live_n += (size_t)live[k];
    assert_int_equal(ls.n, live_n);
    for (size_t i = 1; i < ls.n; ++i) assert_true(ls.b[i - 1].end <= ls.b[i].start);
    ikv_layout_destroy(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),          cmocka_unit_test(test_sorted_ids_lookup),
        cmocka_unit_test(test_update_score_clone), cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_inputs),        cmocka_unit_test(test_random_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
