/* Helpers of the CPU-vs-CUDA equivalence checks (equiv_*.c): the same public
 * calls on a CPU pool and a CUDA pool fed the same tokens, compared as the
 * header and docs promise (statuses, state, outputs within the documented
 * tolerances, selections, bytes, stats). Written 2026-11-27 from the header;
 * compiled and self-tested with XB_SELFTEST=1 (two CPU pools), not yet run
 * on a GPU when they were added: a first GPU run may find bugs in them as
 * well as in the library. Builds on contract_util.h. */
#ifndef IKV_EQUIV_UTIL_H
#define IKV_EQUIV_UTIL_H
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"
#include <math.h>
/* XB_SELFTEST=1 (for checking the probes themselves on a machine without a GPU): the "CUDA" pool is a
 * second CPU pool and device buffers are host buffers. Never set it on the GPU machine. */
static int xb_selftest(void) { const char *e = getenv("XB_SELFTEST"); return e && e[0] == '1'; }
#define require_gpu() do { if (!xb_selftest()) require_gpu(); else printf("info: XB_SELFTEST: CPU vs CPU\n"); } while (0)

/* ---- 16-bit conversions (round to nearest even) ---- */
static inline uint16_t f2h(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
    return (uint16_t)(sign | h);
}
static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
    if (exp == 0) {
        if (mant == 0) x = sign;
        else { float f = ldexpf((float)mant, -24); return sign ? -f : f; }
    } else if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f; memcpy(&f, &x, 4); return f;
}
static inline uint16_t f2bf(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    uint32_t lsb = (x >> 16) & 1u; x += 0x7fffu + lsb; return (uint16_t)(x >> 16);
}
static inline float bf2f(uint16_t b) { uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }
static inline size_t dtype_size(ikv_dtype d) { return d == IKV_DTYPE_F32 ? 4 : 2; }
/* float array -> dtype buffer (malloc'd); also rounds src in place to what the dtype holds */
static inline void *to_dtype(float *src, size_t n, ikv_dtype d) {
    void *buf = malloc(n * dtype_size(d));
    for (size_t i = 0; i < n; ++i) {
        if (d == IKV_DTYPE_F32) ((float *)buf)[i] = src[i];
        else if (d == IKV_DTYPE_F16) { uint16_t h = f2h(src[i]); ((uint16_t *)buf)[i] = h; src[i] = h2f(h); }
        else { uint16_t b = f2bf(src[i]); ((uint16_t *)buf)[i] = b; src[i] = bf2f(b); }
    }
    return buf;
}
static inline void from_dtype(const void *buf, size_t n, ikv_dtype d, float *dst) {
    for (size_t i = 0; i < n; ++i) {
        if (d == IKV_DTYPE_F32) dst[i] = ((const float *)buf)[i];
        else if (d == IKV_DTYPE_F16) dst[i] = h2f(((const uint16_t *)buf)[i]);
        else dst[i] = bf2f(((const uint16_t *)buf)[i]);
    }
}

/* ---- pools ---- */
typedef struct xb_shape { uint32_t L, H, D, P; ikv_format fmt; uint64_t host_cap; } xb_shape;
static inline ikv_pool *xb_pool(const xb_shape *s, ikv_backend be) {
    ikv_pool_config c = ikv_pool_default_config();
    if (xb_selftest()) be = IKV_BACKEND_CPU;
    c.backend = be; c.device = 0;
    c.n_layers = s->L; c.n_kv_heads = s->H; c.head_dim = s->D; c.page_size = s->P;
    c.capacity_bytes = 256ull << 20; c.default_format = s->fmt; c.kv_dtype = IKV_DTYPE_F32;
    c.host_capacity_bytes = be == IKV_BACKEND_CUDA ? s->host_cap : 0;
    ikv_pool *p = NULL;
    IK(ikv_pool_create(&c, &p));
    return p;
}
/* Host-input append of n tokens to `layer` (or IKV_ALL_LAYERS: same rows for all layers). */
static inline ikv_status xb_append(ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t n, const float *k,
                                   const float *v, const ikv_plan *formats) {
    ikv_append a = ikv_append_default(pool, n);
    a.layer = layer; a.k = k; a.v = v; a.formats = formats;
    if (layer != IKV_ALL_LAYERS) return ikv_pool_append(pool, seq, &a);
    /* the same rows for every layer (layer_stride 0 is refused): copy them per layer */
    ikv_pool_config c; memset(&c, 0, sizeof c); c.struct_size = sizeof c;
    IK(ikv_pool_get_config(pool, &c));
    const size_t per = (size_t)n * c.n_kv_heads * c.head_dim;
    float *kk = (float *)malloc(per * c.n_layers * 4), *vv = (float *)malloc(per * c.n_layers * 4);
    for (uint32_t l = 0; l < c.n_layers; ++l) { memcpy(kk + l * per, k, per * 4); memcpy(vv + l * per, v, per * 4); }
    a.k = kk; a.v = vv; a.layer_stride = (int64_t)per;
    ikv_status st = ikv_pool_append(pool, seq, &a);
    free(kk); free(vv);
    return st;
}
/* Random K/V rows: n tokens x H x D, magnitude mag, channel-dependent offsets (so summaries differ). */
static inline float *xb_rows(uint32_t n, uint32_t H, uint32_t D, uint32_t seed, float mag) {
    g_lcg = seed;
    float *r = (float *)malloc((size_t)n * H * D * sizeof(float));
    for (size_t i = 0; i < (size_t)n * H * D; ++i) r[i] = mag * rnd();
    return r;
}

/* ---- decode on either pool; q given as float (rounded in place to q_dtype) ---- */
typedef struct xb_out { float *out; float *lse; ikv_status st; size_t n_rows; } xb_out;
static inline void xb_out_free(xb_out *o) { free(o->out); free(o->lse); o->out = o->lse = NULL; }
/* Runs ikv_decode(dec, pool, a) with a->q / a->out / a->lse replaced by buffers made here from qf.
 * n_rows = n_seqs*T*Hq. Outputs come back as float on the host. out poisoned with NaN first. */
static inline xb_out xb_decode(ikv_decoder *dec, ikv_pool *pool, int cuda, ikv_decode_args a, const float *qf,
                               uint32_t D) {
    xb_out r = {0};
    const size_t rows0 = (size_t)a.n_seqs * a.n_query_tokens * a.n_q_heads;
    const size_t rows = rows0 ? rows0 : 1, n = rows * D; /* never a zero-size (possibly NULL) buffer */
    float *qcopy = (float *)malloc(n * 4); memcpy(qcopy, qf, n * 4);
    void *qh = to_dtype(qcopy, n, a.q_dtype);
    free(qcopy);
    const size_t osz = n * dtype_size(a.out_dtype);
    void *oh = malloc(osz + 4); memset(oh, 0xff, osz);
    float *lh = (float *)malloc(rows * 4 + 4); for (size_t i = 0; i < rows; ++i) lh[i] = NAN;
    if (!cuda || xb_selftest()) {
        a.q = qh; a.out = oh; a.lse = lh; a.stream = NULL;
        r.st = ikv_decode(dec, pool, &a);
    } else {
        void *qd, *od; float *ld;
        CK(cudaMalloc(&qd, n * dtype_size(a.q_dtype)));
        CK(cudaMalloc(&od, osz));
        CK(cudaMalloc((void **)&ld, rows * 4));
        CK(cudaMemcpy(qd, qh, n * dtype_size(a.q_dtype), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(od, oh, osz, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ld, lh, rows * 4, cudaMemcpyHostToDevice));
        a.q = qd; a.out = od; a.lse = ld; a.stream = NULL;
        r.st = ikv_decode(dec, pool, &a);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(oh, od, osz, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lh, ld, rows * 4, cudaMemcpyDeviceToHost));
        cudaFree(qd); cudaFree(od); cudaFree(ld);
    }
    r.n_rows = rows0;
    r.out = (float *)malloc(n * 4 + 4);
    from_dtype(oh, n, a.out_dtype, r.out);
    r.lse = lh;
    free(qh); free(oh);
    return r;
}

/* ---- float64 reference on the stored values ----
 * mask[h*Lmax + pos] != 0: kv-head h of this sequence may read pos (plan/selection/eviction applied);
 * causality applied here. qf: [T][Hq][D] already rounded to the q dtype. */
static inline void xb_ref(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, const xb_shape *s, uint32_t Hq,
                          uint32_t T, const float *qf, const unsigned char *mask, uint32_t Lmax, float scale,
                          float softcap, double *out, double *lse) {
    uint32_t len = 0;
    IK(ikv_seq_layer_length(pool, seq, layer, &len));
    const uint32_t D = s->D, H = s->H, G = Hq / H;
    float *K = (float *)calloc((size_t)len * H * D, 4), *V = (float *)calloc((size_t)len * H * D, 4);
    unsigned char *live = (unsigned char *)calloc(len ? len : 1, 1);
    for (uint32_t p0 = 0; p0 < len; p0 += s->P) {
        int ev = 0;
        IK(ikv_seq_is_evicted(pool, seq, p0, &ev));
        if (ev) continue;
        uint32_t e = p0 + s->P < len ? p0 + s->P : len;
        IK(ikv_seq_read(pool, seq, layer, p0, e, K + (size_t)p0 * H * D, V + (size_t)p0 * H * D));
        for (uint32_t t = p0; t < e; ++t) live[t] = 1;
    }
    const double sc = scale > 0 ? scale : 1.0 / sqrt((double)D);
    double *lg = (double *)malloc((size_t)(len ? len : 1) * sizeof(double));
    for (uint32_t t = 0; t < T; ++t) {
        const uint32_t qpos = len - T + t;
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t h = hq / G;
            const float *q = qf + ((size_t)t * Hq + hq) * D;
            double m = -INFINITY;
            for (uint32_t j = 0; j < len; ++j) {
                lg[j] = -INFINITY;
                if (!live[j] || j > qpos || (mask && j < Lmax && !mask[(size_t)h * Lmax + j])) continue;
                if (mask && j >= Lmax) continue;
                double d = 0;
                for (uint32_t c = 0; c < D; ++c) d += (double)q[c] * K[((size_t)j * H + h) * D + c];
                d *= sc;
                if (softcap > 0) d = softcap * tanh(d / softcap);
                lg[j] = d;
                if (d > m) m = d;
            }
            double *o = out + ((size_t)t * Hq + hq) * D;
            for (uint32_t c = 0; c < D; ++c) o[c] = 0;
            if (m == -INFINITY) { lse[(size_t)t * Hq + hq] = -INFINITY; continue; }
            double l = 0;
            for (uint32_t j = 0; j < len; ++j) {
                if (lg[j] == -INFINITY) continue;
                double w = exp(lg[j] - m); l += w;
                for (uint32_t c = 0; c < D; ++c) o[c] += w * V[((size_t)j * H + h) * D + c];
            }
            for (uint32_t c = 0; c < D; ++c) o[c] /= l;
            lse[(size_t)t * Hq + hq] = m + log(l);
        }
    }
    free(K); free(V); free(live); free(lg);
}

/* rel L2 of got vs ref over n values; empty rows (ref lse -inf) must be exactly 0 */
static inline double xb_rel_l2(const float *got, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(got[i])) return INFINITY;
        double d = got[i] - ref[i]; num += d * d; den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* worst |lse - ref| / (1 + |ref|); -inf must match exactly (returns INFINITY otherwise) */
static inline double xb_lse_err(const float *got, const double *ref, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; ++i) {
        if (ref[i] == -INFINITY) { if (!(got[i] == -INFINITY)) return INFINITY; continue; }
        if (!isfinite(got[i])) return INFINITY;
        double e = fabs(got[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (e > w) w = e;
    }
    return w;
}
/* Documented tolerances vs float64 on the stored values.
 * CPU (docs/DECODE.md 283-289): F32 2e-5 (INT8 pages 2e-4), F16 1e-3, BF16 8e-3; lse 2e-4*max(1,|lse|).
 * CUDA (docs/CUDA.md 535-544, 555-561, 564-569): F32 out 1e-4 (fused) / 3e-3 (GEMM path), F16 out 2e-3,
 * BF16 out 1e-2; F16 queries (f16 operands) >= 2e-3, BF16 queries >= 1e-2; lse 1e-3 resp. 1e-2 x (1+|lse|). */
static inline double tol_cpu(ikv_dtype out, ikv_format f) {
    if (out == IKV_DTYPE_F16) return 1e-3;
    if (out == IKV_DTYPE_BF16) return 8e-3;
    return f == IKV_FMT_INT8 ? 2e-4 : 2e-5;
}
static inline double tol_cuda(ikv_dtype q, ikv_dtype out, int gemm) {
    double t = out == IKV_DTYPE_F32 ? (gemm ? 3e-3 : 1e-4) : out == IKV_DTYPE_F16 ? 2e-3 : 1e-2;
    if (q == IKV_DTYPE_F16 && t < 2e-3) t = 2e-3;
    if (q == IKV_DTYPE_BF16 && t < 1e-2) t = 1e-2;
    return t;
}
static inline double tol_lse_cuda(ikv_dtype q) { return q == IKV_DTYPE_BF16 ? 1e-2 : 1e-3; }

static inline ikv_decoder *xb_decoder(void) {
    ikv_decoder_config c = ikv_decoder_default_config();
    c.n_threads = 2;
    ikv_decoder *d = NULL;
    IK(ikv_decoder_create(&c, &d));
    return d;
}
static inline ikv_pool_stats xb_stats(const ikv_pool *p) {
    ikv_pool_stats s; memset(&s, 0, sizeof s); s.struct_size = sizeof s;
    IK(ikv_pool_get_stats(p, &s));
    return s;
}
/* last_selection runs of (seq_index, kv_head) as a malloc'd array */
static inline ikv_status xb_sel(const ikv_decoder *d, uint32_t b, uint32_t h, ikv_token_range **r, size_t *n) {
    *r = NULL; *n = 0;
    ikv_status st = ikv_decoder_last_selection(d, b, h, NULL, 0, n);
    if (st != IKV_OK) return st;
    *r = (ikv_token_range *)malloc((*n + 1) * sizeof(ikv_token_range));
    size_t n2 = 0;
    st = ikv_decoder_last_selection(d, b, h, *r, *n, &n2);
    return st;
}
static inline int xb_same_runs(const ikv_token_range *a, size_t na, const ikv_token_range *b, size_t nb) {
    if (na != nb) return 0;
    for (size_t i = 0; i < na; ++i) if (a[i].begin != b[i].begin || a[i].end != b[i].end) return 0;
    return 1;
}
static inline void xb_print_runs(const char *tag, const ikv_token_range *a, size_t n) {
    printf("  %s:", tag);
    for (size_t i = 0; i < n && i < 24; ++i) printf(" [%u,%u)", a[i].begin, a[i].end);
    if (n > 24) printf(" ...(%zu)", n);
    printf("\n");
}
/* mask [H][Lmax] from runs of each kv-head of the decoder's last call (seq_index b) */
static inline unsigned char *xb_mask_from_sel(const ikv_decoder *d, uint32_t b, uint32_t H, uint32_t Lmax) {
    unsigned char *m = (unsigned char *)calloc((size_t)H * Lmax, 1);
    for (uint32_t h = 0; h < H; ++h) {
        ikv_token_range *r; size_t n;
        IK(xb_sel(d, b, h, &r, &n));
        for (size_t i = 0; i < n; ++i)
            for (uint32_t t = r[i].begin; t < r[i].end && t < Lmax; ++t) m[(size_t)h * Lmax + t] = 1;
        free(r);
    }
    return m;
}
#endif
/* device buffer helpers that fall back to host memory under XB_SELFTEST */
static inline void *xb_dmalloc(size_t n) { void *p = NULL; if (xb_selftest()) return malloc(n); CK(cudaMalloc(&p, n)); return p; }
static inline void xb_h2d(void *d, const void *h, size_t n) { if (xb_selftest()) memcpy(d, h, n); else CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static inline void xb_d2h(void *h, const void *d, size_t n) { if (xb_selftest()) memcpy(h, d, n); else CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
static inline void xb_dfree(void *d) { if (xb_selftest()) free(d); else cudaFree(d); }
static inline int xb_on_device(void) { return !xb_selftest(); }
