/* p3_topk_select: query-aware selection on a CPU pool and a CUDA pool fed the same tokens.
 * Pages are scaled by distinct factors so that every score is far from its neighbours (no near-ties);
 * the probe computes the Quest bounds itself in double from ikv_seq_page_summary and checks the margin
 * at the selection boundary before it asks for identical selections (a near-tie there is reported
 * "INCONCLUSIVE", not a break: intentkv.h / docs/CUDA.md allow rounding to flip near-ties).
 * Checked, for FIXED/QUEST, FIXED/HYBRID, MASS/QUEST, MASS/HYBRID (with and without a cap), KEYS, each
 * dense and over a router plan with mandatory entries (system prompt + recent window), G = 4:
 *  - ikv_decoder_last_selection equal on both backends, per kv-head (intentkv.h topk_token_budget rule,
 *    ikv_topk_score, docs/DECODE.md 63-66 "either way within fp32 rounding of the CPU's sums");
 *  - FIXED/QUEST selection equal to the header's rule recomputed here;
 *  - exact ties (identical pages): both take the earlier entries ("ties: earlier entry first");
 *  - decode outputs within tolerance of float64 on the runs each backend reports;
 *  - ikv_decoder_last_bytes_read: CPU exact (rows + 4*D / 6*D summary bytes per scored non-mandatory
 *    entry), CUDA the header's estimate (intentkv.h ikv_decoder_last_bytes_read: "the rows count as the
 *    budget's tokens at the entries' mean row cost", summaries for every entry; KEYS' keys "as half that
 *    cost for twice the budget's tokens"), and ikv_decoder_get_stats.last_bytes_read equal to it. */
#include "equiv_util.h"

static const uint32_t L = 1, H = 2, D = 128, P = 16, HQ = 8;
#define NPAGE 40
#define LEN (NPAGE * P + 5)

typedef struct tcase {
    const char *name; ikv_topk_mode mode; ikv_topk_score score; uint32_t budget; float mass; int use_plan;
} tcase;

static double g_bound[2][NPAGE + 1]; /* per kv-head, per page: Quest bound in double (first query token) */

static void quest_bounds(ikv_pool *pool, ikv_seq_id seq, const float *q, uint32_t npages) {
    for (uint32_t h = 0; h < H; ++h)
        for (uint32_t pg = 0; pg < npages; ++pg) {
            float mn[128], mx[128];
            IK(ikv_seq_page_summary(pool, seq, 0, h, pg, mn, mx, NULL, NULL));
            double best = -INFINITY;
            for (uint32_t g = 0; g < HQ / H; ++g) {
                const float *qq = q + (size_t)(h * (HQ / H) + g) * D;
                double s = 0;
                for (uint32_t d = 0; d < D; ++d) { double a = (double)qq[d] * mn[d], b = (double)qq[d] * mx[d]; s += a > b ? a : b; }
                if (s > best) best = s;
            }
            g_bound[h][pg] = best;
        }
}

int main(void) {
    require_gpu();
    xb_shape s = {L, H, D, P, IKV_FMT_F16, 0};
    ikv_pool *cpu = xb_pool(&s, IKV_BACKEND_CPU), *gpu = xb_pool(&s, IKV_BACKEND_CUDA);
    ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
    const size_t row = (size_t)H * D;
    /* sequence 0: page i scaled by a distinct factor (permuted order), sequence 1: every page identical */
    float *k = xb_rows(LEN, H, D, 5, 1.0f), *v = xb_rows(LEN, H, D, 6, 1.0f);
    for (uint32_t t = 0; t < LEN; ++t) {
        const uint32_t pg = t / P, perm = (pg * 17u + 5u) % (NPAGE + 1);
        const float c = 0.5f + 0.25f * perm;
        for (size_t i = 0; i < row; ++i) k[t * row + i] *= c;
    }
    float *kf = malloc((size_t)NPAGE * P * row * 4), *vf = malloc((size_t)NPAGE * P * row * 4);
    for (uint32_t t = 0; t < NPAGE * P; ++t) { memcpy(kf + t * row, k + (t % P) * row, row * 4); memcpy(vf + t * row, v + t * row, row * 4); }
    ikv_seq_id sc[2], sg[2];
    for (int b = 0; b < 2; ++b) {
        IK(ikv_seq_create(cpu, &sc[b])); IK(ikv_seq_create(gpu, &sg[b]));
        const uint32_t n = b ? NPAGE * P : LEN;
        IK(xb_append(cpu, sc[b], 0, n, b ? kf : k, b ? vf : v, NULL));
        IK(xb_append(gpu, sg[b], 0, n, b ? kf : k, b ? vf : v, NULL));
    }
    /* a router plan with mandatory entries: system prompt ALWAYS [0,32), docs ATTEND, recent window 48 */
    ikv_layout *lay; IK(ikv_layout_create(&lay));
    ikv_block_desc bd = ikv_block_desc_default();
    bd.name = "sys"; bd.kind = IKV_KIND_SYSTEM_PROMPT; bd.policy = IKV_POLICY_ALWAYS; bd.start = 0; bd.end = 32;
    IK(ikv_layout_add(lay, &bd, NULL));
    bd.name = "docs"; bd.kind = IKV_KIND_RETRIEVED_DOC; bd.policy = IKV_POLICY_ATTEND; bd.score = 0.9f; bd.start = 32; bd.end = LEN;
    IK(ikv_layout_add(lay, &bd, NULL));
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = P; rc.recent_window = 48; rc.precision.attend_high = IKV_FMT_F16;
    ikv_router *rt; IK(ikv_router_create(&rc, &rt));
    ikv_plan *plan; IK(ikv_router_route(rt, lay, LEN, &plan));
    const ikv_plan_page *pp; size_t npp; IK(ikv_plan_pages(plan, &pp, &npp));
    size_t plan_nonmand = 0; uint32_t plan_mand_tokens = 0;
    for (size_t i = 0; i < npp; ++i) { if (pp[i].flags & IKV_PAGE_MANDATORY) plan_mand_tokens += pp[i].token_end - pp[i].token_begin; else ++plan_nonmand; }
    printf("info: router plan has %zu entries, %zu non-mandatory, %u mandatory tokens\n", npp, plan_nonmand, plan_mand_tokens);

    float *q = xb_rows(HQ, 1, D, 99, 1.0f);
    quest_bounds(cpu, sc[0], q, NPAGE + 1);

    const tcase cases[] = {
        {"FIXED/QUEST dense budget 160", IKV_TOPK_FIXED, IKV_TOPK_SCORE_QUEST, 160, 0.9f, 0},
        {"FIXED/QUEST plan budget 160", IKV_TOPK_FIXED, IKV_TOPK_SCORE_QUEST, 160, 0.9f, 1},
        {"FIXED/HYBRID dense budget 200", IKV_TOPK_FIXED, IKV_TOPK_SCORE_HYBRID, 200, 0.9f, 0},
        {"FIXED/HYBRID plan budget 200", IKV_TOPK_FIXED, IKV_TOPK_SCORE_HYBRID, 200, 0.9f, 1},
        {"MASS/QUEST dense mass 0.8 uncapped", IKV_TOPK_MASS, IKV_TOPK_SCORE_QUEST, 0, 0.8f, 0},
        {"MASS/QUEST plan mass 0.6 cap 300", IKV_TOPK_MASS, IKV_TOPK_SCORE_QUEST, 300, 0.6f, 1},
        {"MASS/HYBRID dense mass 0.8 cap 400", IKV_TOPK_MASS, IKV_TOPK_SCORE_HYBRID, 400, 0.8f, 0},
        {"FIXED/KEYS dense budget 96", IKV_TOPK_FIXED, IKV_TOPK_SCORE_KEYS, 96, 0.9f, 0},
        {"FIXED/KEYS plan budget 160", IKV_TOPK_FIXED, IKV_TOPK_SCORE_KEYS, 160, 0.9f, 1},
    };
    const ikv_plan *plans[1] = {plan};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const tcase *c = &cases[ci];
        ikv_decode_args a = ikv_decode_args_default();
        a.layer = 0; a.n_seqs = 1; a.n_q_heads = HQ; a.plans = c->use_plan ? plans : NULL;
        /* 0. the same step without top-k: the rows' bytes (exact on both) */
        a.seqs = sc; xb_out n0c = xb_decode(dc, cpu, 0, a, q, D);
        uint64_t b0c = 0, b0g = 0; ikv_decoder_last_bytes_read(dc, &b0c);
        a.seqs = sg; xb_out n0g = xb_decode(dg, gpu, 1, a, q, D);
        ikv_decoder_last_bytes_read(dg, &b0g);
        if (n0c.st != IKV_OK || n0g.st != IKV_OK) { BREAK("%s: plain decode CPU %s CUDA %s", c->name, ikv_status_name(n0c.st), ikv_status_name(n0g.st)); continue; }
        if (b0c != b0g) BREAK("%s: without top-k last_bytes_read CPU %llu != CUDA %llu (both count rows + scales exactly)", c->name, (unsigned long long)b0c, (unsigned long long)b0g);
        xb_out_free(&n0c); xb_out_free(&n0g);
        /* 1. top-k */
        a.topk_token_budget = c->budget; a.topk_mode = c->mode; a.topk_score = c->score; a.topk_mass = c->mass;
        a.seqs = sc; xb_out oc = xb_decode(dc, cpu, 0, a, q, D);
        a.seqs = sg; xb_out og = xb_decode(dg, gpu, 1, a, q, D);
        if (oc.st != IKV_OK || og.st != IKV_OK) { BREAK("%s: top-k decode CPU %s CUDA %s (%s)", c->name, ikv_status_name(oc.st), ikv_status_name(og.st), ikv_last_error()); continue; }
        int same = 1;
        uint64_t sel_tokens_c = 0, sel_tokens_g = 0;
        for (uint32_t h = 0; h < H; ++h) {
            ikv_token_range *rc_, *rg_; size_t nc_, ng_;
            IK(xb_sel(dc, 0, h, &rc_, &nc_)); IK(xb_sel(dg, 0, h, &rg_, &ng_));
            for (size_t i = 0; i < nc_; ++i) sel_tokens_c += rc_[i].end - rc_[i].begin;
            for (size_t i = 0; i < ng_; ++i) sel_tokens_g += rg_[i].end - rg_[i].begin;
            if (!xb_same_runs(rc_, nc_, rg_, ng_)) {
                same = 0;
                /* margin at the boundary (Quest bounds; for hybrid/keys only a hint) */
                BREAK("%s kv-head %u: CUDA selected other tokens than the CPU (pages scaled apart; see bound gaps below)", c->name, h);
                xb_print_runs("CPU ", rc_, nc_); xb_print_runs("CUDA", rg_, ng_);
            }
            if (ci == 0) { /* FIXED/QUEST dense: the header's rule recomputed here */
                int order[NPAGE + 1]; uint32_t np = NPAGE + 1;
                for (uint32_t i = 0; i < np; ++i) order[i] = (int)i;
                for (uint32_t i = 0; i < np; ++i) for (uint32_t j = i + 1; j < np; ++j)
                    if (g_bound[h][order[j]] > g_bound[h][order[i]] || (g_bound[h][order[j]] == g_bound[h][order[i]] && order[j] < order[i])) { int t = order[i]; order[i] = order[j]; order[j] = t; }
                unsigned char keep[NPAGE + 1]; memset(keep, 0, sizeof keep);
                uint32_t taken = 0; double gap = INFINITY;
                for (uint32_t i = 0; i < np; ++i) {
                    const uint32_t n = order[i] == NPAGE ? LEN - NPAGE * P : P;
                    if (taken + n > c->budget) { if (i > 0) gap = (g_bound[h][order[i - 1]] - g_bound[h][order[i]]) / fabs(g_bound[h][order[i - 1]]); break; }
                    taken += n; keep[order[i]] = 1;
                }
                ikv_token_range want[NPAGE + 1]; size_t nw = 0;
                for (uint32_t pg = 0; pg <= NPAGE; ++pg) if (keep[pg]) {
                    const uint32_t b = pg * P, e = pg == NPAGE ? LEN : b + P;
                    if (nw && want[nw - 1].end == b) want[nw - 1].end = e; else { want[nw].begin = b; want[nw].end = e; ++nw; }
                }
                if (gap < 1e-4) INCONCL("%s kv-head %u: boundary bounds only %.2g apart", c->name, h, gap);
                else {
                    if (!xb_same_runs(want, nw, rc_, nc_)) { BREAK("%s kv-head %u: CPU selection differs from the header's rule", c->name, h); xb_print_runs("rule", want, nw); xb_print_runs("CPU ", rc_, nc_); }
                    if (!xb_same_runs(want, nw, rg_, ng_)) { BREAK("%s kv-head %u: CUDA selection differs from the header's rule (boundary gap %.2g)", c->name, h, gap); xb_print_runs("rule", want, nw); xb_print_runs("CUDA", rg_, ng_); }
                }
            }
            free(rc_); free(rg_);
        }
        if (same) OKMSG("%s: same selection on both backends (%llu tokens over %u kv-heads)", c->name, (unsigned long long)sel_tokens_c, H);
        /* outputs vs float64 over each backend's own runs */
        for (int be = 0; be < 2; ++be) {
            unsigned char *mask = xb_mask_from_sel(be ? dg : dc, 0, H, LEN);
            double ref[HQ * 128], lr[HQ];
            xb_ref(be ? gpu : cpu, be ? sg[0] : sc[0], 0, &s, HQ, 1, q, mask, LEN, 0, 0, ref, lr);
            const double e = xb_rel_l2(be ? og.out : oc.out, ref, (size_t)HQ * D), le = xb_lse_err(be ? og.lse : oc.lse, lr, HQ);
            const double te = be ? 1e-4 : 2e-5, tl = be ? 1e-3 : 2e-4;
            if (e > te || le > tl) BREAK("%s: %s top-k output rel L2 %.3g (tol %.1g) lse %.3g (tol %.1g) vs float64 over its own selection", c->name, be ? "CUDA" : "CPU", e, te, le, tl);
            free(mask);
        }
        /* bytes read */
        uint64_t bc = 0, bg = 0; ikv_decoder_last_bytes_read(dc, &bc); ikv_decoder_last_bytes_read(dg, &bg);
        ikv_decoder_stats stc, stg; memset(&stc, 0, sizeof stc); memset(&stg, 0, sizeof stg);
        stc.struct_size = stg.struct_size = sizeof stc;
        IK(ikv_decoder_get_stats(dc, &stc)); IK(ikv_decoder_get_stats(dg, &stg));
        if (stc.last_bytes_read != bc || stg.last_bytes_read != bg) BREAK("%s: get_stats.last_bytes_read != ikv_decoder_last_bytes_read", c->name);
        const int hyb = c->score != IKV_TOPK_SCORE_QUEST;
        const uint64_t sumb = (uint64_t)(hyb ? 6 : 4) * D;
        const uint64_t entries = c->use_plan ? npp : NPAGE + 1, nonmand = c->use_plan ? plan_nonmand : NPAGE + 1;
        const uint64_t all_tokens = c->use_plan ? 0 : LEN;
        uint64_t plan_tokens = 0;
        for (size_t i = 0; i < npp; ++i) plan_tokens += pp[i].token_end - pp[i].token_begin;
        const uint64_t at = c->use_plan ? plan_tokens : all_tokens;
        if (c->score != IKV_TOPK_SCORE_KEYS) {
            const uint64_t want_c = sel_tokens_c * 4 * D + nonmand * H * sumb; /* F16: 4*D bytes per row and kv-head */
            if (bc != want_c) BREAK("%s: CPU last_bytes_read %llu, the header's exact count gives %llu", c->name, (unsigned long long)bc, (unsigned long long)want_c);
        }
        const uint64_t per_token = b0g / at, cap = c->budget ? c->budget : at;
        uint64_t want_g = (at < cap ? at : cap) * per_token + entries * H * sumb;
        if (c->score == IKV_TOPK_SCORE_KEYS) want_g += (at < 2 * cap ? at : 2 * cap) * (per_token / 2);
        if (xb_selftest() || c->mode == IKV_TOPK_MASS)
            printf("info: %s: CUDA last_bytes_read %llu; estimate with the cap (or all candidates) as the budget %llu (MASS: the header's \"budget's tokens\" is the derived budget, unknown to the host; not asserted)\n", c->name, (unsigned long long)bg, (unsigned long long)want_g);
        else if (bg != want_g) BREAK("%s: CUDA last_bytes_read %llu, the header's estimate gives %llu (budget %u, %llu candidate tokens, %llu per token, %llu entries)", c->name, (unsigned long long)bg, (unsigned long long)want_g, c->budget, (unsigned long long)at, (unsigned long long)per_token, (unsigned long long)entries);
        else OKMSG("%s: bytes_read CPU %llu (exact), CUDA %llu (the header's estimate)", c->name, (unsigned long long)bc, (unsigned long long)bg);
        xb_out_free(&oc); xb_out_free(&og);
    }
    /* exact ties: 40 identical pages; every bound is equal, so the earliest entries are taken */
    {
        const tcase tc[2] = {{"ties FIXED/QUEST budget 48", IKV_TOPK_FIXED, IKV_TOPK_SCORE_QUEST, 48, 0.9f, 0},
                             {"ties FIXED/HYBRID budget 80", IKV_TOPK_FIXED, IKV_TOPK_SCORE_HYBRID, 80, 0.9f, 0}};
        for (int i = 0; i < 2; ++i) {
            ikv_decode_args a = ikv_decode_args_default();
            a.layer = 0; a.n_seqs = 1; a.n_q_heads = HQ;
            a.topk_token_budget = tc[i].budget; a.topk_mode = tc[i].mode; a.topk_score = tc[i].score;
            a.seqs = &sc[1]; xb_out oc = xb_decode(dc, cpu, 0, a, q, D);
            a.seqs = &sg[1]; xb_out og = xb_decode(dg, gpu, 1, a, q, D);
            if (oc.st != IKV_OK || og.st != IKV_OK) { BREAK("%s: CPU %s CUDA %s", tc[i].name, ikv_status_name(oc.st), ikv_status_name(og.st)); continue; }
            for (uint32_t h = 0; h < H; ++h) {
                ikv_token_range *rc_, *rg_; size_t nc_, ng_;
                IK(xb_sel(dc, 0, h, &rc_, &nc_)); IK(xb_sel(dg, 0, h, &rg_, &ng_));
                ikv_token_range want = {0, tc[i].budget};
                if (!xb_same_runs(&want, 1, rc_, nc_)) { BREAK("%s kv-head %u: CPU did not take the earliest pages", tc[i].name, h); xb_print_runs("CPU", rc_, nc_); }
                if (!xb_same_runs(&want, 1, rg_, ng_)) { BREAK("%s kv-head %u: CUDA did not take the earliest pages on a tie (header: ties: earlier entry first)", tc[i].name, h); xb_print_runs("CUDA", rg_, ng_); }
                else OKMSG("%s kv-head %u: CUDA took [0,%u) like the CPU", tc[i].name, h, tc[i].budget);
                free(rc_); free(rg_);
            }
            xb_out_free(&oc); xb_out_free(&og);
        }
    }
    ikv_plan_destroy(plan); ikv_router_destroy(rt); ikv_layout_destroy(lay);
    ikv_decoder_destroy(dc); ikv_decoder_destroy(dg);
    ikv_pool_destroy(cpu); ikv_pool_destroy(gpu);
    free(k); free(v); free(kf); free(vf); free(q);
    return probe_exit();
}
