/* p4_pool_state: the same appends (token by token, bulk, per layer, with a formats plan), forks,
 * copy-on-write appends, truncates into a page, evictions, format changes (a full page and the partial
 * tail, ikv_seq_apply_plan_formats) and a reserved room on a CPU pool and a CUDA pool, every default
 * page format; after every step the two pools must agree exactly on:
 *   ikv_seq_read values (memcmp), ikv_seq_page_summary (memcmp, and the same status per page),
 *   ikv_seq_page_format, ikv_seq_is_evicted, ikv_seq_length / ikv_seq_layer_length, and the
 *   ikv_pool_get_stats fields that do not depend on slab sizes (used_bytes, pages_used,
 *   pages_by_format, bytes_by_format, staging_bytes, n_sequences, tokens_total),
 * and each call must return the same status on both.
 * Promises: docs/CUDA.md 5-7 ("a CUDA pool stores exactly the bytes a CPU pool stores for the same
 * appends"), docs/CUDA.md 439-441, docs/FORMATS.md 139 ("Both backends write identical records"),
 * intentkv.h ikv_pool_stats.staging_bytes (same formula for both backends), ikv_pool_reserve ("charged to
 * the pool at once (ikv_pool_stats counts the pages ...)").
 * The CUDA pool gets one sequence's tokens from device pointers (src_on_device), the CPU pool from host. */
#include "equiv_util.h"

static const uint32_t L = 2, H = 2, D = 64, P = 16;
#define MAXS 8
static ikv_seq_id sc[MAXS], sg[MAXS];
static int nseq = 0;
static const char *g_fmt = "";

static void same_status(const char *what, ikv_status a, ikv_status b) {
    if (a != b) BREAK("%s %s: CPU returned %s, CUDA %s (%s)", g_fmt, what, ikv_status_name(a), ikv_status_name(b),
                      ikv_last_error());
    else if (a != IKV_OK) printf("info: %s %s: both returned %s\n", g_fmt, what, ikv_status_name(a));
}

static int compare_all(const char *step, ikv_pool *cpu, ikv_pool *gpu) {
    int bad = 0;
    for (int i = 0; i < nseq; ++i) {
        uint32_t lc = 0, lg = 0;
        ikv_status a = ikv_seq_length(cpu, sc[i], &lc), b = ikv_seq_length(gpu, sg[i], &lg);
        if (a != b || lc != lg) { BREAK("%s after %s: seq %d length CPU %u (%s) CUDA %u (%s)", g_fmt, step, i, lc, ikv_status_name(a), lg, ikv_status_name(b)); bad = 1; continue; }
        if (a != IKV_OK) continue;
        uint32_t maxl = 0;
        for (uint32_t l = 0; l < L; ++l) {
            uint32_t x = 0, y = 0;
            ikv_seq_layer_length(cpu, sc[i], l, &x); ikv_seq_layer_length(gpu, sg[i], l, &y);
            if (x != y) { BREAK("%s after %s: seq %d layer %u length CPU %u CUDA %u", g_fmt, step, i, l, x, y); bad = 1; }
            if (x > maxl) maxl = x;
        }
        const uint32_t npages = (maxl + P - 1) / P + 1;
        for (uint32_t pg = 0; pg < npages; ++pg) {
            int ec = -1, eg = -1;
            ikv_status s1 = ikv_seq_is_evicted(cpu, sc[i], pg * P, &ec), s2 = ikv_seq_is_evicted(gpu, sg[i], pg * P, &eg);
            if (s1 != s2 || (s1 == IKV_OK && ec != eg)) { BREAK("%s after %s: seq %d page %u is_evicted CPU %s/%d CUDA %s/%d", g_fmt, step, i, pg, ikv_status_name(s1), ec, ikv_status_name(s2), eg); bad = 1; }
            ikv_format fc = IKV_FMT_AUTO, fg = IKV_FMT_AUTO;
            s1 = ikv_seq_page_format(cpu, sc[i], pg, &fc); s2 = ikv_seq_page_format(gpu, sg[i], pg, &fg);
            if (s1 != s2 || (s1 == IKV_OK && fc != fg)) { BREAK("%s after %s: seq %d page %u format CPU %s/%s CUDA %s/%s", g_fmt, step, i, pg, ikv_status_name(s1), ikv_format_name(fc), ikv_status_name(s2), ikv_format_name(fg)); bad = 1; }
            for (uint32_t l = 0; l < L; ++l)
                for (uint32_t h = 0; h < H; ++h) {
                    float a1[3 * 64], a2[3 * 64]; uint32_t n1 = 0, n2 = 0;
                    memset(a1, 0, sizeof a1); memset(a2, 0, sizeof a2);
                    s1 = ikv_seq_page_summary(cpu, sc[i], l, h, pg, a1, a1 + D, a1 + 2 * D, &n1);
                    s2 = ikv_seq_page_summary(gpu, sg[i], l, h, pg, a2, a2 + D, a2 + 2 * D, &n2);
                    if (s1 != s2 || n1 != n2 || memcmp(a1, a2, sizeof a1) != 0) {
                        BREAK("%s after %s: seq %d page %u layer %u head %u summary differs (CPU %s n=%u, CUDA %s n=%u)", g_fmt, step, i, pg, l, h, ikv_status_name(s1), n1, ikv_status_name(s2), n2);
                        bad = 1;
                    }
                }
        }
        for (uint32_t l = 0; l < L; ++l) {
            uint32_t ll = 0; ikv_seq_layer_length(cpu, sc[i], l, &ll);
            for (uint32_t p0 = 0; p0 < ll; p0 += P) {
                const uint32_t e = p0 + P < ll ? p0 + P : ll;
                float *k1 = calloc((size_t)P * H * D, 4), *v1 = calloc((size_t)P * H * D, 4);
                float *k2 = calloc((size_t)P * H * D, 4), *v2 = calloc((size_t)P * H * D, 4);
                ikv_status s1 = ikv_seq_read(cpu, sc[i], l, p0, e, k1, v1), s2 = ikv_seq_read(gpu, sg[i], l, p0, e, k2, v2);
                if (s1 != s2 || memcmp(k1, k2, (size_t)P * H * D * 4) || memcmp(v1, v2, (size_t)P * H * D * 4)) {
                    size_t first = 0;
                    for (; first < (size_t)(e - p0) * H * D; ++first) if (k1[first] != k2[first] || v1[first] != v2[first]) break;
                    BREAK("%s after %s: seq %d layer %u tokens [%u,%u) read back differently (CPU %s, CUDA %s; first element %zu: K %.9g vs %.9g, V %.9g vs %.9g)", g_fmt, step, i, l, p0, e, ikv_status_name(s1), ikv_status_name(s2), first, first < (size_t)P*H*D ? k1[first] : 0, first < (size_t)P*H*D ? k2[first] : 0, first < (size_t)P*H*D ? v1[first] : 0, first < (size_t)P*H*D ? v2[first] : 0);
                    bad = 1;
                }
                free(k1); free(v1); free(k2); free(v2);
            }
        }
    }
    ikv_pool_stats a = xb_stats(cpu), b = xb_stats(gpu);
#define CMPF(f) if (a.f != b.f) { BREAK("%s after %s: ikv_pool_stats." #f " CPU %llu CUDA %llu", g_fmt, step, (unsigned long long)a.f, (unsigned long long)b.f); bad = 1; }
    CMPF(used_bytes) CMPF(pages_used) CMPF(staging_bytes) CMPF(n_sequences) CMPF(tokens_total)
    for (int f = 0; f < IKV_FMT_COUNT; ++f) { CMPF(pages_by_format[f]) CMPF(bytes_by_format[f]) }
#undef CMPF
    if (!bad) OKMSG("%s after %s: stored values, summaries, formats, lengths and stats identical", g_fmt, step);
    return bad;
}

int main(void) {
    require_gpu();
    const ikv_format fmts[5] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    const uint32_t NT = 400;
    for (int f = 0; f < 5; ++f) {
        g_fmt = ikv_format_name(fmts[f]);
        xb_shape s = {L, H, D, P, fmts[f], 0};
        ikv_pool *cpu = xb_pool(&s, IKV_BACKEND_CPU), *gpu = xb_pool(&s, IKV_BACKEND_CUDA);
        /* values with outliers so scales widen token by token */
        float *k = xb_rows(NT * L, H, D, 31 + f, 1.0f), *v = xb_rows(NT * L, H, D, 41 + f, 1.0f);
        for (uint32_t i = 0; i < NT * L * H * D; i += 97) { k[i] *= 40.0f; v[i] *= -25.0f; }
        const size_t row = (size_t)H * D;
        nseq = 0;
        IK(ikv_seq_create(cpu, &sc[0])); IK(ikv_seq_create(gpu, &sg[0])); nseq = 1;
        /* 1. token by token to all layers (layer_stride 0: same rows), then a bulk append, then per layer */
        for (uint32_t t = 0; t < 5; ++t)
            same_status("append token", xb_append(cpu, sc[0], IKV_ALL_LAYERS, 1, k + t * row, v + t * row, NULL),
                        xb_append(gpu, sg[0], IKV_ALL_LAYERS, 1, k + t * row, v + t * row, NULL));
        {
            ikv_append ac = ikv_append_default(cpu, 40), ag = ikv_append_default(gpu, 40);
            ac.layer = ag.layer = IKV_ALL_LAYERS;
            ac.k = ag.k = k + 5 * row; ac.v = ag.v = v + 5 * row; ac.layer_stride = ag.layer_stride = (int64_t)NT * row;
            same_status("bulk append", ikv_pool_append(cpu, sc[0], &ac), ikv_pool_append(gpu, sg[0], &ag));
        }
        for (uint32_t l = 0; l < L; ++l)
            same_status("layer append", xb_append(cpu, sc[0], l, 3, k + (50 + 3 * l) * row, v + (50 + 3 * l) * row, NULL),
                        xb_append(gpu, sg[0], l, 3, k + (50 + 3 * l) * row, v + (50 + 3 * l) * row, NULL));
        compare_all("appends (token by token, bulk, per layer)", cpu, gpu);
        /* 2. fork; append to the child (copy-on-write of the shared partial tail) and to the parent */
        same_status("fork", ikv_seq_fork(cpu, sc[0], &sc[1]), ikv_seq_fork(gpu, sg[0], &sg[1])); nseq = 2;
        same_status("append child", xb_append(cpu, sc[1], IKV_ALL_LAYERS, 2, k + 60 * row, v + 60 * row, NULL),
                    xb_append(gpu, sg[1], IKV_ALL_LAYERS, 2, k + 60 * row, v + 60 * row, NULL));
        same_status("append parent", xb_append(cpu, sc[0], IKV_ALL_LAYERS, 1, k + 70 * row, v + 70 * row, NULL),
                    xb_append(gpu, sg[0], IKV_ALL_LAYERS, 1, k + 70 * row, v + 70 * row, NULL));
        compare_all("fork + copy-on-write appends", cpu, gpu);
        /* 3. truncate into the middle of a page, then append (re-staged from stored values) */
        same_status("truncate 7", ikv_seq_truncate(cpu, sc[0], 7), ikv_seq_truncate(gpu, sg[0], 7));
        compare_all("truncate into a page", cpu, gpu);
        same_status("append after truncate", xb_append(cpu, sc[0], IKV_ALL_LAYERS, 4, k + 80 * row, v + 80 * row, NULL),
                    xb_append(gpu, sg[0], IKV_ALL_LAYERS, 4, k + 80 * row, v + 80 * row, NULL));
        compare_all("truncate + append", cpu, gpu);
        /* 4. evict the child's first page (shared with the parent) */
        same_status("evict", ikv_seq_evict(cpu, sc[1], 0, 16), ikv_seq_evict(gpu, sg[1], 0, 16));
        compare_all("evict a shared page", cpu, gpu);
        /* 5. format changes: a full page, the partial tail, a shared page (IKV_E_SHARED on both) */
        const ikv_format other = fmts[(f + 3) % 5];
        same_status("append 20 to the parent", xb_append(cpu, sc[0], IKV_ALL_LAYERS, 20, k + 300 * row, v + 300 * row, NULL),
                    xb_append(gpu, sg[0], IKV_ALL_LAYERS, 20, k + 300 * row, v + 300 * row, NULL));
        uint32_t len0 = 0; IK(ikv_seq_length(cpu, sc[0], &len0));
        same_status("set_page_format full own page", ikv_seq_set_page_format(cpu, sc[0], len0 / P - 1, other), ikv_seq_set_page_format(gpu, sg[0], len0 / P - 1, other));
        same_status("set_page_format tail", ikv_seq_set_page_format(cpu, sc[0], len0 / P, other), ikv_seq_set_page_format(gpu, sg[0], len0 / P, other));
        same_status("set_page_format shared page (IKV_E_SHARED expected)", ikv_seq_set_page_format(cpu, sc[1], 1, IKV_FMT_INT4), ikv_seq_set_page_format(gpu, sg[1], 1, IKV_FMT_INT4));
        compare_all("format changes", cpu, gpu);
        same_status("append after format change", xb_append(cpu, sc[0], IKV_ALL_LAYERS, 9, k + 90 * row, v + 90 * row, NULL),
                    xb_append(gpu, sg[0], IKV_ALL_LAYERS, 9, k + 90 * row, v + 90 * row, NULL));
        compare_all("append to a re-formatted tail", cpu, gpu);
        /* 6. a formats plan on append, and ikv_seq_apply_plan_formats */
        {
            ikv_token_range all = {0, 200};
            ikv_plan *pl = NULL;
            IK(ikv_plan_from_ranges(&all, 1, 200, P, IKV_FMT_INT8, &pl));
            IK(ikv_seq_create(cpu, &sc[2])); IK(ikv_seq_create(gpu, &sg[2])); nseq = 3;
            same_status("append with formats plan", xb_append(cpu, sc[2], IKV_ALL_LAYERS, 37, k + 100 * row, v + 100 * row, pl),
                        xb_append(gpu, sg[2], IKV_ALL_LAYERS, 37, k + 100 * row, v + 100 * row, pl));
            ikv_plan *p2 = NULL;
            IK(ikv_plan_from_ranges(&all, 1, 200, P, IKV_FMT_FP8_E4M3, &p2));
            same_status("apply_plan_formats", ikv_seq_apply_plan_formats(cpu, sc[0], p2), ikv_seq_apply_plan_formats(gpu, sg[0], p2));
            ikv_plan_destroy(pl); ikv_plan_destroy(p2);
            compare_all("formats plan + apply_plan_formats", cpu, gpu);
        }
        /* 7. device input on the CUDA pool, host input on the CPU pool (same values) */
        {
            IK(ikv_seq_create(cpu, &sc[3])); IK(ikv_seq_create(gpu, &sg[3])); nseq = 4;
            const uint32_t n = 53;
            float *dk, *dv;
            dk = xb_dmalloc(2 * n * row * 4); dv = xb_dmalloc(2 * n * row * 4);
            for (uint32_t l = 0; l < L; ++l) {
                xb_h2d((float *)dk + l * n * row, k + 150 * row, n * row * 4);
                xb_h2d((float *)dv + l * n * row, v + 150 * row, n * row * 4);
            }
            ikv_append ag = ikv_append_default(gpu, n);
            ag.layer = IKV_ALL_LAYERS; ag.layer_stride = (int64_t)n * row; ag.k = dk; ag.v = dv; ag.src_on_device = xb_on_device();
            same_status("append (device input on CUDA)", xb_append(cpu, sc[3], IKV_ALL_LAYERS, n, k + 150 * row, v + 150 * row, NULL),
                        ikv_pool_append(gpu, sg[3], &ag));
            /* one-token async appends on CUDA vs checked appends on the CPU (a CPU pool accepts the flag) */
            for (uint32_t t = 0; t < 3; ++t) {
                float kx[2 * 128], vx[2 * 128];
                for (uint32_t l = 0; l < L; ++l) { memcpy(kx + l * row, k + (210 + t) * row, row * 4); memcpy(vx + l * row, v + (210 + t) * row, row * 4); }
                ikv_append ac = ikv_append_default(cpu, 1);
                ac.layer = IKV_ALL_LAYERS; ac.layer_stride = (int64_t)row; ac.k = kx; ac.v = vx; ac.flags = IKV_APPEND_ASYNC;
                for (uint32_t l = 0; l < L; ++l) { xb_h2d((float *)dk + l * row, k + (210 + t) * row, row * 4); xb_h2d((float *)dv + l * row, v + (210 + t) * row, row * 4); }
                ikv_append a1 = ag; a1.n_tokens = 1; a1.layer_stride = (int64_t)row; a1.flags = xb_on_device() ? IKV_APPEND_ASYNC : 0u;
                a1.seq_stride = (int64_t)row;
                same_status("async append", ikv_pool_append(cpu, sc[3], &ac), ikv_pool_append(gpu, sg[3], &a1));
                same_status("pool_sync", ikv_pool_sync(cpu), ikv_pool_sync(gpu));
            }
            compare_all("device-input and async appends", cpu, gpu);
            /* 8. a reserved room: pages counted at once on both; appends inside it; the room ended */
            same_status("reserve 20", ikv_pool_reserve(cpu, &sc[3], 1, 20), ikv_pool_reserve(gpu, &sg[3], 1, 20));
            compare_all("reserve 20 tokens", cpu, gpu);
            for (uint32_t t = 0; t < 4; ++t) {
                for (uint32_t l = 0; l < L; ++l) { xb_h2d((float *)dk + l * row, k + (230 + t) * row, row * 4); xb_h2d((float *)dv + l * row, v + (230 + t) * row, row * 4); }
                ikv_append a1 = ag; a1.n_tokens = 1; a1.layer_stride = (int64_t)row; a1.flags = xb_on_device() ? IKV_APPEND_ASYNC : 0u;
                same_status("append into room", xb_append(cpu, sc[3], IKV_ALL_LAYERS, 1, k + (230 + t) * row, v + (230 + t) * row, NULL),
                            ikv_pool_append(gpu, sg[3], &a1));
            }
            same_status("pool_sync after room appends", ikv_pool_sync(cpu), ikv_pool_sync(gpu));
            compare_all("appends into the room (after ikv_pool_sync)", cpu, gpu);
            same_status("end room", ikv_pool_reserve(cpu, &sc[3], 1, 0), ikv_pool_reserve(gpu, &sg[3], 1, 0));
            compare_all("room ended", cpu, gpu);
            xb_dfree(dk); xb_dfree(dv);
        }
        /* 9. destroy the parent: the child keeps the shared pages */
        same_status("seq_destroy parent", ikv_seq_destroy(cpu, sc[0]), ikv_seq_destroy(gpu, sg[0]));
        sc[0] = sc[nseq - 1]; sg[0] = sg[nseq - 1]; --nseq;
        compare_all("destroy of a fork parent", cpu, gpu);
        free(k); free(v);
        ikv_pool_destroy(cpu); ikv_pool_destroy(gpu);
    }
    return probe_exit();
}
