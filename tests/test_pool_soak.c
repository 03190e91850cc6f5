/* A randomized lifecycle soak checked against a model of the pool: sequences
 * are created, destroyed, appended to (all layers or one), forked, truncated,
 * evicted and re-formatted (F16 <-> BF16) at random, near the pool's capacity,
 * and decoded with the step's token passed to the decode (args->append: the
 * output checked against a float64 attention over the model's tokens);
 * every refused call must change nothing, and after every batch the pool must
 * hold exactly what the model says: each live sequence's length per layer and
 * every live token's K and V (values k/8 for small k are exact in F16 and
 * BF16), evicted pages reported as such, and the stats' sequence and token
 * counts. IKV_SOAK_OPS sets the number of operations (default 100000; the
 * documented long run is 1000000). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 2, D = 32, P = 8, ROW = H * D, MAXS = 6, MAXT = 96, BATCH = 500 };

typedef struct model_seq {
    int live;
    ikv_seq_id id;
    uint32_t len[L];        /* tokens per layer */
    uint8_t evicted[MAXT / P];
    float k[L][MAXT * ROW], v[L][MAXT * ROW];
} model_seq;

static model_seq g_m[MAXS];


static float small_value(ikvt_rng *r) { return (float)((int)(ikvt_next(r) % 33) - 16) / 8.0f; }

static uint32_t min_len(const model_seq *s) { return s->len[0] < s->len[1] ? s->len[0] : s->len[1]; }

static void check_all(ikv_pool *pool) {
    static float k[MAXT * ROW], v[MAXT * ROW];
    uint64_t tokens = 0;
    uint32_t live = 0;
    for (int i = 0; i < MAXS; ++i) {
        const model_seq *s = &g_m[i];
        if (!s->live) continue;
        ++live;
        uint32_t len = 0;
        IKVT_OK(ikv_seq_length(pool, s->id, &len));
        assert_int_equal(len, min_len(s));
        tokens += len;
        for (uint32_t l = 0; l < L; ++l) {
            uint32_t ll = 0;
            IKVT_OK(ikv_seq_layer_length(pool, s->id, l, &ll));
            assert_int_equal(ll, s->len[l]);
            for (uint32_t p = 0; p * P < s->len[l]; ++p) {
                const uint32_t b = p * P, e = b + P < s->len[l] ? b + P : s->len[l];
                if (s->evicted[p]) {
                    int ev = 0;
                    IKVT_OK(ikv_seq_is_evicted(pool, s->id, b, &ev));
                    assert_true(ev);
                    continue;
                }
                IKVT_OK(ikv_seq_read(pool, s->id, l, b, e, k, v));
                assert_memory_equal(k, s->k[l] + (size_t)b * ROW, (size_t)(e - b) * ROW * sizeof(float));
                assert_memory_equal(v, s->v[l] + (size_t)b * ROW, (size_t)(e - b) * ROW * sizeof(float));
            }
        }
    }
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    assert_int_equal(st.n_sequences, live);
    assert_int_equal(st.tokens_total, tokens);
    assert_true(st.used_bytes <= st.capacity_bytes && st.used_bytes == st.pages_used * ikv_pool_page_bytes(pool, IKV_FMT_F16));
}

static model_seq *pick_live(ikvt_rng *r) {
    const int start = (int)(ikvt_next(r) % MAXS);
    for (int j = 0; j < MAXS; ++j)
        if (g_m[(start + j) % MAXS].live) return &g_m[(start + j) % MAXS];
    return NULL;
}

static model_seq *pick_free(void) {
    for (int j = 0; j < MAXS; ++j)
        if (!g_m[j].live) return &g_m[j];
    return NULL;
}

/* One random operation; refused ones must leave the pool as the model is.
 * Returns the kind (0..8) and sets *applied. */
enum { OP_CREATE, OP_DESTROY, OP_APPEND, OP_FORK, OP_TRUNCATE, OP_EVICT, OP_FORMAT, OP_DECODE_APPEND, OP_KINDS };
static const char *const kOpNames[OP_KINDS] = {"create", "destroy", "append", "fork", "truncate", "evict", "format",
                                               "decode-append"};

/* One token appended to one layer of s by the decode that reads it
 * (ikv_decode_args.append), GQA group 2; the output must be the float64
 * attention of the query over the model's tokens, the new one included.
 * Sequences with an evicted page in that layer are left to the other ops. */
static int decode_append(ikv_pool *pool, ikv_decoder *dec, ikvt_rng *r, model_seq *s, int *applied) {
    enum { HQ = 2 * H };
    static float k[ROW], v[ROW], q[HQ * D], out[HQ * D];
    const uint32_t l = (uint32_t)(ikvt_next(r) % L), len = s->len[l];
    if (len + 1 > MAXT) return OP_DECODE_APPEND;
    for (uint32_t p = 0; p * P <= len; ++p)
        if (s->evicted[p]) return OP_DECODE_APPEND;
    for (uint32_t i = 0; i < ROW; ++i) k[i] = small_value(r), v[i] = small_value(r);
    for (uint32_t i = 0; i < HQ * D; ++i) q[i] = small_value(r);
    ikv_append a = ikv_append_default(pool, 1);
    a.layer = l;
    a.k = k;
    a.v = v;
    ikv_decode_args d = ikv_decode_args_default();
    d.layer = l;
    d.n_seqs = 1;
    d.seqs = &s->id;
    d.n_query_tokens = 1;
    d.n_q_heads = HQ;
    d.q = q;
    d.q_dtype = IKV_DTYPE_F32;
    d.out = out;
    d.out_dtype = IKV_DTYPE_F32;
    d.append = &a;
    const ikv_status st = ikv_decode(dec, pool, &d);
    uint32_t now = 0;
    IKVT_OK(ikv_seq_layer_length(pool, s->id, l, &now));
    if (st != IKV_OK) { /* no room for the token's page: the header lets IKV_E_NOMEM alone leave it appended */
        assert_int_equal(st, IKV_E_NOMEM);
        assert_true(now == len || now == len + 1);
    } else {
        assert_int_equal(now, len + 1);
    }
    if (now == len) return OP_DECODE_APPEND;
    memcpy(s->k[l] + (size_t)len * ROW, k, sizeof k);
    memcpy(s->v[l] + (size_t)len * ROW, v, sizeof v);
    s->len[l] = now;
    *applied = 1;
    if (st != IKV_OK) return OP_DECODE_APPEND;
    static double w[MAXT];
    for (uint32_t hq = 0; hq < HQ; ++hq) {
        const uint32_t h = hq / (HQ / H);
        double m = -1e300, sum = 0.0;
        for (uint32_t t = 0; t < now; ++t) {
            double dot = 0.0;
            for (uint32_t e = 0; e < D; ++e) dot += (double)q[hq * D + e] * s->k[l][(size_t)t * ROW + h * D + e];
            w[t] = dot / sqrt((double)D);
            if (w[t] > m) m = w[t];
        }
        for (uint32_t t = 0; t < now; ++t) sum += w[t] = exp(w[t] - m);
        for (uint32_t e = 0; e < D; ++e) {
            double o = 0.0;
            for (uint32_t t = 0; t < now; ++t) o += w[t] * s->v[l][(size_t)t * ROW + h * D + e];
            o /= sum;
            assert_true(fabs(out[hq * D + e] - o) <= 1e-4 * (1.0 + fabs(o)));
        }
    }
    return OP_DECODE_APPEND;
}

static int step(ikv_pool *pool, ikv_decoder *dec, ikvt_rng *r, int *applied) {
    static float k[L * 16 * ROW], v[L * 16 * ROW];
    model_seq *s = pick_live(r);
    const uint32_t op = (uint32_t)(ikvt_next(r) % 11);
    *applied = 0;
    if (op == 0 || s == NULL) {
        model_seq *f = pick_free();
        if (f == NULL) return OP_CREATE;
        memset(f, 0, sizeof *f);
        IKVT_OK(ikv_seq_create(pool, &f->id));
        f->live = 1;
        *applied = 1;
        return OP_CREATE;
    }
    if (op == 1) {
        IKVT_OK(ikv_seq_destroy(pool, s->id));
        s->live = 0;
        *applied = 1;
        return OP_DESTROY;
    }
    if (op <= 4) { /* append to all layers, or to one */
        const uint32_t n = 1 + (uint32_t)(ikvt_next(r) % 12), one = ikvt_next(r) % 3 == 0;
        const uint32_t layer = one ? (uint32_t)(ikvt_next(r) % L) : IKV_ALL_LAYERS;
        const uint32_t l0 = one ? layer : 0, l1 = one ? layer + 1 : L;
        for (uint32_t l = l0; l < l1; ++l)
            if (s->len[l] + n > MAXT) return OP_APPEND;
        for (size_t i = 0; i < (size_t)L * n * ROW; ++i) k[i] = small_value(r), v[i] = small_value(r);
        ikv_append a = ikv_append_default(pool, n);
        a.layer = layer;
        a.k = k;
        a.v = v;
        const ikv_status st = ikv_pool_append(pool, s->id, &a);
        if (st != IKV_OK) {
            assert_true(st == IKV_E_NOMEM || st == IKV_E_EVICTED);
            return OP_APPEND; /* the batch check proves nothing changed */
        }
        for (uint32_t l = l0; l < l1; ++l) {
            const float *src_k = one ? k : k + (size_t)l * n * ROW, *src_v = one ? v : v + (size_t)l * n * ROW;
            memcpy(s->k[l] + (size_t)s->len[l] * ROW, src_k, (size_t)n * ROW * sizeof(float));
            memcpy(s->v[l] + (size_t)s->len[l] * ROW, src_v, (size_t)n * ROW * sizeof(float));
            s->len[l] += n;
        }
        *applied = 1;
        return OP_APPEND;
    }
    if (op == 5) {
        model_seq *f = pick_free();
        if (f == NULL) return OP_FORK;
        ikv_seq_id child;
        const ikv_status st = ikv_seq_fork(pool, s->id, &child);
        if (st != IKV_OK) {
            assert_int_equal(st, IKV_E_NOMEM);
            return OP_FORK;
        }
        memcpy(f, s, sizeof *f);
        f->id = child;
        *applied = 1;
        return OP_FORK;
    }
    if (op <= 7) { /* truncate (layers of equal length) */
        const uint32_t len = min_len(s), n = len ? (uint32_t)(ikvt_next(r) % (len + 1)) : 0;
        const ikv_status st = ikv_seq_truncate(pool, s->id, n);
        if (s->len[0] != s->len[1]) {
            assert_int_equal(st, IKV_E_STATE);
            return OP_TRUNCATE;
        }
        if (st != IKV_OK) {
            assert_true(st == IKV_E_NOMEM || st == IKV_E_EVICTED);
            return OP_TRUNCATE;
        }
        const uint32_t keep = len - n;
        for (uint32_t l = 0; l < L; ++l) s->len[l] = keep;
        for (uint32_t p = (keep + P - 1) / P; p < MAXT / P; ++p) s->evicted[p] = 0; /* dropped pages are gone */
        *applied = 1;
        return OP_TRUNCATE;
    }
    if (op == 10) return decode_append(pool, dec, r, s, applied);
    if (op == 8) { /* evict whole pages before the tail */
        const uint32_t tail = min_len(s) / P, b = tail ? (uint32_t)(ikvt_next(r) % tail) : 0;
        const uint32_t e = tail ? b + (uint32_t)(ikvt_next(r) % (tail - b + 1)) : 0;
        if (ikv_seq_evict(pool, s->id, b * P, e * P) != IKV_OK) return OP_EVICT;
        for (uint32_t p = b; p < e; ++p) s->evicted[p] = 1;
        *applied = 1;
        return OP_EVICT;
    }
    /* F16 <-> BF16: values k/8 are exact in both */
    const uint32_t pages = min_len(s) / P;
    if (pages == 0) return OP_FORMAT;
    const uint32_t p = (uint32_t)(ikvt_next(r) % pages);
    const ikv_status st = ikv_seq_set_page_format(pool, s->id, p, ikvt_next(r) % 2 ? IKV_FMT_BF16 : IKV_FMT_F16);
    assert_true(st == IKV_OK || st == IKV_E_SHARED || st == IKV_E_EVICTED || st == IKV_E_NOMEM);
    *applied = st == IKV_OK;
    return OP_FORMAT;
}

static void test_lifecycle_soak(void **state) {
    (void)state;
    const char *env = getenv("IKV_SOAK_OPS");
    const long ops = env ? atol(env) : 100000;
    ikv_pool *probe = ikvt_make_pool(
        (ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P, .capacity_bytes = 1u << 20});
    const uint64_t pb = ikv_pool_page_bytes(probe, IKV_FMT_F16);
    ikv_pool_destroy(probe);
    /* Room for about 40 pages: six sequences of up to 12 pages each run into it. */
    ikv_pool *pool = ikvt_make_pool(
        (ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P, .capacity_bytes = 40 * pb});
    memset(g_m, 0, sizeof g_m);
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = 1;
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    ikvt_rng r = {20261125};
    long done[OP_KINDS] = {0}, tried[OP_KINDS] = {0};
    for (long i = 0; i < ops; ++i) {
        int applied = 0;
        const int kind = step(pool, dec, &r, &applied);
        ++tried[kind];
        done[kind] += applied;
        if ((i + 1) % BATCH == 0) check_all(pool);
    }
    check_all(pool);
    printf("soak: %ld operations:", ops);
    for (int i = 0; i < OP_KINDS; ++i) printf(" %s %ld/%ld", kOpNames[i], done[i], tried[i]);
    printf(" (applied/tried; the rest refused or not applicable, and checked)\n");
    for (int i = 0; i < OP_KINDS; ++i) assert_true(done[i] > 0); /* every kind of change happened */
    for (int i = 0; i < MAXS; ++i)
        if (g_m[i].live) IKVT_OK(ikv_seq_destroy(pool, g_m[i].id));
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.n_sequences == 0 && st.staging_bytes == 0);
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
