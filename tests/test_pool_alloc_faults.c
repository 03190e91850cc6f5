/* Pool calls whose host allocations fail partway (support/alloc_faults.cpp
 * makes the n-th allocation of the call and every later one fail, for n =
 * 0, 1, ... until the call succeeds): each failed call returns IKV_E_NOMEM
 * and changes nothing (pages in use, used bytes, every sequence's length
 * and stored values), and once every sequence is destroyed no page stays
 * charged (under AddressSanitizer, LeakSanitizer also checks that the
 * bookkeeping from operator new, such as page records, is freed; mimalloc's
 * own segments are not tracked). A reserve used to commit its new pages after a block table could
 * still need memory: pages charged, half a room taken (the fourth audit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

void ikvt_faults_arm(long n);
long ikvt_faults_disarm(void);

enum { D = 32, P = 8, LEN = 13, MAX_SEQS = 2 };

typedef struct world {
    ikv_pool *pool;
    ikv_seq_id seq[MAX_SEQS];
    uint32_t n_seqs;
    ikv_plan *plan;
} world;

static void append_tokens(ikv_pool *pool, ikv_seq_id seq, uint32_t n, float base) {
    float k[40 * D], v[40 * D];
    for (uint32_t i = 0; i < n * D; ++i) k[i] = base + 0.01f * (float)(i % 97), v[i] = base - 0.02f * (float)(i % 89);
    ikv_append a = ikv_append_default(pool, n);
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, seq, &a));
}

/* A pool holding sequence 0 (LEN tokens, a partial tail page) and, for the
 * cases that share pages, its fork. */
static world make_world(int with_fork) {
    world w = {0};
    w.pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = 1, .head_dim = D, .page_size = P,
                                             .capacity_bytes = 1u << 20, .default_format = IKV_FMT_F16});
    IKVT_OK(ikv_seq_create(w.pool, &w.seq[0]));
    append_tokens(w.pool, w.seq[0], LEN, 0.5f);
    w.n_seqs = 1;
    if (with_fork) IKVT_OK(ikv_seq_fork(w.pool, w.seq[0], &w.seq[w.n_seqs++]));
    static const ikv_token_range all[] = {{0, 2 * P}};
    IKVT_OK(ikv_plan_from_ranges(all, 1, 2 * P, P, IKV_FMT_INT8, &w.plan));
    return w;
}

/* What a failed call must leave as it was. */
typedef struct snapshot {
    uint64_t pages_used, used_bytes;
    uint32_t length[MAX_SEQS];
    float kv[MAX_SEQS][2][LEN * D];
} snapshot;

static void take(const world *w, snapshot *s) {
    memset(s, 0, sizeof *s);
    const ikv_pool_stats st = ikvt_pool_stats(w->pool);
    s->pages_used = st.pages_used, s->used_bytes = st.used_bytes;
    for (uint32_t i = 0; i < w->n_seqs; ++i) {
        IKVT_OK(ikv_seq_length(w->pool, w->seq[i], &s->length[i]));
        IKVT_OK(ikv_seq_read(w->pool, w->seq[i], 0, 0, s->length[i], s->kv[i][0], s->kv[i][1]));
    }
}

typedef ikv_status (*op_fn)(world *w);
static ikv_status op_reserve(world *w) { return ikv_pool_reserve(w->pool, w->seq, 1, 24); }
static ikv_status op_reserve_shared(world *w) { return ikv_pool_reserve(w->pool, w->seq, 2, 9); }
static ikv_status op_truncate_shared(world *w) { return ikv_seq_truncate(w->pool, w->seq[0], 5); }
static ikv_status op_fork(world *w) {
    ikv_seq_id child;
    return ikv_seq_fork(w->pool, w->seq[0], &child); /* (destroyed with the pool on success) */
}
static ikv_status op_apply_formats(world *w) { return ikv_seq_apply_plan_formats(w->pool, w->seq[0], w->plan); }
static ikv_status op_append(world *w) {
    float k[20 * D], v[20 * D];
    for (int i = 0; i < 20 * D; ++i) k[i] = 0.25f, v[i] = -0.25f;
    ikv_append a = ikv_append_default(w->pool, 20);
    a.k = k;
    a.v = v;
    return ikv_pool_append(w->pool, w->seq[0], &a);
}

static void run_op(const char *name, op_fn op, int with_fork, int allocates) {
    int failures = 0;
    for (long n = 0;; ++n) {
        assert_true(n < 1000);
        world w = make_world(with_fork);
        snapshot before, after;
        take(&w, &before);
        ikvt_faults_arm(n);
        const ikv_status st = op(&w);
        const long failed = ikvt_faults_disarm();
        if (st == IKV_OK && failed == 0) { /* every allocation of the call let through: done */
            ikv_plan_destroy(w.plan);
            ikv_pool_destroy(w.pool);
            if (allocates) assert_true(failures > 0); /* the call allocates: some n made it fail */
            return;
        }
        if (st != IKV_OK) {
            ++failures;
            if (st != IKV_E_NOMEM)
                fail_msg("%s, allocation %ld failing: %s (%s), not IKV_E_NOMEM", name, n, ikv_status_name(st),
                         ikv_last_error());
            take(&w, &after);
            if (memcmp(&before, &after, sizeof before) != 0)
                fail_msg("%s, allocation %ld failing: returned IKV_E_NOMEM but changed the pool (pages %llu -> "
                         "%llu, bytes %llu -> %llu)",
                         name, n, (unsigned long long)before.pages_used, (unsigned long long)after.pages_used,
                         (unsigned long long)before.used_bytes, (unsigned long long)after.used_bytes);
        }
        /* (a call may also succeed despite a failed allocation it could do without) */
        for (uint32_t i = 0; i < w.n_seqs; ++i) IKVT_OK(ikv_seq_destroy(w.pool, w.seq[i]));
        const ikv_pool_stats st2 = ikvt_pool_stats(w.pool);
        if (st == IKV_OK && op == op_fork) { /* the child it made still holds the pages */
        } else if (st2.pages_used != 0 || st2.used_bytes != 0) {
            fail_msg("%s, allocation %ld failing: %llu pages (%llu bytes) still charged with no sequence left", name,
                     n, (unsigned long long)st2.pages_used, (unsigned long long)st2.used_bytes);
        }
        ikv_plan_destroy(w.plan);
        ikv_pool_destroy(w.pool);
    }
}

static void test_reserve(void **state) { (void)state, run_op("reserve", op_reserve, 0, 1); }
static void test_reserve_shared(void **state) { (void)state, run_op("reserve of a fork and its parent", op_reserve_shared, 1, 1); }
/* (it may find its copy room in a slab it has: no host allocation needed) */
static void test_truncate_shared(void **state) { (void)state, run_op("truncate into a shared tail", op_truncate_shared, 1, 0); }
static void test_fork(void **state) { (void)state, run_op("fork", op_fork, 0, 1); }
static void test_apply_formats(void **state) { (void)state, run_op("apply_plan_formats", op_apply_formats, 0, 1); }
static void test_append(void **state) { (void)state, run_op("append", op_append, 0, 1); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve),        cmocka_unit_test(test_reserve_shared),
        cmocka_unit_test(test_truncate_shared), cmocka_unit_test(test_fork),
        cmocka_unit_test(test_apply_formats),  cmocka_unit_test(test_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
