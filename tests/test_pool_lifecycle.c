/* A long seeded random run of append / fork / truncate / evict / destroy /
 * format change against a plain shadow model: which pages each sequence
 * holds (and which are shared), their formats, lengths, evicted flags,
 * stored values within each format's bound, and the pool's accounting after
 * every operation. It ends with every page and byte given back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 1, D = 64, P = 8, ROW = H * D, MAXT = 160, MAXPG = MAXT / P, MAXSEQ = 6, MAXPAGES = 4096 };
enum { N_OPS = 8000, CAP_PAGES = 24 };

/* How often each rejected outcome was predicted and seen. */
static int g_nomem, g_shared, g_evicted;

typedef struct spage {
    int refs;
    ikv_format format;
    double base; /* error bound of the values the page was last quantized from */
} spage;

typedef struct sseq {
    int live;
    ikv_seq_id id;
    uint32_t len;
    int page[MAXPG]; /* shadow page index, -1 evicted */
    float k[L][MAXT * ROW], v[L][MAXT * ROW];
} sseq;

static spage g_pages[MAXPAGES];
static int g_n_pages;
static sseq g_seqs[MAXSEQ];
static uint64_t g_pb[IKV_FMT_COUNT];
static ikv_pool *g_pool;
static ikvt_rng g_rng = {20261122};

/* One quantization's bound for values in [-1.1, 1.1] (FORMATS.md, with the group scale at its largest). */
static double tol(ikv_format f) {
    switch (f) {
        case IKV_FMT_F16: return 1.2 * ldexp(1.0, -11);
        case IKV_FMT_BF16: return 1.2 * ldexp(1.0, -8);
        case IKV_FMT_FP8_E4M3: return 1.2 / 16 + (1.2 / 448) / 1024;
        case IKV_FMT_INT8: return 0.5 * 1.2 / 127 * 1.01;
        case IKV_FMT_INT4: return 0.5 * 2.4 / 15 * 1.01;
        default: return 0;
    }
}

static int new_page(ikv_format f) {
    for (int i = 0; i < MAXPAGES; ++i)
        if (g_pages[i].refs == 0) {
            g_pages[i].refs = 1;
            g_pages[i].format = f;
            g_pages[i].base = 0;
            if (i >= g_n_pages) g_n_pages = i + 1;
            return i;
        }
    fail_msg("shadow page table full");
    return -1;
}

static uint64_t used_bytes(uint64_t *pages_out) {
    uint64_t b = 0, n = 0;
    for (int i = 0; i < g_n_pages; ++i)
        if (g_pages[i].refs > 0) {
            b += g_pb[g_pages[i].format];
            ++n;
        }
    if (pages_out) *pages_out = n;
    return b;
}
static uint64_t capacity(void) { return CAP_PAGES * g_pb[IKV_FMT_F16]; }

static uint32_t rnd(uint32_t n) { return (uint32_t)(ikvt_next(&g_rng) % n); }
static sseq *pick(void) {
    int live[MAXSEQ], n = 0;
    for (int i = 0; i < MAXSEQ; ++i)
        if (g_seqs[i].live) live[n++] = i;
    return n ? &g_seqs[live[rnd(n)]] : NULL;
}
static sseq *free_slot(void) {
    for (int i = 0; i < MAXSEQ; ++i)
        if (!g_seqs[i].live) return &g_seqs[i];
    return NULL;
}
static uint32_t n_pages(const sseq *s) { return (s->len + P - 1) / P; }

static void check_stats(void) {
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(g_pool, &st));
    uint64_t pages;
    const uint64_t used = used_bytes(&pages);
    assert_true(st.used_bytes == used);
    assert_true(st.pages_used == pages);
    assert_true(st.reserved_bytes >= st.used_bytes);
    uint64_t by_fmt[IKV_FMT_COUNT] = {0}, tokens = 0, staging = 0;
    uint32_t nseq = 0;
    for (int i = 0; i < g_n_pages; ++i)
        if (g_pages[i].refs > 0) by_fmt[g_pages[i].format]++;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        assert_true(st.pages_by_format[f] == by_fmt[f]);
        assert_true(st.bytes_by_format[f] == by_fmt[f] * g_pb[f]);
    }
    for (int i = 0; i < MAXSEQ; ++i)
        if (g_seqs[i].live) {
            ++nseq;
            tokens += g_seqs[i].len;
            if (g_seqs[i].len % P) staging += (uint64_t)L * 2 * ROW * P * sizeof(float);
        }
    assert_int_equal(st.n_sequences, nseq);
    assert_true(st.tokens_total == tokens);
    assert_true(st.staging_bytes == staging);
}

static void check_seq(const sseq *s) {
    static float k[MAXT * ROW], v[MAXT * ROW];
    uint32_t len;
    IKVT_OK(ikv_seq_length(g_pool, s->id, &len));
    assert_int_equal(len, s->len);
    for (uint32_t p = 0; p < n_pages(s); ++p) {
        int ev;
        IKVT_OK(ikv_seq_is_evicted(g_pool, s->id, p * P, &ev));
        assert_int_equal(ev, s->page[p] < 0);
        if (ev) continue;
        const spage *pg = &g_pages[s->page[p]];
        ikv_format f;
        IKVT_OK(ikv_seq_page_format(g_pool, s->id, p, &f));
        assert_int_equal(f, pg->format);
        const uint32_t t1 = (p + 1) * P < s->len ? (p + 1) * P : s->len;
        const double bound = pg->base + tol(pg->format) + 1e-6;
        for (uint32_t l = 0; l < L; ++l) {
            IKVT_OK(ikv_seq_read(g_pool, s->id, l, p * P, t1, k, v));
            for (size_t i = 0; i < (size_t)(t1 - p * P) * ROW; ++i) {
                const size_t o = (size_t)p * P * ROW + i;
                if (!(fabs((double)k[i] - s->k[l][o]) <= bound && fabs((double)v[i] - s->v[l][o]) <= bound)) {
                    print_error("seq %u page %u (%s, base %.3g): k %.6g vs %.6g, v %.6g vs %.6g, bound %.3g\n",
                                s->id, p, ikv_format_name(pg->format), pg->base, k[i], s->k[l][o], v[i], s->v[l][o],
                                bound);
                    fail();
                }
            }
        }
    }
}

static void release(int page) {
    if (page >= 0) g_pages[page].refs--;
}

static void op_append(sseq *s) {
    static float k[L * MAXT * ROW], v[L * MAXT * ROW];
    uint32_t n = 1 + (rnd(4) == 0 ? rnd(3 * P) : rnd(3));
    if (s->len + n > MAXT) n = MAXT - s->len;
    if (n == 0) return;
    for (size_t i = 0; i < (size_t)L * n * ROW; ++i) {
        k[i] = (float)(2 * ikvt_uniform(&g_rng) - 1);
        v[i] = (float)(2 * ikvt_uniform(&g_rng) - 1);
    }
    /* predict the page need */
    const uint32_t first = s->len / P, last = (s->len + n - 1) / P;
    uint64_t need = 0;
    for (uint32_t p = first; p <= last; ++p) {
        if (p < n_pages(s)) {
            if (g_pages[s->page[p]].refs > 1) need += g_pb[g_pages[s->page[p]].format];
        } else {
            need += g_pb[IKV_FMT_F16];
        }
    }
    const int expect_nomem = used_bytes(NULL) + need > capacity();
    const int per_layer = rnd(2);
    for (uint32_t l = 0; l < (per_layer ? L : 1); ++l) {
        ikv_append a = ikv_append_default(g_pool, n);
        a.layer = per_layer ? l : IKV_ALL_LAYERS;
        a.k = k + (per_layer ? (size_t)l * n * ROW : 0);
        a.v = v + (per_layer ? (size_t)l * n * ROW : 0);
        const ikv_status st = ikv_pool_append(g_pool, s->id, &a);
        if (expect_nomem) {
            IKVT_EXPECT_STATUS(st, IKV_E_NOMEM, "capacity");
            g_nomem++;
            return;
        }
        IKVT_OK(st);
    }
    for (uint32_t p = first; p <= last; ++p) {
        if (p < n_pages(s)) {
            spage *old = &g_pages[s->page[p]];
            if (old->refs > 1) { /* copy on write */
                const int c = new_page(old->format);
                g_pages[c].base = old->base;
                old->refs--;
                s->page[p] = c;
            }
        } else {
            s->page[p] = new_page(IKV_FMT_F16);
        }
    }
    for (uint32_t l = 0; l < L; ++l) {
        memcpy(s->k[l] + (size_t)s->len * ROW, k + (size_t)l * n * ROW, (size_t)n * ROW * sizeof(float));
        memcpy(s->v[l] + (size_t)s->len * ROW, v + (size_t)l * n * ROW, (size_t)n * ROW * sizeof(float));
    }
    s->len += n;
}

static void op_truncate(sseq *s) {
    const uint32_t n = rnd(s->len + 1 < 2 * P ? s->len + 1 : 2 * P);
    const uint32_t nl = s->len - n, keep_pages = (nl + P - 1) / P;
    const int partial = nl % P != 0;
    if (n > 0 && partial && s->page[nl / P] < 0) {
        IKVT_EXPECT_STATUS(ikv_seq_truncate(g_pool, s->id, n), IKV_E_EVICTED, "evicted");
        g_evicted++;
        return;
    }
    /* the pages the rollback releases (dropped, not shared) pay for the copy of a shared tail */
    uint64_t freed = 0;
    for (uint32_t p = keep_pages; p < n_pages(s); ++p)
        if (s->page[p] >= 0 && g_pages[s->page[p]].refs == 1) freed += g_pb[g_pages[s->page[p]].format];
    if (n > 0 && partial && g_pages[s->page[nl / P]].refs > 1 &&
        used_bytes(NULL) - freed + g_pb[g_pages[s->page[nl / P]].format] > capacity()) {
        IKVT_EXPECT_STATUS(ikv_seq_truncate(g_pool, s->id, n), IKV_E_NOMEM, "capacity");
        return;
    }
    IKVT_OK(ikv_seq_truncate(g_pool, s->id, n));
    if (n == 0) return;
    for (uint32_t p = keep_pages; p < n_pages(s); ++p) release(s->page[p]);
    if (partial) {
        spage *old = &g_pages[s->page[nl / P]];
        if (old->refs > 1) {
            const int c = new_page(old->format);
            g_pages[c].base = old->base;
            old->refs--;
            s->page[nl / P] = c;
        }
        spage *t = &g_pages[s->page[nl / P]];
        t->base += tol(t->format); /* re-staged from stored values, quantized again */
    }
    s->len = nl;
}

static void op_evict(sseq *s) {
    const uint32_t full = s->len / P;
    if (full == 0) {
        IKVT_EXPECT_STATUS(ikv_seq_evict(g_pool, s->id, 0, P), IKV_E_RANGE, "tail");
        return;
    }
    const uint32_t b = rnd(full), e = b + 1 + rnd(full - b < 3 ? full - b : 3);
    IKVT_OK(ikv_seq_evict(g_pool, s->id, b * P, e * P));
    for (uint32_t p = b; p < e; ++p) {
        release(s->page[p]);
        s->page[p] = -1;
    }
}

static void op_format(sseq *s) {
    if (n_pages(s) == 0) return;
    const uint32_t p = rnd(n_pages(s));
    const ikv_format f = (ikv_format)rnd(IKV_FMT_COUNT);
    const ikv_status st = ikv_seq_set_page_format(g_pool, s->id, p, f);
    if (s->page[p] < 0) {
        IKVT_EXPECT_STATUS(st, IKV_E_EVICTED, "evicted");
        return;
    }
    spage *pg = &g_pages[s->page[p]];
    if (pg->refs > 1) {
        IKVT_EXPECT_STATUS(st, IKV_E_SHARED, "shared");
        g_shared++;
        return;
    }
    if (f == pg->format) {
        IKVT_OK(st);
        return;
    }
    if (used_bytes(NULL) - g_pb[pg->format] + g_pb[f] > capacity()) {
        IKVT_EXPECT_STATUS(st, IKV_E_NOMEM, "capacity");
        return;
    }
    IKVT_OK(st);
    pg->base += tol(pg->format) + tol(f);
    pg->format = f;
}

static void op_fork(sseq *s) {
    sseq *c = free_slot();
    if (c == NULL) return;
    IKVT_OK(ikv_seq_fork(g_pool, s->id, &c->id));
    const ikv_seq_id id = c->id;
    memcpy(c, s, sizeof *c);
    c->id = id;
    for (uint32_t p = 0; p < n_pages(c); ++p)
        if (c->page[p] >= 0) g_pages[c->page[p]].refs++;
}

static void op_destroy(sseq *s) {
    IKVT_OK(ikv_seq_destroy(g_pool, s->id));
    for (uint32_t p = 0; p < n_pages(s); ++p) release(s->page[p]);
    s->live = 0;
}

static void op_create(void) {
    sseq *s = free_slot();
    if (s == NULL) return;
    memset(s, 0, sizeof *s);
    IKVT_OK(ikv_seq_create(g_pool, &s->id));
    s->live = 1;
}

static void test_lifecycle(void **state) {
    (void)state;
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P});
    IKVT_OK(ikv_pool_create(&c, &g_pool));
    for (int f = 0; f < IKV_FMT_COUNT; ++f) g_pb[f] = ikv_pool_page_bytes(g_pool, (ikv_format)f);
    ikv_pool_destroy(g_pool);
    c.capacity_bytes = capacity();
    IKVT_OK(ikv_pool_create(&c, &g_pool));
    int counts[8] = {0};
    for (int i = 0; i < N_OPS; ++i) {
        sseq *s = pick();
        const uint32_t r = rnd(100);
        if (s == NULL || r < 5) {
            op_create();
            counts[0]++;
        } else if (r < 50) {
            op_append(s);
            counts[1]++;
        } else if (r < 60) {
            op_fork(s);
            counts[2]++;
        } else if (r < 72) {
            op_truncate(s);
            counts[3]++;
        } else if (r < 80) {
            op_evict(s);
            counts[4]++;
        } else if (r < 92) {
            op_format(s);
            counts[5]++;
        } else {
            op_destroy(s);
            counts[6]++;
        }
        check_stats();
        if (i % 7 == 0)
            for (int j = 0; j < MAXSEQ; ++j)
                if (g_seqs[j].live) check_seq(&g_seqs[j]);
    }
    for (int j = 0; j < MAXSEQ; ++j)
        if (g_seqs[j].live) {
            check_seq(&g_seqs[j]);
            op_destroy(&g_seqs[j]);
        }
    check_stats();
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(g_pool, &st));
    assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.staging_bytes == 0 && st.tokens_total == 0);
    assert_int_equal(st.n_sequences, 0);
    for (int f = 0; f < IKV_FMT_COUNT; ++f) assert_true(st.pages_by_format[f] == 0 && st.bytes_by_format[f] == 0);
    /* every kind of operation ran many times */
    for (int k = 0; k < 7; ++k) assert_true(counts[k] > 20);
    print_message("rejected as predicted: %d NOMEM, %d SHARED, %d EVICTED\n", g_nomem, g_shared, g_evicted);
    assert_true(g_nomem > 5 && g_shared > 5 && g_evicted > 5);
    ikv_pool_destroy(g_pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
