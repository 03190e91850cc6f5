/* ikv_decode on CPU pools, checked against the float64 reference
 * (support/reference.c) computed from the K/V the pool STORED (read back with
 * ikv_seq_read), so quantization error is excluded and what remains is the
 * kernel's fp32 arithmetic.
 *
 * CTest runs this program once per IKV_CPU_ISA value; a path this CPU lacks
 * is skipped visibly (exit 77).
 *
 * Tolerances (relative L2 over all outputs of a step, vs float64):
 *   out F32               2e-5   fp32 dot products and online softmax
 *   out F32, INT8 pages,  2e-4   + the softmax weights rounded to int16 per span,
 *   AVX-512 VNNI path            the INT8 values summed as integers
 *                                (docs/FORMATS.md; measured <= 8e-5); every other
 *                                path keeps 2e-5 for INT8 too
 *   out F16               1e-3   + half rounding of the output (2^-11 relative)
 *   out BF16              8e-3   + bfloat16 rounding of the output (2^-8)
 *   lse                   abs 2e-4 * max(1, |lse|)
 * The same bounds hold for every storage format because the reference reads
 * the stored values; INT4's fused multiply-add of scale and minimum differs
 * from the reference's two roundings by one ulp per element, far below 2e-5.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "list_reuse.h"
#include "support.h"

static ikv_decoder *g_dec1; /* 1 thread */
static ikv_decoder *g_dec3; /* 3 threads (more than this machine's cores: exercises split-K) */

/* ---------------------------------------------------------------- fixture */

typedef struct pool_fix {
    ikv_pool *pool;
    ikv_seq_id seq;
    uint32_t L, H, D, P, length;
} pool_fix;

static ikv_pool *make_pool(uint32_t n_layers, uint32_t H, uint32_t D, uint32_t P, ikv_format fmt, uint64_t cap) {
    return ikvt_make_pool((ikvt_pool_spec){.n_layers = n_layers, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                           .capacity_bytes = cap, .default_format = fmt});
}

/* When set, append_random writes exact zeros and values below F16's normal
 * range (subnormal halves) into the keys too: the CPU keys score converts
 * F16 rows of normal halves by a fast path and must agree everywhere. */
static int g_special_keys;

/* Append n random tokens (all layers) to seq; key magnitude of token i may be
 * scaled per page by page_gain (NULL: 1) so query-aware bounds separate. */
static void append_random(ikv_pool *pool, ikv_seq_id seq, uint32_t n_layers, uint32_t H, uint32_t D, uint32_t P,
                          uint32_t first, uint32_t n, ikvt_rng *rng, int page_gain) {
    const size_t per = (size_t)n * H * D;
    float *k = malloc(per * n_layers * sizeof *k), *v = malloc(per * n_layers * sizeof *v);
    assert_non_null(k);
    assert_non_null(v);
    ikvt_fill_normal(rng, k, per * n_layers, 1.0f);
    ikvt_fill_normal(rng, v, per * n_layers, 1.0f);
    if (page_gain)
        for (uint32_t l = 0; l < n_layers; ++l)
            for (uint32_t t = 0; t < n; ++t) {
                const uint32_t page = (first + t) / P;
                const float gain = 0.3f + 0.37f * (float)((page * 7u) % 13u);
                for (size_t j = 0; j < (size_t)H * D; ++j) k[l * per + (size_t)t * H * D + j] *= gain;
            }
    if (g_special_keys)
        for (size_t j = 0; j < per * n_layers; j += 37) k[j] = j % 74 ? 0.0f : 3.0e-6f * (k[j] < 0 ? -1.0f : 1.0f);
    ikv_append a = ikv_append_default(pool, n);
    a.layer = n_layers > 1 ? IKV_ALL_LAYERS : 0;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, seq, &a));
    free(k);
    free(v);
}

static void fix_init(pool_fix *f, uint32_t n_layers, uint32_t H, uint32_t D, uint32_t P, ikv_format fmt,
                     uint32_t length, ikvt_rng *rng, int page_gain) {
    const uint64_t cap = 64ull << 20;
    f->pool = make_pool(n_layers, H, D, P, fmt, cap);
    f->L = n_layers;
    f->H = H;
    f->D = D;
    f->P = P;
    f->length = length;
    IKVT_OK(ikv_seq_create(f->pool, &f->seq));
    for (uint32_t done = 0; done < length;) {  /* several appends: exercises re-quantized partial tails */
        uint32_t n = length - done < 509 ? length - done : 509;
        append_random(f->pool, f->seq, n_layers, H, D, P, done, n, rng, page_gain);
        done += n;
    }
}

static void fix_free(pool_fix *f) { ikv_pool_destroy(f->pool); }

/* ------------------------------------------------------------- reference */

/* Stored K/V of one layer, [length][H][D] floats, and a live flag per token. */
typedef struct stored_kv {
    float *k, *v;
    uint8_t *live;
} stored_kv;

static stored_kv read_stored(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t H, uint32_t D,
                             uint32_t P, uint32_t length) {
    stored_kv s;
    s.k = calloc((size_t)length * H * D + 1, sizeof(float));
    s.v = calloc((size_t)length * H * D + 1, sizeof(float));
    s.live = calloc(length + 1, 1);
    for (uint32_t p0 = 0; p0 < length; p0 += P) {
        const uint32_t p1 = p0 + P < length ? p0 + P : length;
        int ev = 0;
        IKVT_OK(ikv_seq_is_evicted(pool, seq, p0, &ev));
        if (ev) continue;
        IKVT_OK(ikv_seq_read(pool, seq, layer, p0, p1, s.k + (size_t)p0 * H * D, s.v + (size_t)p0 * H * D));
        memset(s.live + p0, 1, p1 - p0);
    }
    return s;
}

static void free_stored(stored_kv *s) {
    free(s->k);
    free(s->v);
    free(s->live);
}

static float dtype_get(const void *base, ikv_dtype dt, size_t i) {
    if (dt == IKV_DTYPE_F16) return ikvt_f16_to_f32(((const uint16_t *)base)[i]);
    if (dt == IKV_DTYPE_BF16) return ikvt_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

/* Random queries in dtype dt: buffer of n elements. */
static void *make_q(ikvt_rng *rng, size_t n, ikv_dtype dt, float sigma) {
    float *f = malloc(n * sizeof *f);
    ikvt_fill_normal(rng, f, n, sigma);
    if (dt == IKV_DTYPE_F32) return f;
    uint16_t *h = malloc(n * sizeof *h);
    if (dt == IKV_DTYPE_F16)
        ikvt_to_f16(f, h, n);
    else
        ikvt_to_bf16(f, h, n);
    free(f);
    return h;
}

/* Reference of one step for one sequence: sel[h * length + i] says whether
 * kv-head h reads token i (before causality). out_ref [nqt][nq][D]. */
static void reference_step(const stored_kv *s, const uint8_t *sel, uint32_t length, uint32_t H, uint32_t D,
                           uint32_t nq, uint32_t nqt, const void *q, ikv_dtype q_dtype, double scale, double softcap,
                           double *out_ref, double *lse_ref) {
    const uint32_t group = nq / H;
    double *kk = malloc(((size_t)length * D + 1) * sizeof *kk), *vv = malloc(((size_t)length * D + 1) * sizeof *vv);
    double *qd = malloc(D * sizeof *qd);
    for (uint32_t t = 0; t < nqt; ++t)
        for (uint32_t hq = 0; hq < nq; ++hq) {
            const uint32_t h = hq / group, qpos = length - nqt + t;
            size_t n = 0;
            for (uint32_t i = 0; i <= qpos; ++i) {
                if (!s->live[i] || !sel[(size_t)h * length + i]) continue;
                for (uint32_t d = 0; d < D; ++d) {
                    kk[n * D + d] = s->k[((size_t)i * H + h) * D + d];
                    vv[n * D + d] = s->v[((size_t)i * H + h) * D + d];
                }
                ++n;
            }
            for (uint32_t d = 0; d < D; ++d) qd[d] = dtype_get(q, q_dtype, ((size_t)t * nq + hq) * D + d);
            ikvt_ref_attention(qd, kk, vv, n, D, scale, softcap, out_ref + ((size_t)t * nq + hq) * D,
                               lse_ref + (size_t)t * nq + hq);
        }
    free(kk);
    free(vv);
    free(qd);
}

/* Selection of a plan (or dense), identical for every kv-head. */
static uint8_t *plan_selection(const ikv_plan *plan, uint32_t length, uint32_t H) {
    uint8_t *sel = calloc((size_t)H * length + 1, 1);
    if (plan == NULL) {
        memset(sel, 1, (size_t)H * length);
        return sel;
    }
    const ikv_plan_page *pages;
    size_t n;
    IKVT_OK(ikv_plan_pages(plan, &pages, &n));
    for (uint32_t h = 0; h < H; ++h)
        for (size_t i = 0; i < n; ++i)
            for (uint32_t t = pages[i].token_begin; t < pages[i].token_end && t < length; ++t)
                sel[(size_t)h * length + t] = 1;
    return sel;
}

typedef struct rank_item {
    double bound;
    size_t index;
} rank_item;

static int cmp_rank(const void *a, const void *b) {
    const rank_item *x = a, *y = b;
    if (x->bound != y->bound) return x->bound < y->bound ? 1 : -1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* The documented query-aware selection, recomputed plainly from the pool's
 * public page summaries: per kv-head, mandatory entries kept, the others by
 * descending Quest bound (group's heads, first query token) while the tokens
 * taken stay within budget. */
/* IKV_TOPK_MASS's rule, plainly (the header's ikv_topk_mode): the budget
 * covering `share` of the candidates' weights n_i * exp(bound_i - top) in rank
 * order, clamped to [min_tokens, max_tokens or unlimited]. The weights sum in
 * float64 here and in the library; a crossing closer than 1e-4 of the total
 * to the target could round either way there, so the test refuses such data
 * (the seeds below have none). */
typedef struct mass_rule {
    int on;
    double share, scale;
    uint32_t min_tokens, max_tokens;
    int hybrid; /* IKV_TOPK_SCORE_HYBRID ranks (with or without the mass rule) */
    int keys;   /* IKV_TOPK_SCORE_KEYS: hybrid candidates ranked again by their keys (set hybrid too) */
    double softcap;
    /* A query memory's queries [q_head][D] (unscaled; NULL: none): `group` more rows per
     * kv-head whose scores count log(decay) lower in the scaled domain. */
    const double *mem_q;
    double decay;
    /* Attention-feedback prior: averages [H][prior_n] (NULL: none) and its weight. */
    const double *prior_avg;
    size_t prior_n;
    double prior_w;
} mass_rule;

static uint64_t mass_rule_budget(const mass_rule *m, const rank_item *rk, size_t nr, const uint32_t *eb,
                                 const uint32_t *ee, uint64_t mandatory) {
    double total = 0;
    for (size_t j = 0; j < nr; ++j) total += (ee[rk[j].index] - eb[rk[j].index]) * exp(m->scale * (rk[j].bound - rk[0].bound));
    const double target = m->share * total;
    double cum = 0;
    uint64_t tokens = mandatory;
    for (size_t j = 0; j < nr && cum < target; ++j) {
        const size_t i = rk[j].index;
        cum += (ee[i] - eb[i]) * exp(m->scale * (rk[j].bound - rk[0].bound));
        tokens += ee[i] - eb[i];
        if (fabs(cum - target) < 1e-4 * total && m->share < 1) {
            print_error("mass rule: weight %.9g crosses the target %.9g too closely for an exact test\n", cum, target);
            fail();
        }
    }
    if (tokens < m->min_tokens) tokens = m->min_tokens;
    if (m->max_tokens && tokens > m->max_tokens) tokens = m->max_tokens;
    return tokens;
}

/* IKV_TOPK_SCORE_KEYS' second pass, plainly (the header's ikv_topk_score):
 * the candidates (rk's prefix that fits M + 2 * (budget - M), M the
 * mandatory tokens taken) get s = log sum_r w_r exp(lse_r - Z_r) from the
 * stored keys in float64; rk becomes them, ranked by s. Returns their count.
 * Scores of neighbours in rank closer than 1e-4 could order either way in the
 * library's float sums, so the test refuses such data (the seeds have none). */
static size_t keys_rerank(const mass_rule *m, const stored_kv *s, uint32_t h, uint32_t H, uint32_t D, uint32_t group,
                          uint32_t nrow, const void *q, ikv_dtype q_dtype, const uint32_t *eb, const uint32_t *ee,
                          rank_item *rk, size_t nr, uint64_t taken, uint64_t budget) {
    const uint64_t cb = budget > taken ? taken + 2 * (budget - taken) : budget;
    size_t nc = 0;
    for (uint64_t t = taken; nc < nr && t + (ee[rk[nc].index] - eb[rk[nc].index]) <= cb; ++nc)
        t += ee[rk[nc].index] - eb[rk[nc].index];
    double *lse = malloc((nc * nrow + 1) * sizeof *lse), *qr = malloc(D * sizeof *qr);
    for (size_t c = 0; c < nc; ++c)
        for (uint32_t r = 0; r < nrow; ++r) {
            const uint32_t hq = h * group + r % group;
            for (uint32_t d = 0; d < D; ++d)
                qr[d] = m->scale * (r < group ? dtype_get(q, q_dtype, (size_t)hq * D + d) : m->mem_q[(size_t)hq * D + d]);
            double mx = -INFINITY, sum = 0;
            for (int pass = 0; pass < 2; ++pass)
                for (uint32_t t = eb[rk[c].index]; t < ee[rk[c].index]; ++t) {
                    double l = 0;
                    for (uint32_t d = 0; d < D; ++d) l += qr[d] * s->k[((size_t)t * H + h) * D + d];
                    if (m->softcap > 0) l = m->softcap * tanh(l / m->softcap);
                    if (pass == 0) mx = l > mx ? l : mx;
                    else sum += exp(l - mx);
                }
            lse[c * nrow + r] = mx + log(sum);
        }
    for (size_t c = 0; c < nc; ++c) rk[c].bound = 0;
    for (uint32_t r = 0; r < nrow; ++r) {
        double mx = -INFINITY, z = 0;
        for (size_t c = 0; c < nc; ++c) mx = lse[c * nrow + r] > mx ? lse[c * nrow + r] : mx;
        for (size_t c = 0; c < nc; ++c) z += exp(lse[c * nrow + r] - mx);
        const double w = r < group ? 1.0 : m->decay;
        for (size_t c = 0; c < nc; ++c) rk[c].bound += w * exp(lse[c * nrow + r] - mx - log(z));
    }
    for (size_t c = 0; c < nc; ++c) rk[c].bound = log(rk[c].bound);
    qsort(rk, nc, sizeof *rk, cmp_rank);
    for (size_t c = 0; c + 1 < nc; ++c)
        if (rk[c].bound - rk[c + 1].bound < 1e-4) {
            print_error("keys rerank: scores %.9g and %.9g too close for an exact test\n", rk[c].bound, rk[c + 1].bound);
            fail();
        }
    free(lse);
    free(qr);
    return nc;
}

static uint8_t *topk_selection(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, const ikv_plan *plan,
                               const stored_kv *s, uint32_t length, uint32_t H, uint32_t D, uint32_t P, uint32_t nq,
                               const void *q, ikv_dtype q_dtype, uint32_t budget, const mass_rule *mass) {
    const uint32_t group = nq / H;
    /* entries: begin, end, mandatory */
    size_t cap = length / P + 2, n = 0;
    uint32_t *eb = NULL, *ee = NULL, *ep = NULL;
    uint8_t *em = NULL;
    const ikv_plan_page *pages = NULL;
    size_t np = 0;
    if (plan) {
        IKVT_OK(ikv_plan_pages(plan, &pages, &np));
        cap = np + 1;
    }
    eb = malloc(cap * 4);
    ee = malloc(cap * 4);
    ep = malloc(cap * 4);
    em = malloc(cap);
    const size_t count = plan ? np : (length + P - 1) / P;
    for (size_t i = 0; i < count; ++i) {
        uint32_t page = plan ? pages[i].page : (uint32_t)i;
        uint32_t b = plan ? pages[i].token_begin : page * P, e = plan ? pages[i].token_end : page * P + P;
        if (e > length) e = length;
        if (b >= e || !s->live[page * P]) continue;
        ep[n] = page;
        eb[n] = b;
        ee[n] = e;
        em[n] = plan ? (pages[i].flags & IKV_PAGE_MANDATORY) != 0 : 0;
        ++n;
    }
    uint8_t *sel = calloc((size_t)H * length + 1, 1);
    rank_item *rk = malloc((n + 1) * sizeof *rk);
    float *kmin = malloc(D * sizeof *kmin), *kmax = malloc(D * sizeof *kmax), *kmean = malloc(D * sizeof *kmean);
    const uint32_t nrow = mass->mem_q ? 2 * group : group; /* the group's heads, then the memory's */
    double *srow = malloc(((size_t)n * nrow + 1) * sizeof *srow), *stop = malloc(nrow * sizeof *stop);
    double *off = malloc(nrow * sizeof *off);
    for (uint32_t r = 0; r < nrow; ++r) off[r] = r < group ? 0.0 : log(mass->decay) / mass->scale; /* unscaled domain */
    for (uint32_t h = 0; h < H; ++h) {
        size_t nr = 0;
        uint64_t taken = 0;
        for (size_t i = 0; i < n; ++i) {
            if (em[i]) {
                taken += ee[i] - eb[i];
                for (uint32_t t = eb[i]; t < ee[i]; ++t) sel[(size_t)h * length + t] = 1;
                continue;
            }
            IKVT_OK(ikv_seq_page_summary(pool, seq, layer, h, ep[i], kmin, kmax, kmean, NULL));
            double best = -INFINITY;
            for (uint32_t r = 0; r < nrow; ++r) {
                const uint32_t g = r % group;
                double sum = 0, mid = 0;
                for (uint32_t d = 0; d < D; ++d) {
                    const double qv = r < group ? dtype_get(q, q_dtype, (size_t)(h * group + g) * D + d)
                                                : mass->mem_q[(size_t)(h * group + g) * D + d];
                    const double a = qv * kmin[d], b = qv * kmax[d];
                    sum += a > b ? a : b;
                    mid += qv * kmean[d];
                }
                srow[nr * nrow + r] = 0.5 * (sum + mid);
                if (sum + off[r] > best) best = sum + off[r];
            }
            rk[nr].bound = best;
            rk[nr].index = i;
            ++nr;
        }
        if (mass->hybrid) { /* each row shifted by its largest s (+ its offset), then the max over rows */
            for (uint32_t r = 0; r < nrow; ++r) {
                stop[r] = -INFINITY;
                for (size_t j = 0; j < nr; ++j) stop[r] = srow[j * nrow + r] > stop[r] ? srow[j * nrow + r] : stop[r];
            }
            for (size_t j = 0; j < nr; ++j) {
                double best = -INFINITY;
                for (uint32_t r = 0; r < nrow; ++r)
                    if (srow[j * nrow + r] - stop[r] + off[r] > best) best = srow[j * nrow + r] - stop[r] + off[r];
                rk[j].bound = best;
            }
        }
        if (mass->prior_avg) { /* max(bound - best, log(w m) in the unscaled domain) where m > 0 */
            double best = -INFINITY;
            for (size_t j = 0; j < nr; ++j) best = rk[j].bound > best ? rk[j].bound : best;
            for (size_t j = 0; j < nr; ++j) {
                const uint32_t page = ep[rk[j].index];
                const double m = page < mass->prior_n ? mass->prior_avg[h * mass->prior_n + page] : 0;
                const double rel = rk[j].bound - best, pr = m > 0 ? log(mass->prior_w * m) / mass->scale : -INFINITY;
                rk[j].bound = pr > rel ? pr : rel;
            }
        }
        qsort(rk, nr, sizeof *rk, cmp_rank);
        if (mass->on) budget = (uint32_t)mass_rule_budget(mass, rk, nr, eb, ee, taken);
        if (mass->keys) nr = keys_rerank(mass, s, h, H, D, group, nrow, q, q_dtype, eb, ee, rk, nr, taken, budget);
        for (size_t j = 0; j < nr; ++j) {
            const size_t i = rk[j].index;
            if (taken + (ee[i] - eb[i]) > budget) break;
            taken += ee[i] - eb[i];
            for (uint32_t t = eb[i]; t < ee[i]; ++t) sel[(size_t)h * length + t] = 1;
        }
    }
    free(rk);
    free(kmin);
    free(kmax);
    free(kmean);
    free(srow);
    free(stop);
    free(off);
    free(eb);
    free(ee);
    free(ep);
    free(em);
    return sel;
}

/* --------------------------------------------------------- one checked step */

typedef struct step_cfg {
    uint32_t layers, H, group, D, P, length, nqt;
    ikv_format fmt;
    const ikv_token_range *ranges; /* NULL: dense */
    size_t n_ranges;
    const ikv_token_range *evict;
    size_t n_evict;
    float scale, softcap, q_sigma;
    ikv_dtype q_dtype, out_dtype;
    uint32_t topk, layer;
    mass_rule mass; /* mass.on: IKV_TOPK_MASS with topk as its upper limit */
    uint32_t memory_turns; /* > 0: a query memory of that many remembered turns joins the selection */
    uint32_t memory_slots; /* its config's turns: 0 = one decayed mean, else the last turns kept apart */
    int routed; /* the plan comes from the router: an ALWAYS system block and a RECENT window (mandatory pages) */
    uint64_t seed;
} step_cfg;

static step_cfg base_cfg(void) {
    step_cfg c;
    memset(&c, 0, sizeof c);
    c.layers = 1;
    c.H = 2;
    c.group = 4;
    c.D = 64;
    c.P = 16;
    c.length = 300;
    c.nqt = 1;
    c.fmt = IKV_FMT_F16;
    c.q_sigma = 1.0f;
    c.q_dtype = IKV_DTYPE_F32;
    c.out_dtype = IKV_DTYPE_F32;
    c.seed = 1;
    return c;
}

/* Whether this process's INT8 values are summed as integers: the avx512 path
 * on a CPU with AVX512-VNNI, IKV_CPU_VNNI not off (include/intentkv.h). */
static int int8_values_as_integers(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (ikv_runtime_info_get(&info) != IKV_OK || strcmp(info.cpu_isa, "avx512") != 0) return 0;
    const char *env = getenv("IKV_CPU_VNNI");
    if (env && (strcmp(env, "off") == 0 || strcmp(env, "0") == 0)) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

static double out_tol(ikv_dtype dt, ikv_format fmt) {
    if (dt == IKV_DTYPE_F32) return fmt == IKV_FMT_INT8 && int8_values_as_integers() ? 2e-4 : 2e-5;
    return dt == IKV_DTYPE_F16 ? 1e-3 : 8e-3;
}

/* fmt: the format of the pages the step read (IKV_FMT_INT8 wherever any is INT8). */
static void compare(const void *out, ikv_dtype out_dtype, ikv_format fmt, const float *lse, const double *out_ref,
                    const double *lse_ref, size_t n_rows, uint32_t D, const char *what) {
    const size_t n = n_rows * D;
    float *o = malloc(n * sizeof *o);
    for (size_t i = 0; i < n; ++i) o[i] = dtype_get(out, out_dtype, i);
    const double rel = ikvt_rel_l2(o, out_ref, n);
    if (!(rel <= out_tol(out_dtype, fmt))) {
        print_error("%s: rel L2 %.3g > %.3g\n", what, rel, out_tol(out_dtype, fmt));
        fail();
    }
    for (size_t r = 0; r < n_rows; ++r) {
        if (isinf(lse_ref[r])) {
            if (!(isinf(lse[r]) && lse[r] < 0)) {
                print_error("%s: row %zu lse %g, expected -inf\n", what, r, (double)lse[r]);
                fail();
            }
            for (uint32_t d = 0; d < D; ++d) assert_true(o[r * D + d] == 0.0f);
            continue;
        }
        const double tol = 2e-4 * (fabs(lse_ref[r]) > 1 ? fabs(lse_ref[r]) : 1);
        if (!(fabs(lse[r] - lse_ref[r]) <= tol)) {
            print_error("%s: row %zu lse %.9g vs %.9g\n", what, r, (double)lse[r], lse_ref[r]);
            fail();
        }
    }
    free(o);
}

static size_t dtype_size(ikv_dtype dt) { return dt == IKV_DTYPE_F32 ? 4 : 2; }

/* ikv_decoder_last_selection reports, per kv-head, exactly the live tokens of
 * sel as maximal runs. */
static void expect_last_selection(const ikv_decoder *dec, uint32_t seq_index, const uint8_t *sel, const stored_kv *s,
                                  uint32_t length, uint32_t H, const char *what) {
    ikv_token_range *runs = malloc(((size_t)length + 1) * sizeof *runs);
    for (uint32_t h = 0; h < H; ++h) {
        size_t n = 0, none = 99;
        IKVT_OK(ikv_decoder_last_selection(dec, seq_index, h, NULL, 0, &none));
        IKVT_OK(ikv_decoder_last_selection(dec, seq_index, h, runs, length + 1, &n));
        assert_int_equal(n, none);
        size_t k = 0;
        for (uint32_t t = 0; t < length; ++t) {
            const int want = sel[(size_t)h * length + t] && s->live[t];
            int got = 0;
            while (k < n && runs[k].end <= t) ++k;
            if (k < n && runs[k].begin <= t) got = 1;
            if (want != got) {
                print_error("%s: kv-head %u token %u: last_selection says %d, the reference %d\n", what, h, t, got, want);
                fail();
            }
        }
        for (size_t i = 1; i < n; ++i) assert_true(runs[i - 1].end < runs[i].begin); /* maximal, ascending */
    }
    free(runs);
}

/* A query memory for the step's sequence with c->memory_turns turns of 1-3
 * random query tokens each at c->layer (and one at another layer, which must
 * not count), and in mass->mem_q the query it should recall for each query
 * head given the step's queries cur (token 0), computed plainly: with
 * c->memory_slots 0 the turns' means weighted decay^age, m = (mean + d W m) /
 * (1 + d W); else of the last memory_slots turns' means, per head the one of
 * largest cosine with the head's current query (the newest on a tie). */
static ikv_query_memory *remember_turns(ikv_pool *pool, ikv_seq_id seq, const step_cfg *c, uint32_t nq,
                                        const void *cur, ikv_dtype cur_dtype, ikvt_rng *rng, mass_rule *mass) {
    ikv_query_memory_config mc = ikv_query_memory_default_config();
    mc.n_q_heads = nq;
    mc.decay = 0.6f;
    mc.turns = c->memory_slots;
    ikv_query_memory *memory = NULL;
    IKVT_OK(ikv_query_memory_create(pool, &mc, &memory));
    const size_t row = (size_t)nq * c->D;
    double *m = calloc(row, sizeof *m), w = 0;
    double *means = calloc((size_t)c->memory_turns * row + 1, sizeof *means); /* every turn's mean, oldest first */
    float *q = malloc(3 * row * sizeof *q);
    for (uint32_t turn = 0; turn < c->memory_turns; ++turn) {
        const uint32_t n = 1 + turn % 3;
        ikvt_fill_normal(rng, q, n * row, c->q_sigma);
        IKVT_OK(ikv_query_memory_remember(memory, seq, c->layer, q, IKV_DTYPE_F32, n));
        if (c->layers > 1) IKVT_OK(ikv_query_memory_remember(memory, seq, (c->layer + 1) % c->layers, q, IKV_DTYPE_F32, 1));
        IKVT_OK(ikv_query_memory_end_turn(memory, seq));
        for (size_t e = 0; e < row; ++e) {
            double mean = 0;
            for (uint32_t t = 0; t < n; ++t) mean += q[t * row + e];
            means[turn * row + e] = (float)(mean / n); /* the memory keeps fp32 means */
            m[e] = (mean / n + (double)0.6f * w * m[e]) / (1 + (double)0.6f * w);
        }
        w = 1 + (double)0.6f * w;
    }
    if (c->memory_slots > 0) /* per head: the kept turn most similar to its query now */
        for (uint32_t hq = 0; hq < nq; ++hq) {
            const double *x = NULL;
            double best = 0, second = -2;
            const uint32_t kept = c->memory_turns < c->memory_slots ? c->memory_turns : c->memory_slots;
            for (uint32_t age = 0; age < kept; ++age) {
                const double *mt = means + (size_t)(c->memory_turns - 1 - age) * row + (size_t)hq * c->D;
                double ab = 0, aa = 0, bb = 0;
                for (uint32_t d = 0; d < c->D; ++d) {
                    const double a = dtype_get(cur, cur_dtype, (size_t)hq * c->D + d);
                    ab += a * mt[d], aa += a * a, bb += mt[d] * mt[d];
                }
                const double cs = ab / sqrt(aa * bb);
                if (x == NULL || cs > best) second = x ? best : second, best = cs, x = mt;
                else if (cs > second) second = cs;
            }
            if (best - second < 1e-5) {
                print_error("query memory: two kept turns are within %g of cosine for head %u: no exact test\n",
                            best - second, hq);
                fail();
            }
            memcpy(m + (size_t)hq * c->D, x, c->D * sizeof *m);
        }
    mass->mem_q = m;
    mass->decay = (double)0.6f;
    free(means);
    free(q);
    return memory;
}

/* A routed plan of a length-token context: "system" [0, 24) ALWAYS, two ATTEND
 * documents, a RECENT turn of the last 40 tokens (recent window 40): its
 * system and recent pages are mandatory (IKV_PAGE_MANDATORY). */
static ikv_plan *routed_plan(uint32_t length, uint32_t P) {
    ikv_layout *layout = NULL;
    IKVT_OK(ikv_layout_create(&layout));
    const uint32_t cuts[] = {0, 24, 150, length - 40, length};
    const ikv_policy pol[] = {IKV_POLICY_ALWAYS, IKV_POLICY_ATTEND, IKV_POLICY_ATTEND, IKV_POLICY_RECENT};
    const char *names[] = {"system", "doc1", "doc2", "turn"};
    for (int i = 0; i < 4; ++i) {
        ikv_block_desc b = ikv_block_desc_default();
        b.name = names[i];
        b.start = cuts[i];
        b.end = cuts[i + 1];
        b.policy = pol[i];
        b.score = 0.9f;
        IKVT_OK(ikv_layout_add(layout, &b, NULL));
    }
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = P;
    rc.recent_window = 40;
    ikv_router *router = NULL;
    IKVT_OK(ikv_router_create(&rc, &router));
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_router_route(router, layout, length, &plan));
    const ikv_plan_page *pages;
    size_t n, mandatory = 0;
    IKVT_OK(ikv_plan_pages(plan, &pages, &n));
    for (size_t i = 0; i < n; ++i) mandatory += (pages[i].flags & IKV_PAGE_MANDATORY) != 0;
    assert_true(mandatory > 0 && mandatory < n); /* the case this plan is for */
    ikv_router_destroy(router);
    ikv_layout_destroy(layout);
    return plan;
}

/* Build the pool of cfg, decode with both decoders, check against the reference. */
static void run_step(const step_cfg *c) {
    ikvt_rng rng = {c->seed};
    pool_fix f;
    const int selective = c->topk > 0 || c->mass.on;  /* mass.hybrid alone changes nothing without top-k */
    fix_init(&f, c->layers, c->H, c->D, c->P, c->fmt, c->length, &rng, selective);
    for (size_t i = 0; i < c->n_evict; ++i) IKVT_OK(ikv_seq_evict(f.pool, f.seq, c->evict[i].begin, c->evict[i].end));
    ikv_plan *plan = NULL;
    if (c->ranges) IKVT_OK(ikv_plan_from_ranges(c->ranges, c->n_ranges, c->length, c->P, c->fmt, &plan));
    if (c->routed) plan = routed_plan(c->length, c->P);
    const uint32_t nq = c->H * c->group;
    const size_t n_rows = (size_t)c->nqt * nq;
    void *q = make_q(&rng, n_rows * c->D, c->q_dtype, c->q_sigma);
    stored_kv s = read_stored(f.pool, f.seq, c->layer, c->H, c->D, c->P, c->length);
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->D);
    mass_rule mass = c->mass;
    mass.scale = scale;
    mass.max_tokens = c->topk;
    mass.softcap = c->softcap;
    ikv_query_memory *memory = c->memory_turns ? remember_turns(f.pool, f.seq, c, nq, q, c->q_dtype, &rng, &mass) : NULL;
    uint8_t *sel = selective ? topk_selection(f.pool, f.seq, c->layer, plan, &s, c->length, c->H, c->D, c->P, nq, q,
                                              c->q_dtype, c->topk, &mass)
                             : plan_selection(plan, c->length, c->H);
    double *out_ref = malloc(n_rows * c->D * sizeof *out_ref), *lse_ref = malloc(n_rows * sizeof *lse_ref);
    reference_step(&s, sel, c->length, c->H, c->D, nq, c->nqt, q, c->q_dtype, scale, c->softcap, out_ref, lse_ref);

    void *out = malloc(n_rows * c->D * dtype_size(c->out_dtype));
    float *lse = malloc(n_rows * sizeof *lse);
    ikv_decoder *decs[2] = {g_dec1, g_dec3};
    for (int di = 0; di < 2; ++di) {
        memset(out, 0x5A, n_rows * c->D * dtype_size(c->out_dtype));
        ikv_decode_args a = ikv_decode_args_default();
        a.layer = c->layer;
        a.n_seqs = 1;
        a.seqs = &f.seq;
        const ikv_plan *plans[1] = {plan};
        a.plans = plan ? plans : NULL;
        a.n_query_tokens = c->nqt;
        a.n_q_heads = nq;
        a.q = q;
        a.q_dtype = c->q_dtype;
        a.out = out;
        a.out_dtype = c->out_dtype;
        a.lse = lse;
        a.scale = c->scale;
        a.softcap = c->softcap;
        a.topk_token_budget = c->topk;
        if (c->mass.hybrid) a.topk_score = c->mass.keys ? IKV_TOPK_SCORE_KEYS : IKV_TOPK_SCORE_HYBRID;
        a.query_memory = memory;
        if (c->mass.on) {
            a.topk_mode = IKV_TOPK_MASS;
            a.topk_mass = (float)c->mass.share;
            a.topk_min_tokens = c->mass.min_tokens;
        }
        IKVT_OK(ikv_decode(decs[di], f.pool, &a));
        char what[160];
        snprintf(what, sizeof what, "fmt %s D %u H %u group %u P %u len %u nqt %u threads %s", ikv_format_name(c->fmt),
                 c->D, c->H, c->group, c->P, c->length, c->nqt, di ? "3" : "1");
        compare(out, c->out_dtype, c->fmt, lse, out_ref, lse_ref, n_rows, c->D, what);
        expect_last_selection(decs[di], 0, sel, &s, c->length, c->H, what);
    }
    free(out);
    free(lse);
    free(out_ref);
    free(lse_ref);
    free((void *)mass.mem_q);
    ikv_query_memory_destroy(memory);
    free(sel);
    free(q);
    free_stored(&s);
    ikv_plan_destroy(plan);
    fix_free(&f);
}

/* ------------------------------------------------------------------ tests */

static void test_formats_and_head_dims(void **state) {
    (void)state;
    const uint32_t dims[] = {32, 64, 128, 256};
    for (int fmt = 0; fmt < IKV_FMT_COUNT; ++fmt)
        for (int i = 0; i < 4; ++i) {
            step_cfg c = base_cfg();
            c.fmt = (ikv_format)fmt;
            c.D = dims[i];
            c.length = 150 + 17 * i;
            c.seed = 100 + fmt * 10 + i;
            run_step(&c);
        }
    const uint32_t odd_dims[] = {80, 96};
    const ikv_format odd_fmts[] = {IKV_FMT_F16, IKV_FMT_INT4, IKV_FMT_INT8, IKV_FMT_FP8_E4M3};
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
            step_cfg c = base_cfg();
            c.D = odd_dims[i];
            c.fmt = odd_fmts[j];
            c.length = 99;
            c.seed = 200 + i * 4 + j;
            run_step(&c);
        }
}

/* GQA groups and page sizes; then more kv-heads than one by-page kernel call takes. */
static void test_gqa_groups_and_page_sizes(void **state) {
    (void)state;
    const uint32_t groups[] = {1, 2, 4, 8}, pages[] = {16, 64};
    static const ikv_token_range ranges[] = {{3, 40}, {77, 78}, {130, 261}, {300, 333}};
    for (int g = 0; g < 4; ++g)
        for (int p = 0; p < 2; ++p) {
            step_cfg c = base_cfg();
            c.group = groups[g];
            c.P = pages[p];
            c.length = 345;
            c.fmt = (ikv_format)((g + p) % IKV_FMT_COUNT);
            c.ranges = (g & 1) ? ranges : NULL;
            c.n_ranges = 4;
            c.seed = 300 + g * 2 + p;
            run_step(&c);
        }
    /* More kv-heads than one by-page call of the kernel takes (16): a
     * sequence's heads run in two calls, every format, dense and a plan. */
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        step_cfg c = base_cfg();
        c.H = 18;
        c.group = 1 + (uint32_t)(f % 2);
        c.length = 700;
        c.fmt = (ikv_format)f;
        c.ranges = (f & 1) ? ranges : NULL;
        c.n_ranges = 4;
        c.seed = 330 + (uint64_t)f;
        run_step(&c);
    }
}

static void test_partial_plans_and_evicted(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{1, 2}, {5, 31}, {47, 150}, {151, 152}, {200, 397}};
    static const ikv_token_range evict[] = {{32, 64}, {96, 160}};
    for (int fmt = 0; fmt < IKV_FMT_COUNT; ++fmt) {
        step_cfg c = base_cfg();
        c.fmt = (ikv_format)fmt;
        c.length = 400;
        c.ranges = ranges;
        c.n_ranges = 5;
        c.evict = evict;
        c.n_evict = 2;
        c.seed = 400 + fmt;
        run_step(&c);
        c.ranges = NULL;  /* dense over a sequence with holes */
        run_step(&c);
    }
}

static void test_multi_token_causal(void **state) {
    (void)state;
    const uint32_t nqts[] = {2, 3, 7, 16};
    static const ikv_token_range ranges[] = {{0, 16}, {100, 190}, {250, 290}};
    for (int i = 0; i < 4; ++i) {
        step_cfg c = base_cfg();
        c.nqt = nqts[i];
        c.length = 290;
        c.fmt = (ikv_format)(i % IKV_FMT_COUNT);
        c.ranges = (i & 1) ? ranges : NULL;
        c.n_ranges = 3;
        c.seed = 500 + i;
        run_step(&c);
    }
}

/* Long multi-token causal steps (chunked prefill, IKV_MAX_QUERY_TOKENS > 16):
 * T = 40 and 130 query tokens at the end of the sequence, dense and with a
 * plan of partial pages whose last range ends inside the query window, so
 * early query rows see a prefix of the plan and the last rows all of it. */
static void test_long_multi_token_causal(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{5, 21}, {64, 130}, {190, 333}, {401, 470}};
    const uint32_t nqts[] = {40, 130};
    for (int i = 0; i < 2; ++i)
        for (int planned = 0; planned < 2; ++planned) {
            step_cfg c = base_cfg();
            c.nqt = nqts[i];
            c.length = 470 + 3 * i;
            c.fmt = planned ? IKV_FMT_INT8 : IKV_FMT_F16;
            c.ranges = planned ? ranges : NULL;
            c.n_ranges = 4;
            c.out_dtype = i ? IKV_DTYPE_F16 : IKV_DTYPE_F32;
            c.seed = 550 + 2 * i + planned;
            run_step(&c);
        }
}

static void test_softcap_and_scale(void **state) {
    (void)state;
    step_cfg c = base_cfg();
    c.q_sigma = 4.0f; /* large logits so the cap bites */
    c.softcap = 5.0f;
    c.seed = 600;
    run_step(&c);
    c.softcap = 0.0f;
    c.scale = 0.05f;
    c.fmt = IKV_FMT_INT8;
    run_step(&c);
    c.softcap = 30.0f;
    c.scale = 0.4f;
    c.nqt = 4;
    c.fmt = IKV_FMT_BF16;
    run_step(&c);
}

static void test_q_and_out_dtypes(void **state) {
    (void)state;
    for (int qd = 0; qd < 3; ++qd)
        for (int od = 0; od < 3; ++od) {
            step_cfg c = base_cfg();
            c.q_dtype = (ikv_dtype)qd;
            c.out_dtype = (ikv_dtype)od;
            c.fmt = (ikv_format)((qd + od) % IKV_FMT_COUNT);
            c.nqt = 2;
            c.seed = 700 + qd * 3 + od;
            run_step(&c);
        }
}

static void test_other_layer(void **state) {
    (void)state;
    step_cfg c = base_cfg();
    c.layers = 3;
    c.layer = 2;
    c.fmt = IKV_FMT_INT4;
    c.seed = 800;
    run_step(&c);
    c.layer = 1;
    c.fmt = IKV_FMT_FP8_E4M3;
    run_step(&c);
}

static void test_topk_selection(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{0, 20}, {33, 140}, {150, 380}};
    const uint32_t budgets[] = {1, 40, 100, 1000};
    for (int i = 0; i < 4; ++i)
        for (int with_plan = 0; with_plan < 2; ++with_plan) {
            step_cfg c = base_cfg();
            c.length = 390;
            c.H = 3;
            c.group = 2 + i;
            c.topk = budgets[i];
            c.nqt = 1 + (uint32_t)i;
            c.fmt = (ikv_format)((i + with_plan) % IKV_FMT_COUNT);
            c.ranges = with_plan ? ranges : NULL;
            c.n_ranges = 3;
            c.seed = 900 + i * 2 + with_plan;
            run_step(&c);
        }
}

/* Every candidate a whole page (a length that is a multiple of the page
 * size, no plan): the selection finds the budget's top pages without ordering
 * them all (nth_element), budgets from one page to all but one token; the
 * reference's selection exactly. */
static void test_topk_selection_whole_pages(void **state) {
    (void)state;
    const uint32_t budgets[] = {16, 17, 48, 100, 200, 383};
    for (int i = 0; i < 6; ++i) {
        step_cfg c = base_cfg();
        c.length = 384;
        c.group = 1u + (uint32_t)(i % 4);
        c.topk = budgets[i];
        c.fmt = (ikv_format)(i % IKV_FMT_COUNT);
        c.seed = 950 + (uint64_t)i;
        run_step(&c);
    }
}

/* IKV_TOPK_MASS: the budget from the bounds' estimated mass share, with and
 * without a plan, clamped by topk_min_tokens and topk_token_budget; the
 * selection is the reference rule's exactly (ikv_decoder_last_selection). */
static void test_topk_mass_selection(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{0, 20}, {33, 140}, {150, 380}};
    const double shares[] = {0.3, 0.7, 0.9, 1.0};
    const uint32_t mins[] = {0, 0, 200, 0}, maxs[] = {0, 300, 0, 0};
    const float sigmas[] = {3.0f, 1.0f, 2.0f, 0.5f};
    for (int i = 0; i < 4; ++i)
        for (int with_plan = 0; with_plan < 2; ++with_plan) {
            step_cfg c = base_cfg();
            c.length = 390;
            c.H = 3;
            c.group = 1 + (uint32_t)i;
            c.D = i == 3 ? 32 : 64;
            c.q_sigma = sigmas[i];
            c.mass.on = 1;
            c.mass.share = shares[i];
            c.mass.min_tokens = mins[i];
            c.topk = maxs[i];
            c.fmt = (ikv_format)((i + with_plan) % IKV_FMT_COUNT);
            c.ranges = with_plan ? ranges : NULL;
            c.n_ranges = 3;
            c.seed = 1900 + i * 2 + with_plan;
            run_step(&c);
        }
}

/* IKV_TOPK_SCORE_HYBRID: per-head shifted (bound + mean logit) / 2, with the
 * fixed budget and with the mass rule, with and without a plan, GQA groups of
 * 1-8; the selection is the reference's exactly. */
static void test_topk_hybrid_score(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{0, 20}, {33, 140}, {150, 380}};
    const uint32_t budgets[] = {40, 100, 200, 0};
    for (int i = 0; i < 4; ++i)
        for (int with_plan = 0; with_plan < 2; ++with_plan) {
            step_cfg c = base_cfg();
            c.length = 390;
            c.H = 2;
            c.group = 1u << (i % 4);
            c.D = i == 2 ? 32 : 64;
            c.q_sigma = 2.0f;
            c.mass.hybrid = 1;
            c.mass.on = i == 3;
            c.mass.share = 0.8;
            c.topk = budgets[i];
            c.fmt = (ikv_format)((i + 2 * with_plan) % IKV_FMT_COUNT);
            c.ranges = with_plan ? ranges : NULL;
            c.n_ranges = 3;
            c.seed = 2900 + i * 2 + with_plan;
            run_step(&c);
        }
}

/* IKV_TOPK_SCORE_KEYS with a query row holding an inf or a NaN: the row is
 * left out of the shares (the header), so a group of head 0 and such a head
 * selects what head 0 alone selects. The +inf case gives the bad row exactly
 * one +inf logit (token 25: its key is the only positive one in that
 * channel), so its Z_r is +inf; that made the page's score NaN (last) before
 * the rule tested every non-finite Z_r, not only -inf. */
static void test_keys_score_skips_bad_rows(void **state) {
    (void)state;
    enum { KD = 32, KP = 8, KN = 128 };
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = 1, .head_dim = KD, .page_size = KP,
                                                     .capacity_bytes = 4u << 20, .default_format = IKV_FMT_F16});
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    static float k[KN * KD], v[KN * KD];
    ikvt_rng rng = {0xBAD};
    ikvt_fill_normal(&rng, k, KN * KD, 1.0f);
    ikvt_fill_normal(&rng, v, KN * KD, 1.0f);
    for (int t = 0; t < KN; ++t) k[t * KD + 3] = t == 25 ? 1.0f : -1.0f;
    ikv_append ap = ikv_append_default(pool, KN);
    ap.k = k;
    ap.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &ap));
    float q[2 * KD], out[2 * KD];
    ikvt_fill_normal(&rng, q, 2 * KD, 2.0f);
    q[3] = 20.0f; /* head 0 favours token 25's page, the one a NaN score would drop */
    ikv_token_range want[64], got[64];
    size_t n_want = 0, n_got = 0;
    const float bad[3] = {INFINITY, NAN, -INFINITY};
    for (int b = -1; b < 3; ++b) {
        ikv_decode_args a = ikv_decode_args_default();
        a.seqs = &s;
        a.n_q_heads = b < 0 ? 1 : 2; /* head 0 alone, then head 0 beside a bad head */
        a.q = q;
        a.out = out;
        a.topk_token_budget = 24;
        a.topk_score = IKV_TOPK_SCORE_KEYS;
        if (b >= 0) q[KD + 3] = bad[b];
        IKVT_OK(ikv_decode(g_dec1, pool, &a));
        IKVT_OK(ikv_decoder_last_selection(g_dec1, 0, 0, b < 0 ? want : got, 64, b < 0 ? &n_want : &n_got));
        if (b < 0) {
            int has25 = 0;
            for (size_t i = 0; i < n_want; ++i) has25 |= want[i].begin <= 25 && 25 < want[i].end;
            assert_true(has25);
        }
        if (b >= 0 && (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0))
            fail_msg("a head holding %g in q changed head 0's selection (%zu runs, head 0 alone %zu)", (double)bad[b],
                     n_got, n_want);
    }
    ikv_pool_destroy(pool);
}

/* IKV_TOPK_SCORE_KEYS: hybrid candidates for twice the budget ranked again by
 * their keys' attention share, with the fixed budget and the mass rule, a
 * plan with mandatory pages, softcap, a query memory, GQA groups of 1-4,
 * every format; the selection is the reference's exactly (and so the output
 * and ikv_decoder_last_selection). */
static void test_topk_keys_score(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{0, 20}, {33, 140}, {150, 380}};
    for (int i = 0; i < 10; ++i) {
        step_cfg c = base_cfg();
        c.length = 390;
        c.H = 2;
        c.group = 1u << (i % 3);
        c.D = i % 4 == 1 ? 32 : 64;
        c.q_sigma = 2.0f;
        c.mass.hybrid = c.mass.keys = 1;
        c.mass.on = i >= 6 && i < 8;
        c.mass.share = 0.8;
        c.topk = (const uint32_t[]){16, 32, 100, 160, 32, 80, 0, 120, 16, 96}[i];
        c.softcap = i == 4 ? 8.0f : 0.0f;
        c.routed = i == 5 || i == 9;
        c.ranges = i == 2 || i == 7 ? ranges : NULL;
        c.n_ranges = 3;
        c.memory_turns = i == 8 || i == 9 ? 2 : 0;
        c.memory_slots = 0;
        c.fmt = (ikv_format)(i % IKV_FMT_COUNT);
        c.seed = 5900 + (uint64_t)i;
        run_step(&c);
    }
    /* F16 keys with zeros and subnormal halves among them, fixed and mass budgets:
     * the codec's branch-free F16 conversion (decode_f16) runs on them in the
     * CPU pass (a mutant converting them as normals still passes here: errors
     * of a subnormal's size move no selection; test_pool_formats holds the
     * codec to an independent conversion on zeros and subnormals of both
     * signs, test_f16_saturates). */
    g_special_keys = 1;
    for (int i = 0; i < 2; ++i) {
        step_cfg c = base_cfg();
        c.length = 390;
        c.q_sigma = 2.0f;
        c.mass.hybrid = c.mass.keys = 1;
        c.mass.on = i;
        c.mass.share = 0.8;
        c.topk = i ? 120 : 64;
        c.fmt = IKV_FMT_F16;
        c.seed = 5950 + (uint64_t)i;
        run_step(&c);
    }
    g_special_keys = 0;
}

/* Plans with mandatory pages (routed: ALWAYS and RECENT blocks): they are kept
 * and count first, and they are left out of every score statistic (the
 * hybrid shift, the mass rule's weights and budget, the memory rows), with
 * fixed and mass budgets, a floor above the mandatory tokens, and a memory. */
static void test_topk_with_mandatory_pages(void **state) {
    (void)state;
    for (int i = 0; i < 6; ++i) {
        step_cfg c = base_cfg();
        c.length = 390;
        c.H = 2;
        c.group = 1u + (uint32_t)(i % 3);
        c.q_sigma = 1.5f;
        c.routed = 1;
        c.mass.hybrid = i % 2;
        c.mass.on = i >= 2;
        c.mass.share = 0.7;
        c.mass.min_tokens = i == 3 ? 150 : 0; /* above the ~64 mandatory tokens */
        c.topk = i < 2 ? 120 : (i == 4 ? 200 : 0);
        c.memory_turns = i == 5 ? 2 : 0;
        c.memory_slots = 4;
        c.fmt = (ikv_format)(i % IKV_FMT_COUNT);
        c.seed = 4900 + (uint64_t)i;
        run_step(&c);
    }
}

/* A query memory joins the ranking as `group` more rows per kv-head that
 * count log(decay) lower, in both forms (one decayed mean; turns kept apart,
 * each head recalling the most similar): Quest and hybrid scores, fixed and
 * mass budgets, with and without a plan; the selection is the reference's
 * exactly. */
static void test_query_memory_selection(void **state) {
    (void)state;
    static const ikv_token_range ranges[] = {{0, 20}, {33, 140}, {150, 380}};
    for (int i = 0; i < 8; ++i) {
        step_cfg c = base_cfg();
        c.layers = 2;
        c.layer = (uint32_t)(i % 2);
        c.length = 390;
        c.H = 2;
        c.group = 1u + (uint32_t)(i % 4);
        c.q_sigma = 1.5f;
        c.memory_turns = 1 + (uint32_t)(i % 3);
        c.memory_slots = i % 2 ? 0 : 2; /* the decayed mean, or two turns kept apart (three remembered: the ring) */
        c.mass.hybrid = i >= 4;
        c.mass.on = i % 4 == 3;
        c.mass.share = 0.8;
        c.topk = c.mass.on ? 0 : 96;
        c.ranges = i % 2 ? ranges : NULL;
        c.n_ranges = 3;
        c.fmt = (ikv_format)(i % IKV_FMT_COUNT);
        c.seed = 3900 + (uint64_t)i;
        run_step(&c);
    }
}

/* Query-memory calls: bad arguments are refused with a sentence and change
 * nothing; a memory of another pool or other query heads is refused by decode. */
static void test_query_memory_errors(void **state) {
    (void)state;
    ikvt_rng rng = {4100};
    pool_fix f, g;
    fix_init(&f, 2, 2, 64, 16, IKV_FMT_F16, 40, &rng, 1);
    fix_init(&g, 2, 2, 64, 16, IKV_FMT_F16, 40, &rng, 1);
    ikv_query_memory_config mc = ikv_query_memory_default_config();
    ikv_query_memory *m = NULL;
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, &m), IKV_E_INVALID, "n_q_heads");
    mc.n_q_heads = 7;
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, &m), IKV_E_INVALID, "n_q_heads");
    mc.n_q_heads = 8;
    const float bad_decay[] = {0.0f, 1.0f, -1.0f, NAN};
    for (int i = 0; i < 4; ++i) {
        mc.decay = bad_decay[i];
        IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, &m), IKV_E_INVALID, "decay");
    }
    mc = ikv_query_memory_default_config();
    mc.n_q_heads = 8;
    mc.struct_size = 3;
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, &m), IKV_E_INVALID, "struct_size");
    mc.struct_size = sizeof mc;
    assert_int_equal(mc.turns, 4);
    mc.turns = 65;
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, &m), IKV_E_INVALID, "turns");
    mc.turns = 4;
    IKVT_EXPECT_STATUS(ikv_query_memory_create(NULL, &mc, &m), IKV_E_NULL, "pool");
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, NULL, &m), IKV_E_NULL, "config");
    IKVT_EXPECT_STATUS(ikv_query_memory_create(f.pool, &mc, NULL), IKV_E_NULL, "out");
    assert_null(m);
    IKVT_OK(ikv_query_memory_create(f.pool, &mc, &m));
    float q[2 * 8 * 64];
    ikvt_fill_normal(&rng, q, 2 * 8 * 64, 1.0f);
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(NULL, f.seq, 0, q, IKV_DTYPE_F32, 1), IKV_E_NULL, "memory");
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(m, f.seq, 0, NULL, IKV_DTYPE_F32, 1), IKV_E_NULL, "q");
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(m, f.seq, 2, q, IKV_DTYPE_F32, 1), IKV_E_RANGE, "layer");
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(m, f.seq, 0, q, IKV_DTYPE_F32, 0), IKV_E_INVALID, "n_tokens");
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(m, f.seq, 0, q, (ikv_dtype)9, 1), IKV_E_INVALID, "q_dtype");
    q[8 * 64 + 77] = INFINITY; /* token 1, element 77 */
    IKVT_EXPECT_STATUS(ikv_query_memory_remember(m, f.seq, 0, q, IKV_DTYPE_F32, 2), IKV_E_INVALID, "token 1, element 77");
    IKVT_EXPECT_STATUS(ikv_query_memory_end_turn(NULL, f.seq), IKV_E_NULL, "memory");
    IKVT_EXPECT_STATUS(ikv_query_memory_forget(NULL, f.seq), IKV_E_NULL, "memory");
    IKVT_EXPECT_STATUS(ikv_query_memory_reset(NULL), IKV_E_NULL, "memory");
    /* the refused calls remembered nothing: a decode with the memory selects as without it */
    IKVT_OK(ikv_query_memory_end_turn(m, f.seq));
    static float out[8 * 64], out2[8 * 64];
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &f.seq;
    a.n_q_heads = 8;
    a.q = q;
    a.out = out;
    a.topk_token_budget = 16;
    IKVT_OK(ikv_decode(g_dec1, f.pool, &a));
    a.query_memory = m;
    a.out = out2;
    IKVT_OK(ikv_decode(g_dec1, f.pool, &a));
    assert_memory_equal(out, out2, sizeof out);
    a.seqs = &g.seq;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, g.pool, &a), IKV_E_INVALID, "another pool");
    a.seqs = &f.seq;
    a.n_q_heads = 4;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "query heads");
    IKVT_OK(ikv_query_memory_forget(m, f.seq));
    IKVT_OK(ikv_query_memory_reset(m));
    ikv_query_memory_destroy(m);
    ikv_query_memory_destroy(NULL);
    fix_free(&f);
    fix_free(&g);
}

/* Each page's share of one step's softmax, plainly: per kv-head h and page,
 * the sum over the page's selected live tokens of exp(logit - lse) per query
 * row (causal), averaged over the group's heads and the query tokens; added
 * into avg [H][n_pages] as avg = (1 - rate) avg + rate share for pages read. */
static void reference_feedback(const stored_kv *s, const uint8_t *sel, uint32_t length, uint32_t H, uint32_t D,
                               uint32_t P, uint32_t nq, uint32_t nqt, const float *q, double scale, double rate,
                               double *avg) {
    const uint32_t group = nq / H, n_pages = (length + P - 1) / P;
    double *share = calloc(n_pages, sizeof *share), *logit = malloc(length * sizeof *logit);
    uint8_t *read = calloc(n_pages, 1);
    for (uint32_t h = 0; h < H; ++h) {
        memset(share, 0, n_pages * sizeof *share);
        memset(read, 0, n_pages);
        for (uint32_t t = 0; t < nqt; ++t)
            for (uint32_t g = 0; g < group; ++g) {
                const uint32_t qpos = length - nqt + t;
                int finite = 1; /* a query row holding a NaN or inf adds nothing (the header) */
                for (uint32_t d = 0; d < D; ++d) finite &= isfinite(q[((size_t)t * nq + h * group + g) * D + d]);
                if (!finite) continue;
                double mx = -INFINITY, sum = 0;
                for (uint32_t i = 0; i <= qpos; ++i) {
                    logit[i] = -INFINITY;
                    if (!s->live[i] || !sel[(size_t)h * length + i]) continue;
                    double dot = 0;
                    for (uint32_t d = 0; d < D; ++d)
                        dot += (double)q[((size_t)t * nq + h * group + g) * D + d] * s->k[((size_t)i * H + h) * D + d];
                    logit[i] = dot * scale;
                    mx = logit[i] > mx ? logit[i] : mx;
                }
                for (uint32_t i = 0; i <= qpos; ++i) sum += logit[i] > -INFINITY ? exp(logit[i] - mx) : 0;
                for (uint32_t i = 0; i <= qpos; ++i)
                    if (logit[i] > -INFINITY) share[i / P] += exp(logit[i] - mx) / sum / (group * nqt);
            }
        for (uint32_t i = 0; i < length; ++i)
            if (s->live[i] && sel[(size_t)h * length + i]) read[i / P] = 1;
        for (uint32_t p = 0; p < n_pages; ++p)
            if (read[p]) avg[(size_t)h * n_pages + p] = (1 - rate) * avg[(size_t)h * n_pages + p] + rate * share[p];
    }
    free(share), free(logit), free(read);
}

static void expect_feedback(const ikv_page_feedback *fb, ikv_seq_id seq, uint32_t layer, uint32_t H,
                            uint32_t n_pages, const double *avg) {
    float *got = malloc((n_pages + 4) * sizeof *got);
    for (uint32_t h = 0; h < H; ++h) {
        uint32_t n = 0;
        IKVT_OK(ikv_page_feedback_get(fb, seq, layer, h, got, n_pages + 4, &n));
        assert_true(n <= n_pages);
        for (uint32_t p = 0; p < n_pages + 4; ++p) {
            const double want = p < n_pages ? avg[(size_t)h * n_pages + p] : 0;
            if (!(fabs(got[p] - want) <= 1e-5 + 1e-4 * want)) {
                print_error("feedback kv-head %u page %u: %.9g, the reference %.9g\n", h, p, (double)got[p], want);
                fail();
            }
        }
    }
    free(got);
}

/* One dense decode of a single-kv-head pool's sequence s by one query head,
 * feeding back into fb. */
static void decode_one_head(ikv_decoder *dec, ikv_pool *pool, ikv_seq_id *s, const float *q, float *out,
                            ikv_page_feedback *fb, float softcap) {
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = s;
    a.n_q_heads = 1;
    a.q = q;
    a.out = out;
    a.feedback = fb;
    a.softcap = softcap;
    IKVT_OK(ikv_decode(dec, pool, &a));
}

/* A block whose pages were read and received no attention (a share of
 * exactly 0: its keys' logits are ~1e4 below the other page's) is fed back:
 * ikv_page_feedback_block_scores gives it 0 / top = 0 rather than leaving its
 * old score, and the attended block 1; a block never read keeps its score. */
static void test_feedback_zero_share_block(void **state) {
    (void)state;
    enum { ZD = 32, ZP = 8, ZLEN = 16 };
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = 1, .head_dim = ZD, .page_size = ZP,
                                                     .capacity_bytes = 1u << 20, .default_format = IKV_FMT_F16});
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    float k[ZLEN * ZD], v[ZLEN * ZD], q[ZD], out[ZD];
    for (int t = 0; t < ZLEN; ++t)
        for (int c = 0; c < ZD; ++c) k[t * ZD + c] = t < ZP ? -1000.0f : 1.0f, v[t * ZD + c] = 1.0f;
    for (int c = 0; c < ZD; ++c) q[c] = 1.0f;
    ikv_append ap = ikv_append_default(pool, ZLEN);
    ap.k = k;
    ap.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &ap));
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    ikv_page_feedback *fb = NULL;
    IKVT_OK(ikv_page_feedback_create(pool, &fc, &fb));
    decode_one_head(g_dec1, pool, &s, q, out, fb, 0.0f);
    float m[2];
    uint32_t n = 0;
    IKVT_OK(ikv_page_feedback_get(fb, s, 0, 0, m, 2, &n));
    assert_int_equal(n, 2);
    assert_true(m[0] == 0.0f && m[1] > 0.0f);
    ikv_layout *lay = NULL;
    IKVT_OK(ikv_layout_create(&lay));
    const char *names[3] = {"ignored", "attended", "unread"};
    const uint32_t starts[3] = {0, ZP, ZLEN};
    for (int b = 0; b < 3; ++b) {
        ikv_block_desc d = ikv_block_desc_default();
        d.name = names[b];
        d.start = starts[b];
        d.end = starts[b] + ZP;
        d.score = 0.7f;
        IKVT_OK(ikv_layout_add(lay, &d, NULL));
    }
    IKVT_OK(ikv_page_feedback_block_scores(fb, s, lay));
    const float want[3] = {0.0f, 1.0f, 0.7f};
    for (uint32_t b = 0; b < 3; ++b) {
        ikv_block_info bi;
        IKVT_OK(ikv_layout_at(lay, b, &bi));
        if (bi.score != want[b]) {
            print_error("block %s: score %g, want %g\n", names[b], (double)bi.score, (double)want[b]);
            fail();
        }
    }
    ikv_layout_destroy(lay);
    ikv_page_feedback_destroy(fb);
    ikv_pool_destroy(pool);
}

/* Attention feedback of logits around 3e7, whose fp32 rounding (~10) is far
 * from small: each page's share still matches the float64 softmax of the
 * stored keys (tokens 13 apart hold the same key, so the largest logit is
 * tied across pages and its mass splits evenly), and the shares sum to 1.
 * (The CPU measured shares against the kernel's lse, summed in another
 * order: they summed to 3.3.) On 1 and 3 threads, dense and with a softcap
 * that leaves the tie intact. */
static void test_feedback_shares_of_huge_logits(void **state) {
    (void)state;
    enum { HD = 32, HP = 8, HLEN = 32, HPAGES = HLEN / HP };
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = 1, .head_dim = HD, .page_size = HP,
                                                     .capacity_bytes = 1u << 20, .default_format = IKV_FMT_F16});
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    float k[HLEN * HD], v[HLEN * HD], q[HD], out[HD];
    for (int t = 0; t < HLEN; ++t)
        for (int c = 0; c < HD; ++c) k[t * HD + c] = 1000.0f + (float)((t * 37 + c * 11) % 13), v[t * HD + c] = 1.0f;
    for (int c = 0; c < HD; ++c) q[c] = 1000.0f + (float)(c % 5);
    ikv_append ap = ikv_append_default(pool, HLEN);
    ap.k = k;
    ap.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &ap));
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, HLEN, k, v)); /* the stored keys, for the reference */
    double logit[HLEN], want[HPAGES] = {0}, mx = -INFINITY, z = 0.0;
    for (int t = 0; t < HLEN; ++t) {
        logit[t] = 0.0;
        for (int c = 0; c < HD; ++c) logit[t] += (double)q[c] * k[t * HD + c];
        mx = logit[t] > mx ? logit[t] : mx;
    }
    for (int t = 0; t < HLEN; ++t) z += exp(logit[t] - mx);
    for (int t = 0; t < HLEN; ++t) want[t / HP] += exp(logit[t] - mx) / z;
    assert_true(want[0] > 0.3 && want[2] > 0.3); /* the tie this test is about */
    for (int c = 0; c < 4; ++c) { /* bit 0: 3 threads; bit 1: a softcap far above the logits' spread */
        ikv_page_feedback_config fc = ikv_page_feedback_default_config();
        fc.rate = 1.0f; /* the averages are this step's shares */
        ikv_page_feedback *fb = NULL;
        IKVT_OK(ikv_page_feedback_create(pool, &fc, &fb));
        decode_one_head(c & 1 ? g_dec3 : g_dec1, pool, &s, q, out, fb, c & 2 ? 1e12f : 0.0f);
        float got[HPAGES];
        uint32_t n = 0;
        IKVT_OK(ikv_page_feedback_get(fb, s, 0, 0, got, HPAGES, &n));
        assert_int_equal(n, HPAGES);
        double sum = 0.0;
        for (int p = 0; p < HPAGES; ++p) {
            sum += got[p];
            if (!(fabs(got[p] - want[p]) <= 1e-5))
                fail_msg("case %d page %d: share %.7g, float64 %.7g", c, p, (double)got[p], want[p]);
        }
        if (!(fabs(sum - 1.0) <= 1e-5)) fail_msg("case %d: shares sum to %.7g", c, sum);
        ikv_page_feedback_destroy(fb);
    }
    ikv_pool_destroy(pool);
}

/* Attention feedback: two steps (a plan with partial pages and 2 causal query
 * tokens on 3 threads, then top-k with the first step's averages as its
 * prior) give the float64 reference's averages; the prior's selection is the
 * reference's; block scores follow; bad input is refused and feeds nothing. */
static void test_attention_feedback(void **state) {
    (void)state;
    enum { L = 2, H = 2, G = 3, D = 64, P = 16, LEN = 300, NQ = H * G, NP = (LEN + P - 1) / P };
    ikvt_rng rng = {5100};
    pool_fix f;
    fix_init(&f, L, H, D, P, IKV_FMT_INT8, LEN, &rng, 1);
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    fc.rate = 0.5f;
    ikv_page_feedback *fb = NULL;
    IKVT_OK(ikv_page_feedback_create(f.pool, &fc, &fb));
    stored_kv s = read_stored(f.pool, f.seq, 1, H, D, P, LEN);
    double *avg = calloc((size_t)H * NP, sizeof *avg);
    static const ikv_token_range ranges[] = {{0, 40}, {77, 150}, {200, 300}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, 3, LEN, P, IKV_FMT_INT8, &plan));
    float q[2 * NQ * D], out[2 * NQ * D];
    const double scale = 1.0 / sqrt((double)D);
    /* step 1: the plan, two query tokens */
    ikvt_fill_normal(&rng, q, 2 * NQ * D, 1.0f);
    ikv_decode_args a = ikv_decode_args_default();
    const ikv_plan *plans[1] = {plan};
    a.layer = 1;
    a.seqs = &f.seq;
    a.plans = plans;
    a.n_query_tokens = 2;
    a.n_q_heads = NQ;
    a.q = q;
    a.out = out;
    a.feedback = fb;
    IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
    uint8_t *sel = plan_selection(plan, LEN, H);
    reference_feedback(&s, sel, LEN, H, D, P, NQ, 2, q, scale, 0.5, avg);
    free(sel);
    expect_feedback(fb, f.seq, 1, H, NP, avg);
    uint32_t n0 = 99;
    IKVT_OK(ikv_page_feedback_get(fb, f.seq, 0, 0, NULL, 0, &n0)); /* layer 0 was not decoded */
    assert_int_equal(n0, 0);
    /* step 2: top-k over every page with the averages as a prior */
    ikvt_fill_normal(&rng, q, NQ * D, 1.0f);
    mass_rule rule;
    memset(&rule, 0, sizeof rule);
    rule.scale = scale;
    rule.prior_avg = avg;
    rule.prior_n = NP;
    rule.prior_w = 0.7;
    sel = topk_selection(f.pool, f.seq, 1, NULL, &s, LEN, H, D, P, NQ, q, IKV_DTYPE_F32, 80, &rule);
    a.plans = NULL;
    a.n_query_tokens = 1;
    a.topk_token_budget = 80;
    a.topk_feedback_weight = 0.7f;
    IKVT_OK(ikv_decode(g_dec1, f.pool, &a));
    expect_last_selection(g_dec1, 0, sel, &s, LEN, H, "feedback prior");
    reference_feedback(&s, sel, LEN, H, D, P, NQ, 1, q, scale, 0.5, avg);
    free(sel);
    expect_feedback(fb, f.seq, 1, H, NP, avg);
    /* block scores: ATTEND blocks by their pages' averages (all layers, kv-heads), the largest 1 */
    ikv_layout *layout = NULL;
    IKVT_OK(ikv_layout_create(&layout));
    ikv_block_desc bd = ikv_block_desc_default();
    const uint32_t starts[] = {0, 40, 150, 300};
    uint32_t id[3];
    for (int i = 0; i < 3; ++i) {
        bd.name = i == 0 ? "a" : i == 1 ? "b" : "c";
        bd.start = starts[i];
        bd.end = starts[i + 1];
        bd.policy = i == 2 ? IKV_POLICY_ALWAYS : IKV_POLICY_ATTEND;
        bd.score = 0.25f;
        IKVT_OK(ikv_layout_add(layout, &bd, &id[i]));
    }
    IKVT_OK(ikv_page_feedback_block_scores(fb, f.seq, layout));
    double bm[2] = {0, 0};
    for (int i = 0; i < 2; ++i)
        for (uint32_t h = 0; h < H; ++h)
            for (uint32_t p = starts[i] / P; p < (starts[i + 1] + P - 1) / P; ++p) bm[i] += avg[h * NP + p];
    const double top = bm[0] > bm[1] ? bm[0] : bm[1];
    for (int i = 0; i < 3; ++i) {
        ikv_block_info info;
        IKVT_OK(ikv_layout_get(layout, id[i], &info));
        const double want = i == 2 ? 0.25 : bm[i] / top;
        assert_true(fabs(info.score - want) <= 1e-4);
    }
    /* bad input: named, nothing changed */
    uint32_t n = 0;
    float m1[1];
    IKVT_EXPECT_STATUS(ikv_page_feedback_get(fb, f.seq, 2, 0, m1, 1, &n), IKV_E_RANGE, "layer");
    IKVT_EXPECT_STATUS(ikv_page_feedback_get(fb, f.seq, 0, 2, m1, 1, &n), IKV_E_RANGE, "kv_head");
    IKVT_EXPECT_STATUS(ikv_page_feedback_get(fb, f.seq, 0, 0, NULL, 1, &n), IKV_E_NULL, "mass");
    IKVT_EXPECT_STATUS(ikv_page_feedback_get(NULL, f.seq, 0, 0, m1, 1, &n), IKV_E_NULL, "feedback");
    IKVT_EXPECT_STATUS(ikv_page_feedback_block_scores(fb, f.seq, NULL), IKV_E_NULL, "layout");
    fc.rate = 0.0f;
    ikv_page_feedback *bad = NULL;
    IKVT_EXPECT_STATUS(ikv_page_feedback_create(f.pool, &fc, &bad), IKV_E_INVALID, "rate");
    fc.rate = 1.5f;
    IKVT_EXPECT_STATUS(ikv_page_feedback_create(f.pool, &fc, &bad), IKV_E_INVALID, "rate");
    assert_null(bad);
    a.topk_feedback_weight = 2.0f;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_feedback_weight");
    a.topk_feedback_weight = NAN;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_feedback_weight");
    expect_feedback(fb, f.seq, 1, H, NP, avg); /* refused calls fed nothing back */
    pool_fix other;
    fix_init(&other, L, H, D, P, IKV_FMT_F16, 40, &rng, 0);
    a.topk_feedback_weight = 0;
    a.seqs = &other.seq;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, other.pool, &a), IKV_E_INVALID, "another pool");
    IKVT_OK(ikv_page_feedback_forget(fb, f.seq));
    IKVT_OK(ikv_page_feedback_get(fb, f.seq, 1, 0, NULL, 0, &n));
    assert_int_equal(n, 0);
    IKVT_OK(ikv_page_feedback_reset(fb));
    ikv_page_feedback_destroy(fb);
    ikv_page_feedback_destroy(NULL);
    ikv_layout_destroy(layout);
    ikv_plan_destroy(plan);
    free(avg);
    free_stored(&s);
    fix_free(&other);
    fix_free(&f);
}

/* A query row holding a NaN or an inf gets NaN in every channel of out and in
 * lse when it reads at least one key, and adds nothing to attention feedback;
 * a row that reads no key keeps out = 0 and lse = -inf; every other row is
 * the float64 reference's. Dense (T = 3), a plan of the last two tokens
 * (the first query token reads nothing), and dense with a softcap (which
 * would cap an infinite logit), on the CPU ISA CTest selects. */
static void test_non_finite_query_rows(void **state) {
    (void)state;
    enum { H = 2, G = 2, D = 64, P = 16, LEN = 100, NQ = H * G, T = 3, NP = (LEN + P - 1) / P };
    ikvt_rng rng = {0xBAD9};
    pool_fix f;
    fix_init(&f, 1, H, D, P, IKV_FMT_F16, LEN, &rng, 0);
    stored_kv s = read_stored(f.pool, f.seq, 0, H, D, P, LEN);
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    fc.rate = 0.5f;
    ikv_page_feedback *fb = NULL;
    IKVT_OK(ikv_page_feedback_create(f.pool, &fc, &fb));
    double *avg = calloc((size_t)H * NP, sizeof *avg);
    static const ikv_token_range last_two[] = {{98, 100}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(last_two, 1, LEN, P, IKV_FMT_F16, &plan));
    const double scale = 1.0 / sqrt((double)D);
    for (int step = 0; step < 3; ++step) {
        float q[T * NQ * D], out[T * NQ * D], lse[T * NQ];
        double ref[T * NQ * D], ref_lse[T * NQ];
        ikvt_fill_normal(&rng, q, T * NQ * D, 1.0f);
        /* rows t * NQ + hq: dense: (1, 1) NaN, (2, 2) +inf, (0, 3) -inf; plan: (0, 0) NaN reads nothing,
         * (2, 1) NaN; dense with a softcap (which would cap an infinite logit): (1, 2) +inf, (2, 0) -inf */
        const int bad[3][3] = {{1 * NQ + 1, 2 * NQ + 2, 0 * NQ + 3}, {0 * NQ + 0, 2 * NQ + 1, -1},
                               {1 * NQ + 2, 2 * NQ + 0, -1}};
        const float val[3][3] = {{NAN, INFINITY, -INFINITY}, {NAN, NAN, 0}, {INFINITY, -INFINITY, 0}};
        const double softcap = step == 2 ? 30.0 : 0.0;
        for (int i = 0; i < 3; ++i)
            if (bad[step][i] >= 0) q[(size_t)bad[step][i] * D + 5 + i] = val[step][i];
        ikv_decode_args a = ikv_decode_args_default();
        const ikv_plan *plans[1] = {plan};
        a.seqs = &f.seq;
        a.plans = step == 1 ? plans : NULL;
        a.n_query_tokens = T;
        a.n_q_heads = NQ;
        a.q = q;
        a.out = out;
        a.lse = lse;
        a.softcap = (float)softcap;
        a.feedback = softcap > 0 ? NULL : fb; /* (reference_feedback takes no softcap) */
        IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
        uint8_t *sel = plan_selection(step == 1 ? plan : NULL, LEN, H);
        reference_step(&s, sel, LEN, H, D, NQ, T, q, IKV_DTYPE_F32, scale, softcap, ref, ref_lse);
        if (a.feedback) reference_feedback(&s, sel, LEN, H, D, P, NQ, T, q, scale, 0.5, avg);
        free(sel);
        for (int row = 0; row < T * NQ; ++row) {
            int is_bad = 0;
            for (int i = 0; i < 3; ++i) is_bad |= bad[step][i] == row;
            const int reads_nothing = step == 1 && row / NQ == 0; /* position 97, the plan starts at 98 */
            for (int d = 0; d < D; ++d) {
                const float o = out[row * D + d];
                if (is_bad && !reads_nothing)
                    assert_true(isnan(o));
                else if (reads_nothing)
                    assert_true(o == 0.0f);
                else if (!(fabs(o - ref[row * D + d]) <= 1e-5 * (1 + fabs(ref[row * D + d]))))
                    fail_msg("step %d row %d channel %d: %.9g, the reference %.9g", step, row, d, (double)o,
                             ref[row * D + d]);
            }
            if (is_bad && !reads_nothing)
                assert_true(isnan(lse[row]));
            else if (reads_nothing)
                assert_true(isinf(lse[row]) && lse[row] < 0);
            else
                assert_true(fabs(lse[row] - ref_lse[row]) <= 1e-5 * (1 + fabs(ref_lse[row])));
        }
        expect_feedback(fb, f.seq, 0, H, NP, avg); /* finite: the bad rows left out (step 2 feeds nothing back) */
    }
    ikv_page_feedback_destroy(fb);
    ikv_plan_destroy(plan);
    free(avg);
    free_stored(&s);
    fix_free(&f);
}

/* Logits beyond fp32's range (finite q and keys, a scale near FLT_MAX):
 * a row none of whose logits is finite gets NaN outputs, never the empty
 * result (0, -inf) that a row reading no key gets, softcap or not (the
 * header). Keys all -1 and q all 0.5 make every logit -inf; keys of +1
 * every logit +inf. */
static void test_overflowing_logits(void **state) {
    (void)state;
    enum { H = 1, G = 2, D = 64, P = 16, LEN = 40, NQ = H * G };
    for (int sign = -1; sign <= 1; sign += 2)
        for (int fmt = 0; fmt < 2; ++fmt) {
            ikv_pool *pool = make_pool(1, H, D, P, fmt ? IKV_FMT_INT8 : IKV_FMT_F16, 8ull << 20);
            ikv_seq_id seq;
            IKVT_OK(ikv_seq_create(pool, &seq));
            static float k[LEN * H * D], v[LEN * H * D];
            for (int i = 0; i < LEN * H * D; ++i) k[i] = (float)sign, v[i] = (float)(i % 7) - 3.0f;
            ikv_append ap = ikv_append_default(pool, LEN);
            ap.k = k;
            ap.v = v;
            IKVT_OK(ikv_pool_append(pool, seq, &ap));
            static const ikv_token_range none[] = {{0, 1}};
            ikv_plan *plan = NULL; /* reads token 0 only */
            IKVT_OK(ikv_plan_from_ranges(none, 1, LEN, P, IKV_FMT_F16, &plan));
            for (int c = 0; c < 3; ++c) { /* dense; a one-token plan; dense with a softcap */
                float q[NQ * D], out[NQ * D], lse[NQ];
                for (int i = 0; i < NQ * D; ++i) q[i] = 0.5f;
                ikv_decode_args a = ikv_decode_args_default();
                const ikv_plan *plans[1] = {plan};
                a.seqs = &seq;
                a.plans = c == 1 ? plans : NULL;
                a.n_q_heads = NQ;
                a.q = q;
                a.out = out;
                a.lse = lse;
                a.scale = 3.4e38f;
                a.softcap = c == 2 ? 10.0f : 0.0f;
                ikv_decoder *decs[2] = {g_dec1, g_dec3};
                for (int di = 0; di < 2; ++di) {
                    IKVT_OK(ikv_decode(decs[di], pool, &a));
                    for (int r = 0; r < NQ; ++r) {
                        for (int d = 0; d < D; ++d)
                            if (!isnan(out[r * D + d]))
                                fail_msg("sign %d fmt %d case %d row %d channel %d: %g, expected NaN", sign, fmt, c, r,
                                         d, (double)out[r * D + d]);
                        assert_true(isnan(lse[r]));
                    }
                }
            }
            ikv_plan_destroy(plan);
            ikv_pool_destroy(pool);
        }
}

/* Out of plan A and plan B (disjoint) with their LSEs, the union's output
 * follows exactly: out = (e^lseA outA + e^lseB outB) / (e^lseA + e^lseB). */
static void test_lse_merges_disjoint_plans(void **state) {
    (void)state;
    ikvt_rng rng = {1000};
    const uint32_t H = 2, group = 4, D = 128, P = 16, length = 500, nq = H * group;
    pool_fix f;
    fix_init(&f, 1, H, D, P, IKV_FMT_INT8, length, &rng, 0);
    static const ikv_token_range ra[] = {{0, 37}, {100, 260}}, rb[] = {{37, 99}, {300, 500}},
                                 ru[] = {{0, 99}, {100, 260}, {300, 500}};
    ikv_plan *pa, *pb, *pu;
    IKVT_OK(ikv_plan_from_ranges(ra, 2, length, P, IKV_FMT_INT8, &pa));
    IKVT_OK(ikv_plan_from_ranges(rb, 2, length, P, IKV_FMT_INT8, &pb));
    IKVT_OK(ikv_plan_from_ranges(ru, 3, length, P, IKV_FMT_INT8, &pu));
    float *q = make_q(&rng, (size_t)nq * D, IKV_DTYPE_F32, 1.0f);
    float out[3][8 * 128], lse[3][8];
    const ikv_plan *which[3] = {pa, pb, pu};
    for (int i = 0; i < 3; ++i) {
        ikv_decode_args a = ikv_decode_args_default();
        a.seqs = &f.seq;
        a.plans = &which[i];
        a.n_q_heads = nq;
        a.q = q;
        a.out = out[i];
        a.lse = lse[i];
        IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
    }
    double merged[8 * 128], lse_m[8];
    for (uint32_t r = 0; r < nq; ++r) {
        const double m = lse[0][r] > lse[1][r] ? lse[0][r] : lse[1][r];
        const double wa = exp(lse[0][r] - m), wb = exp(lse[1][r] - m);
        for (uint32_t d = 0; d < D; ++d) merged[r * D + d] = (wa * out[0][r * D + d] + wb * out[1][r * D + d]) / (wa + wb);
        lse_m[r] = m + log(wa + wb);
    }
    compare(out[2], IKV_DTYPE_F32, IKV_FMT_INT8, lse[2], merged, lse_m, nq, D, "LSE merge of disjoint plans");
    free(q);
    ikv_plan_destroy(pa);
    ikv_plan_destroy(pb);
    ikv_plan_destroy(pu);
    fix_free(&f);
}

/* Selected-page decode equals dense decode over a pool that holds exactly
 * the selected tokens (F16 storage: identical stored values in both). */
static void test_selected_equals_dense_on_those_tokens(void **state) {
    (void)state;
    ikvt_rng rng = {1100};
    const uint32_t H = 2, group = 4, D = 64, P = 16, length = 333, nq = H * group;
    static const ikv_token_range ranges[] = {{5, 21}, {64, 65}, {90, 200}, {250, 333}};
    ikv_pool *full = make_pool(1, H, D, P, IKV_FMT_F16, 16u << 20), *part = make_pool(1, H, D, P, IKV_FMT_F16, 16u << 20);
    ikv_seq_id sf, sp;
    IKVT_OK(ikv_seq_create(full, &sf));
    IKVT_OK(ikv_seq_create(part, &sp));
    float *k = malloc((size_t)length * H * D * 4), *v = malloc((size_t)length * H * D * 4);
    ikvt_fill_normal(&rng, k, (size_t)length * H * D, 1.0f);
    ikvt_fill_normal(&rng, v, (size_t)length * H * D, 1.0f);
    ikv_append a = ikv_append_default(full, length);
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(full, sf, &a));
    for (int i = 0; i < 4; ++i) {
        ikv_append b = ikv_append_default(part, ranges[i].end - ranges[i].begin);
        b.k = k + (size_t)ranges[i].begin * H * D;
        b.v = v + (size_t)ranges[i].begin * H * D;
        IKVT_OK(ikv_pool_append(part, sp, &b));
    }
    ikv_plan *plan;
    IKVT_OK(ikv_plan_from_ranges(ranges, 4, length, P, IKV_FMT_F16, &plan));
    float *q = make_q(&rng, (size_t)nq * D, IKV_DTYPE_F32, 1.0f);
    float o1[8 * 64], o2[8 * 64], l1[8], l2[8];
    ikv_decode_args d = ikv_decode_args_default();
    d.n_q_heads = nq;
    d.q = q;
    d.seqs = &sf;
    const ikv_plan *plans[1] = {plan};
    d.plans = plans;
    d.out = o1;
    d.lse = l1;
    IKVT_OK(ikv_decode(g_dec3, full, &d));
    d.seqs = &sp;
    d.plans = NULL;
    d.out = o2;
    d.lse = l2;
    IKVT_OK(ikv_decode(g_dec1, part, &d));
    double ref[8 * 64], lref[8];
    for (size_t i = 0; i < nq * D; ++i) ref[i] = o2[i];
    for (size_t i = 0; i < nq; ++i) lref[i] = l2[i];
    compare(o1, IKV_DTYPE_F32, IKV_FMT_F16, l1, ref, lref, nq, D, "selected vs dense over the selected tokens");
    free(k);
    free(v);
    free(q);
    ikv_plan_destroy(plan);
    ikv_pool_destroy(full);
    ikv_pool_destroy(part);
}

static void test_empty_selection(void **state) {
    (void)state;
    ikvt_rng rng = {1200};
    const uint32_t H = 2, group = 2, D = 64, P = 16, length = 100, nq = H * group;
    pool_fix f;
    fix_init(&f, 1, H, D, P, IKV_FMT_F16, length, &rng, 0);
    IKVT_OK(ikv_seq_evict(f.pool, f.seq, 16, 64));
    static const ikv_token_range r[] = {{20, 60}}; /* only evicted tokens */
    ikv_plan *plan;
    IKVT_OK(ikv_plan_from_ranges(r, 1, length, P, IKV_FMT_F16, &plan));
    float *q = make_q(&rng, (size_t)2 * nq * D, IKV_DTYPE_F32, 1.0f);
    float out[2 * 4 * 64], lse[8];
    memset(out, 0x7F, sizeof out);
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &f.seq;
    const ikv_plan *plans[1] = {plan};
    a.plans = plans;
    a.n_q_heads = nq;
    a.n_query_tokens = 2;
    a.q = q;
    a.out = out;
    a.lse = lse;
    IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
    for (size_t i = 0; i < sizeof out / sizeof *out; ++i) assert_true(out[i] == 0.0f);
    for (int i = 0; i < 8; ++i) assert_true(isinf(lse[i]) && lse[i] < 0);
    uint64_t bytes = 1;
    IKVT_OK(ikv_decoder_last_bytes_read(g_dec3, &bytes));
    assert_int_equal(bytes, 0);
    free(q);
    ikv_plan_destroy(plan);
    fix_free(&f);
}

/* Several sequences of different lengths, plans and formats in one call. */
static void test_batch(void **state) {
    (void)state;
    ikvt_rng rng = {1300};
    const uint32_t H = 2, group = 4, D = 96, P = 16, nq = H * group, nqt = 3, B = 3;
    const uint32_t lens[3] = {70, 333, 1000};
    ikv_pool *pool = make_pool(1, H, D, P, IKV_FMT_INT8, 64u << 20);
    ikv_seq_id seqs[3];
    for (uint32_t b = 0; b < B; ++b) {
        IKVT_OK(ikv_seq_create(pool, &seqs[b]));
        append_random(pool, seqs[b], 1, H, D, P, 0, lens[b], &rng, 0);
    }
    static const ikv_token_range r1[] = {{10, 200}, {300, 333}};
    static const ikv_token_range r2[] = {{0, 1}, {500, 999}};
    ikv_plan *p1, *p2;
    IKVT_OK(ikv_plan_from_ranges(r1, 2, lens[1], P, IKV_FMT_INT8, &p1));
    IKVT_OK(ikv_plan_from_ranges(r2, 2, lens[2], P, IKV_FMT_INT8, &p2));
    const ikv_plan *plans[3] = {NULL, p1, p2};
    const size_t rows = (size_t)nqt * nq;
    float *q = make_q(&rng, B * rows * D, IKV_DTYPE_F32, 1.0f);
    float *out = malloc(B * rows * D * 4), *lse = malloc(B * rows * 4);
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = B;
    a.seqs = seqs;
    a.plans = plans;
    a.n_q_heads = nq;
    a.n_query_tokens = nqt;
    a.q = q;
    a.out = out;
    a.lse = lse;
    for (int di = 0; di < 2; ++di) {
        IKVT_OK(ikv_decode(di ? g_dec3 : g_dec1, pool, &a));
        for (uint32_t b = 0; b < B; ++b) {
            stored_kv s = read_stored(pool, seqs[b], 0, H, D, P, lens[b]);
            uint8_t *sel = plan_selection(plans[b], lens[b], H);
            double *oref = malloc(rows * D * 8), *lref = malloc(rows * 8);
            reference_step(&s, sel, lens[b], H, D, nq, nqt, q + b * rows * D, IKV_DTYPE_F32, 1.0 / sqrt(D), 0, oref,
                           lref);
            compare(out + b * rows * D, IKV_DTYPE_F32, IKV_FMT_INT8, lse + b * rows, oref, lref, rows, D, "batch");
            free(oref);
            free(lref);
            free(sel);
            free_stored(&s);
        }
    }
    free(q);
    free(out);
    free(lse);
    ikv_plan_destroy(p1);
    ikv_plan_destroy(p2);
    ikv_pool_destroy(pool);
}

/* A 128K-token context (small head count so it stays fast). */
static void test_long_context_128k(void **state) {
    (void)state;
    ikvt_rng rng = {1400};
    const uint32_t H = 1, group = 2, D = 64, P = 64, length = 131072, nq = H * group;
    ikv_pool *pool = make_pool(1, H, D, P, IKV_FMT_INT8, 256u << 20);
    ikv_seq_id seq;
    IKVT_OK(ikv_seq_create(pool, &seq));
    for (uint32_t done = 0; done < length; done += 8192) append_random(pool, seq, 1, H, D, P, done, 8192, &rng, 0);
    float *q = make_q(&rng, (size_t)nq * D, IKV_DTYPE_F32, 2.0f);
    stored_kv s = read_stored(pool, seq, 0, H, D, P, length);
    uint8_t *sel = plan_selection(NULL, length, H);
    double oref[2 * 64], lref[2];
    reference_step(&s, sel, length, H, D, nq, 1, q, IKV_DTYPE_F32, 1.0 / 8.0, 0, oref, lref);
    float out[2 * 64], lse[2];
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &seq;
    a.n_q_heads = nq;
    a.q = q;
    a.out = out;
    a.lse = lse;
    IKVT_OK(ikv_decode(g_dec3, pool, &a));
    compare(out, IKV_DTYPE_F32, IKV_FMT_INT8, lse, oref, lref, nq, D, "128K dense, 3 threads");
    IKVT_OK(ikv_decode(g_dec1, pool, &a));
    compare(out, IKV_DTYPE_F32, IKV_FMT_INT8, lse, oref, lref, nq, D, "128K dense, 1 thread");
    uint64_t bytes = 0;
    IKVT_OK(ikv_decoder_last_bytes_read(g_dec1, &bytes));
    /* INT8: per page K+V rows, K scales per channel, V scales per token */
    const uint64_t pages = length / P;
    assert_int_equal(bytes, pages * (2ull * D * P + 4ull * D + 4ull * P));
    free(q);
    free(sel);
    free_stored(&s);
    ikv_pool_destroy(pool);
}

static void test_bytes_read_dense_f16(void **state) {
    (void)state;
    ikvt_rng rng = {1500};
    pool_fix f;
    fix_init(&f, 1, 2, 64, 16, IKV_FMT_F16, 77, &rng, 0);
    float *q = make_q(&rng, 8 * 64, IKV_DTYPE_F32, 1.0f);
    float out[8 * 64];
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &f.seq;
    a.n_q_heads = 8;
    a.q = q;
    a.out = out;
    IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
    uint64_t bytes = 0;
    IKVT_OK(ikv_decoder_last_bytes_read(g_dec3, &bytes));
    assert_int_equal(bytes, 2ull /*heads*/ * 77 * 2 /*K,V*/ * 64 * 2 /*bytes*/);
    IKVT_EXPECT_STATUS(ikv_decoder_last_bytes_read(NULL, &bytes), IKV_E_NULL, "decoder");
    IKVT_EXPECT_STATUS(ikv_decoder_last_bytes_read(g_dec3, NULL), IKV_E_NULL, "bytes_out");
    free(q);
    fix_free(&f);
}

/* Decode arguments for one sequence, F32 q and out. */
static ikv_decode_args one_seq_args(const ikv_seq_id *seq, uint32_t n_q_heads, const float *q, float *out) {
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = seq;
    a.n_q_heads = n_q_heads;
    a.q = q;
    a.out = out;
    return a;
}

/* ikv_plan_get_cost is "the count ikv_decoder_last_bytes_read makes": a plan
 * with two separate runs of one page (and a partial tail) reads that page's
 * scales once per run, in every format; the decoder and the cost agree. */
static void test_plan_cost_equals_bytes_read(void **state) {
    (void)state;
    for (int fmt = 0; fmt < IKV_FMT_COUNT; ++fmt) {
        ikvt_rng rng = {1550u + (uint64_t)fmt};
        pool_fix f;
        fix_init(&f, 1, 2, 64, 16, (ikv_format)fmt, 45, &rng, 0);
        /* page 0: runs [1, 4) and [9, 12); page 1 whole; page 2: [40, 45) */
        const ikv_token_range r[] = {{1, 4}, {9, 12}, {16, 32}, {40, 45}};
        ikv_plan *plan = NULL;
        IKVT_OK(ikv_plan_from_ranges(r, 4, 45, 16, (ikv_format)fmt, &plan));
        float *q = make_q(&rng, 4 * 64, IKV_DTYPE_F32, 1.0f);
        float out[4 * 64];
        const ikv_plan *plans[1] = {plan};
        ikv_decode_args a = one_seq_args(&f.seq, 4, q, out);
        a.plans = plans;
        IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
        uint64_t bytes = 0;
        IKVT_OK(ikv_decoder_last_bytes_read(g_dec3, &bytes));
        const ikv_model_shape sh = ikvt_model_shape(1, 4, 2, 64);
        ikv_plan_cost c;
        IKVT_OK(ikv_plan_get_cost(plan, &sh, &c));
        assert_int_equal(c.bytes_total, bytes);
        assert_int_equal(c.bytes_by_format[fmt], bytes);
        free(q);
        ikv_plan_destroy(plan);
        fix_free(&f);
    }
}

/* IKV_TOPK_SCORE_KEYS' bytes, as the header counts them, with a budget that
 * keeps every page (so every page is a candidate and is read): per kv-head
 * the hybrid summaries (6 * head_dim per page), each candidate's K rows and
 * K scales, then the pages' K/V rows and scales. F16 and INT8, 390 tokens:
 * 24 full pages and one of 6. */
static void test_bytes_read_keys(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    for (int fi = 0; fi < 2; ++fi) {
        ikvt_rng rng = {1600 + (uint64_t)fi};
        pool_fix f;
        enum { H = 2, D = 64, LEN = 390, PAGES = 25 };
        fix_init(&f, 1, H, D, 16, fmts[fi], LEN, &rng, 1);
        float *q = make_q(&rng, 8 * D, IKV_DTYPE_F32, 1.0f);
        float out[8 * D];
        ikv_decode_args a = one_seq_args(&f.seq, 8, q, out);
        a.topk_token_budget = LEN;
        a.topk_score = IKV_TOPK_SCORE_KEYS;
        IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
        uint64_t bytes = 0;
        IKVT_OK(ikv_decoder_last_bytes_read(g_dec3, &bytes));
        const uint64_t summaries = PAGES * 6ull * D;
        const uint64_t keys = fi == 0 ? 2ull * D * LEN : 1ull * D * LEN + PAGES * 4ull * D;  /* INT8: k_scale[D] f32 */
        const uint64_t rows = fi == 0 ? 4ull * D * LEN : 2ull * D * LEN + PAGES * 4ull * D + 4ull * LEN;  /* + v_scale */
        assert_int_equal(bytes, (uint64_t)H * (summaries + keys + rows));
        free(q);
        fix_free(&f);
    }
}

/* IKV_TOPK_SCORE_KEYS over a batch: each sequence's selection equals the
 * same sequence's decoded alone with its query (a fork of the first,
 * truncated, beside it; the second pass's per-sequence entries). */
static void test_keys_score_batch(void **state) {
    (void)state;
    ikvt_rng rng = {1700};
    pool_fix f;
    enum { H = 2, D = 64, NQ = 8 };
    fix_init(&f, 1, H, D, 16, IKV_FMT_F16, 390, &rng, 1);
    ikv_seq_id seqs[2] = {f.seq, 0};
    IKVT_OK(ikv_seq_fork(f.pool, f.seq, &seqs[1]));
    IKVT_OK(ikv_seq_truncate(f.pool, seqs[1], 301));
    float *q = make_q(&rng, 2 * NQ * D, IKV_DTYPE_F32, 2.0f), out[2 * NQ * D];
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = 2;
    a.seqs = seqs;
    a.n_q_heads = NQ;
    a.q = q;
    a.out = out;
    a.topk_token_budget = 64;
    a.topk_score = IKV_TOPK_SCORE_KEYS;
    IKVT_OK(ikv_decode(g_dec3, f.pool, &a));
    ikv_token_range batch[2][H][32], alone[32];
    size_t nb[2][H];
    for (uint32_t s = 0; s < 2; ++s)
        for (uint32_t h = 0; h < H; ++h) IKVT_OK(ikv_decoder_last_selection(g_dec3, s, h, batch[s][h], 32, &nb[s][h]));
    for (uint32_t s = 0; s < 2; ++s) {
        a.n_seqs = 1;
        a.seqs = &seqs[s];
        a.q = q + (size_t)s * NQ * D;
        IKVT_OK(ikv_decode(g_dec1, f.pool, &a));
        for (uint32_t h = 0; h < H; ++h) {
            size_t n = 0;
            IKVT_OK(ikv_decoder_last_selection(g_dec1, 0, h, alone, 32, &n));
            assert_int_equal(n, nb[s][h]);
            assert_true(n > 0 && n <= 32);
            assert_memory_equal(alone, batch[s][h], n * sizeof alone[0]);
        }
    }
    free(q);
    fix_free(&f);
}

/* Every rejected call names the argument and writes nothing. */
static void test_bad_inputs(void **state) {
    (void)state;
    ikvt_rng rng = {1600};
    pool_fix f;
    fix_init(&f, 2, 2, 64, 16, IKV_FMT_F16, 40, &rng, 0);
    float q[16 * 8 * 64];
    ikvt_fill_normal(&rng, q, sizeof q / sizeof *q, 1.0f);
    static float out[16 * 8 * 64], lse[16 * 8];
    static unsigned char poison_out[sizeof out], poison_lse[sizeof lse];
    memset(poison_out, 0xAB, sizeof poison_out);
    memset(poison_lse, 0xCD, sizeof poison_lse);
    ikv_plan *plan32;
    static const ikv_token_range r[] = {{0, 10}};
    IKVT_OK(ikv_plan_from_ranges(r, 1, 40, 32, IKV_FMT_F16, &plan32));
    const ikv_plan *bad_plans[1] = {plan32};
    ikv_seq_id unknown = f.seq + 1000;

#define RESET_ARGS()                          \
    a = ikv_decode_args_default();            \
    a.seqs = &f.seq;                          \
    a.n_q_heads = 8;                          \
    a.q = q;                                  \
    a.out = out;                              \
    a.lse = lse;                              \
    memcpy(out, poison_out, sizeof out);      \
    memcpy(lse, poison_lse, sizeof lse)
#define EXPECT_UNTOUCHED()                                      \
    assert_memory_equal(out, poison_out, sizeof out);           \
    assert_memory_equal(lse, poison_lse, sizeof lse)

    ikv_decode_args a;
    RESET_ARGS();
    IKVT_EXPECT_STATUS(ikv_decode(NULL, f.pool, &a), IKV_E_NULL, "decoder");
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, NULL, &a), IKV_E_NULL, "pool");
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, NULL), IKV_E_NULL, "args");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.seqs = NULL;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_NULL, "seqs");
    RESET_ARGS();
    a.q = NULL;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_NULL, "q");
    RESET_ARGS();
    a.out = NULL;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_NULL, "out");
    RESET_ARGS();
    a.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "struct_size");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.seqs = &unknown;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_NOT_FOUND, "seqs[0]");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.layer = 2;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_RANGE, "layer");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.n_q_heads = 7;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_q_heads");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.n_q_heads = 0;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_q_heads");
    RESET_ARGS();
    a.n_query_tokens = 0;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_query_tokens");
    RESET_ARGS();
    a.n_query_tokens = IKV_MAX_QUERY_TOKENS + 1;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_query_tokens");
    EXPECT_UNTOUCHED();
    { /* more query tokens than stored tokens */
        ikv_seq_id tiny;
        IKVT_OK(ikv_seq_create(f.pool, &tiny));
        append_random(f.pool, tiny, 2, 2, 64, 16, 0, 3, &rng, 0);
        RESET_ARGS();
        a.seqs = &tiny;
        a.n_query_tokens = 4;
        IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_query_tokens");
        EXPECT_UNTOUCHED();
    }
    RESET_ARGS();
    a.q_dtype = (ikv_dtype)7;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "q_dtype");
    RESET_ARGS();
    a.out_dtype = (ikv_dtype)-1;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "out_dtype");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.scale = -1.0f;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "scale");
    RESET_ARGS();
    a.softcap = NAN;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "softcap");
    RESET_ARGS();
    a.n_seqs = 0;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "n_seqs");
    RESET_ARGS();
    a.plans = bad_plans;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "page_size");
    EXPECT_UNTOUCHED();
    RESET_ARGS();
    a.topk_mode = (ikv_topk_mode)2;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_mode");
    RESET_ARGS();
    a.topk_score = (ikv_topk_score)-3;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_score");
    const float bad_mass[] = {0.0f, -0.5f, 1.5f, NAN};
    for (int i = 0; i < 4; ++i) {
        RESET_ARGS();
        a.topk_mode = IKV_TOPK_MASS;
        a.topk_mass = bad_mass[i];
        IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_mass");
    }
    RESET_ARGS();
    a.topk_mode = IKV_TOPK_MASS;
    a.topk_token_budget = 16;
    a.topk_min_tokens = 17;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_INVALID, "topk_min_tokens");
    EXPECT_UNTOUCHED();
    /* a caller built before the topk_mode fields (struct_size through stream) gets their defaults */
    RESET_ARGS();
    a.struct_size = (uint32_t)(offsetof(ikv_decode_args, stream) + sizeof(void *));
    a.topk_mode = (ikv_topk_mode)77; /* beyond struct_size: never read */
    IKVT_OK(ikv_decode(g_dec1, f.pool, &a));

    /* last_selection: bad arguments, and nothing before a first success */
    size_t n_runs = 0;
    ikv_token_range run1[1];
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(NULL, 0, 0, NULL, 0, &n_runs), IKV_E_NULL, "decoder");
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(g_dec1, 0, 0, NULL, 0, NULL), IKV_E_NULL, "n_out");
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(g_dec1, 0, 0, NULL, 1, &n_runs), IKV_E_NULL, "ranges");
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(g_dec1, 1, 0, run1, 1, &n_runs), IKV_E_RANGE, "seq_index");
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(g_dec1, 0, 2, run1, 1, &n_runs), IKV_E_RANGE, "kv_head");
    IKVT_OK(ikv_decoder_last_selection(g_dec1, 0, 1, run1, 1, &n_runs)); /* dense: one run [0, 40) */
    assert_int_equal(n_runs, 1);
    assert_int_equal(run1[0].begin, 0);
    assert_int_equal(run1[0].end, 40);
    RESET_ARGS();
    a.layer = 9;
    IKVT_EXPECT_STATUS(ikv_decode(g_dec1, f.pool, &a), IKV_E_RANGE, "layer");
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(g_dec1, 0, 0, run1, 1, &n_runs), IKV_E_STATE, "no successful");
    {
        ikv_decoder *fresh = NULL;
        ikv_decoder_config dc = ikv_decoder_default_config();
        IKVT_OK(ikv_decoder_create(&dc, &fresh));
        IKVT_EXPECT_STATUS(ikv_decoder_last_selection(fresh, 0, 0, run1, 1, &n_runs), IKV_E_STATE, "no successful");
        ikv_decoder_destroy(fresh);
    }

    /* decoder creation */
    ikv_decoder *d = NULL;
    ikv_decoder_config c = ikv_decoder_default_config();
    IKVT_EXPECT_STATUS(ikv_decoder_create(NULL, &d), IKV_E_NULL, "config");
    IKVT_EXPECT_STATUS(ikv_decoder_create(&c, NULL), IKV_E_NULL, "out");
    c.n_threads = 100000;
    IKVT_EXPECT_STATUS(ikv_decoder_create(&c, &d), IKV_E_INVALID, "n_threads");
    assert_null(d);
    c = ikv_decoder_default_config();
    c.struct_size = 2;
    IKVT_EXPECT_STATUS(ikv_decoder_create(&c, &d), IKV_E_INVALID, "struct_size");
    ikv_decoder_destroy(NULL); /* no-op */
    ikv_plan_destroy(plan32);
    fix_free(&f);
#undef RESET_ARGS
#undef EXPECT_UNTOUCHED
}

static int setup(void **state) {
    (void)state;
    ikv_decoder_config c = ikv_decoder_default_config();
    c.n_threads = 1;
    if (ikv_decoder_create(&c, &g_dec1) != IKV_OK) return -1;
    c.n_threads = 3;
    if (ikv_decoder_create(&c, &g_dec3) != IKV_OK) return -1;
    return 0;
}

/* Page lists kept across calls (ikv_decoder_get_stats): reused exactly while
 * nothing that decides them changed; outputs bitwise those of a fresh
 * decoder after every kind of pool change (support/list_reuse.c). */
static void test_page_lists_reused_across_layers(void **state) {
    (void)state;
    ikvt_list_reuse_scenario(IKV_BACKEND_CPU);
}

static int teardown(void **state) {
    (void)state;
    ikv_decoder_destroy(g_dec1);
    ikv_decoder_destroy(g_dec3);
    return 0;
}

/* A decode that appends (ikv_decode_args.append) on a CPU pool: the same
 * pages and outputs, byte for byte, as ikv_pool_append_batch then
 * ikv_decode, over a page boundary; arguments checked before anything is
 * appended (a query longer than the sequence becomes counts its new tokens). */
static void test_decode_with_append(void **state) {
    (void)state;
    enum { L = 2, H = 2, D = 64, P = 16, HQ = 4, B = 2, STEPS = 20 };
    ikv_pool *pa = make_pool(L, H, D, P, IKV_FMT_INT8, 8u << 20), *pb = make_pool(L, H, D, P, IKV_FMT_INT8, 8u << 20);
    ikv_seq_id sa[B], sb[B];
    ikvt_rng rng = {4242};
    for (uint32_t b = 0; b < B; ++b) {
        IKVT_OK(ikv_seq_create(pa, &sa[b]));
        IKVT_OK(ikv_seq_create(pb, &sb[b]));
    }
    float k[L * B * H * D], v[L * B * H * D], q[B * HQ * D], oa[B * HQ * D], ob[B * HQ * D];
    for (uint32_t t = 0; t < STEPS; ++t) {
        ikvt_fill_normal(&rng, k, L * B * H * D, 1.0f);
        ikvt_fill_normal(&rng, v, L * B * H * D, 1.0f);
        ikvt_fill_normal(&rng, q, B * HQ * D, 1.0f);
        for (uint32_t l = 0; l < L; ++l) {
            ikv_append a = ikv_append_default(pa, 1);
            a.layer = l;
            a.k = k + (size_t)l * B * H * D;
            a.v = v + (size_t)l * B * H * D;
            ikv_decode_args d = ikv_decode_args_default();
            d.layer = l;
            d.n_seqs = B;
            d.n_q_heads = HQ;
            d.q = q;
            d.seqs = sb;
            d.out = ob;
            IKVT_OK(ikv_pool_append_batch(pb, sb, B, &a));
            IKVT_OK(ikv_decode(g_dec1, pb, &d));
            d.seqs = sa;
            d.out = oa;
            d.append = &a;
            if (t == 0) { /* the first token: the query needs the appended one */
                d.n_query_tokens = 2;
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "n_query_tokens");
                d.n_query_tokens = 1;
                a.layer = 1 - l;
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "args->append->layer");
                a.layer = l;
                a.token_stride = 1;
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "ikv_decode (args->append)");
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "args->append->token_stride is 1");
                a.token_stride = H * D;
                const void *kk = a.k;
                a.k = NULL; /* the sentence names the field by the caller's path to it */
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_NULL, "args->append->k is NULL");
                a.k = kk;
                a.stream = &a; /* not the decode's (NULL) */
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "args->append->stream");
                a.stream = NULL;
                a.struct_size = 8;
                IKVT_EXPECT_STATUS(ikv_decode(g_dec3, pa, &d), IKV_E_INVALID, "args->append->struct_size");
                a.struct_size = sizeof a;
                uint32_t len = 99;
                IKVT_OK(ikv_seq_layer_length(pa, sa[0], l, &len));
                assert_int_equal(len, 0); /* nothing appended */
            }
            IKVT_OK(ikv_decode(g_dec3, pa, &d));
            if (memcmp(oa, ob, sizeof oa) != 0) fail_msg("step %u layer %u: outputs differ", t, l);
        }
    }
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t l = 0; l < L; ++l) {
            float ka[STEPS * H * D], va[STEPS * H * D], kb[STEPS * H * D], vb[STEPS * H * D];
            IKVT_OK(ikv_seq_read(pa, sa[b], l, 0, STEPS, ka, va));
            IKVT_OK(ikv_seq_read(pb, sb[b], l, 0, STEPS, kb, vb));
            assert_memory_equal(ka, kb, sizeof ka);
            assert_memory_equal(va, vb, sizeof va);
        }
    ikv_decoder_stats st;
    st.struct_size = sizeof st;
    IKVT_OK(ikv_decoder_get_stats(g_dec3, &st));
    assert_int_equal(st.appends_fused, 0); /* a CPU decode appends first, as the separate call */
    ikv_pool_destroy(pa);
    ikv_pool_destroy(pb);
}

int main(void) {
    ikv_runtime_info info;
    info.struct_size = sizeof info;
    if (ikv_runtime_info_get(&info) != IKV_OK) return 1;
    const char *want = getenv("IKV_CPU_ISA");
    if (want != NULL && want[0] != '\0' && strcmp(want, info.cpu_isa) != 0) {
        char why[160];
        snprintf(why, sizeof why, "IKV_CPU_ISA=%s is not available on this CPU/build (available: %s)", want,
                 info.cpu_isa_available);
        ikvt_skip_program(why);
    }
    printf("decode tests on the %s path\n", info.cpu_isa);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_and_head_dims),
        cmocka_unit_test(test_gqa_groups_and_page_sizes),
        cmocka_unit_test(test_partial_plans_and_evicted),
        cmocka_unit_test(test_multi_token_causal),
        cmocka_unit_test(test_long_multi_token_causal),
        cmocka_unit_test(test_softcap_and_scale),
        cmocka_unit_test(test_q_and_out_dtypes),
        cmocka_unit_test(test_other_layer),
        cmocka_unit_test(test_topk_selection),
        cmocka_unit_test(test_topk_selection_whole_pages),
        cmocka_unit_test(test_topk_mass_selection),
        cmocka_unit_test(test_topk_hybrid_score),
        cmocka_unit_test(test_topk_keys_score),
        cmocka_unit_test(test_bytes_read_keys),
        cmocka_unit_test(test_keys_score_batch),
        cmocka_unit_test(test_keys_score_skips_bad_rows),
        cmocka_unit_test(test_topk_with_mandatory_pages),
        cmocka_unit_test(test_query_memory_selection),
        cmocka_unit_test(test_query_memory_errors),
        cmocka_unit_test(test_attention_feedback),
        cmocka_unit_test(test_feedback_zero_share_block),
        cmocka_unit_test(test_feedback_shares_of_huge_logits),
        cmocka_unit_test(test_lse_merges_disjoint_plans),
        cmocka_unit_test(test_selected_equals_dense_on_those_tokens),
        cmocka_unit_test(test_empty_selection),
        cmocka_unit_test(test_non_finite_query_rows),
        cmocka_unit_test(test_overflowing_logits),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_long_context_128k),
        cmocka_unit_test(test_bytes_read_dense_f16),
        cmocka_unit_test(test_plan_cost_equals_bytes_read),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_page_lists_reused_across_layers),
        cmocka_unit_test(test_decode_with_append),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
