/* p5_qmem_feedback: query memory and attention feedback on a CPU pool and a CUDA pool fed the same tokens.
 *  - ikv_page_feedback_get after the same decodes (dense 1-token, causal 3-token, a plan, GQA): the
 *    averages agree "to float rounding" (intentkv.h ikv_page_feedback: "the device measures the shares
 *    (fp32 sums; the CPU sums in double, so the two agree to float rounding)"); checked at
 *    |cpu - cuda| <= 1e-4 * max(|cpu|, 1e-3) + 1e-6 (F32 queries), and n_pages_out equal;
 *  - ikv_page_feedback_block_scores: the same layout scores (same tolerance);
 *  - top-k with topk_feedback_weight > 0: the same selection ("it selects the pages a CPU pool selects
 *    (up to float rounding where a score and a prior nearly tie)");
 *  - top-k with a query memory (turns 4 and turns 0, QUEST and HYBRID): the same selection, and outputs
 *    within tolerance of float64 over each backend's selection.
 * Pages are scaled apart so that no score nearly ties. */
#include "equiv_util.h"

static const uint32_t L = 1, H = 2, D = 128, P = 16, HQ = 8;
#define NPAGE 24
#define LEN (NPAGE * P + 7)

static void cmp_sel(const char *name, ikv_decoder *dc, ikv_decoder *dg) {
    int same = 1;
    for (uint32_t h = 0; h < H; ++h) {
        ikv_token_range *rc, *rg; size_t nc, ng;
        IK(xb_sel(dc, 0, h, &rc, &nc)); IK(xb_sel(dg, 0, h, &rg, &ng));
        if (!xb_same_runs(rc, nc, rg, ng)) { same = 0; BREAK("%s kv-head %u: CUDA selected other tokens than the CPU", name, h); xb_print_runs("CPU ", rc, nc); xb_print_runs("CUDA", rg, ng); }
        free(rc); free(rg);
    }
    if (same) OKMSG("%s: same selection on both backends", name);
}
static void cmp_out(const char *name, ikv_pool *pc, ikv_pool *pg, ikv_seq_id sc, ikv_seq_id sg, ikv_decoder *dc,
                    ikv_decoder *dg, xb_out *oc, xb_out *og, const float *q, uint32_t T) {
    xb_shape s = {L, H, D, P, IKV_FMT_F16, 0};
    for (int be = 0; be < 2; ++be) {
        unsigned char *mask = xb_mask_from_sel(be ? dg : dc, 0, H, LEN);
        double *ref = malloc((size_t)T * HQ * D * 8), lr[64];
        xb_ref(be ? pg : pc, be ? sg : sc, 0, &s, HQ, T, q, mask, LEN, 0, 0, ref, lr);
        const double e = xb_rel_l2(be ? og->out : oc->out, ref, (size_t)T * HQ * D), le = xb_lse_err(be ? og->lse : oc->lse, lr, (size_t)T * HQ);
        const double te = be ? 1e-4 : 2e-5, tl = be ? 1e-3 : 2e-4;
        if (e > te || le > tl) BREAK("%s: %s output rel L2 %.3g (tol %.1g), lse %.3g (tol %.1g) vs float64 over its selection", name, be ? "CUDA" : "CPU", e, te, le, tl);
        free(mask); free(ref);
    }
}
static void cmp_feedback(const char *name, ikv_page_feedback *fc, ikv_page_feedback *fg, ikv_seq_id sc, ikv_seq_id sg) {
    int ok = 1; double worst = 0;
    for (uint32_t h = 0; h < H; ++h) {
        float mc[NPAGE + 2], mg[NPAGE + 2]; uint32_t nc = 0, ng = 0;
        IK(ikv_page_feedback_get(fc, sc, 0, h, mc, NPAGE + 2, &nc));
        IK(ikv_page_feedback_get(fg, sg, 0, h, mg, NPAGE + 2, &ng));
        if (nc != ng) { BREAK("%s kv-head %u: feedback n_pages CPU %u CUDA %u", name, h, nc, ng); ok = 0; }
        for (uint32_t i = 0; i < NPAGE + 2; ++i) {
            const double a = mc[i], b = mg[i], tol = 1e-4 * fmax(fabs(a), 1e-3) + 1e-6;
            if (fabs(a - b) > tol) { if (ok) BREAK("%s kv-head %u page %u: feedback average CPU %.9g CUDA %.9g", name, h, i, a, b); ok = 0; }
            if (fabs(a - b) > worst) worst = fabs(a - b);
        }
    }
    if (ok) OKMSG("%s: feedback averages agree (worst |diff| %.2g)", name, worst);
}

int main(void) {
    require_gpu();
    xb_shape s = {L, H, D, P, IKV_FMT_F16, 0};
    ikv_pool *pc = xb_pool(&s, IKV_BACKEND_CPU), *pg = xb_pool(&s, IKV_BACKEND_CUDA);
    ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
    const size_t row = (size_t)H * D;
    float *k = xb_rows(LEN, H, D, 11, 1.0f), *v = xb_rows(LEN, H, D, 12, 1.0f);
    for (uint32_t t = 0; t < LEN; ++t) {
        const uint32_t perm = ((t / P) * 7u + 3u) % (NPAGE + 1);
        for (size_t i = 0; i < row; ++i) k[t * row + i] *= 0.4f + 0.2f * perm;
    }
    ikv_seq_id sc, sg;
    IK(ikv_seq_create(pc, &sc)); IK(ikv_seq_create(pg, &sg));
    IK(xb_append(pc, sc, 0, LEN, k, v, NULL)); IK(xb_append(pg, sg, 0, LEN, k, v, NULL));
    ikv_page_feedback_config fcfg = ikv_page_feedback_default_config(); fcfg.rate = 0.5f;
    ikv_page_feedback *fc, *fg;
    IK(ikv_page_feedback_create(pc, &fcfg, &fc)); IK(ikv_page_feedback_create(pg, &fcfg, &fg));
    ikv_token_range rr[3] = {{0, 40}, {100, 170}, {300, LEN}};
    ikv_plan *plan; IK(ikv_plan_from_ranges(rr, 3, LEN, P, IKV_FMT_F16, &plan));
    const ikv_plan *plans[1] = {plan};
    float *q = xb_rows(3 * HQ, 1, D, 21, 1.0f), *q2 = xb_rows(HQ, 1, D, 22, 1.0f);
    /* 1. feedback: dense T1, causal T3, plan T1 */
    struct { const char *name; uint32_t T; int plan; } fcs[3] = {{"feedback dense T1", 1, 0}, {"feedback causal T3", 3, 0}, {"feedback plan(partial pages) T1", 1, 1}};
    for (int i = 0; i < 3; ++i) {
        ikv_decode_args a = ikv_decode_args_default();
        a.n_q_heads = HQ; a.n_query_tokens = fcs[i].T; a.plans = fcs[i].plan ? plans : NULL;
        a.seqs = &sc; a.feedback = fc; xb_out oc = xb_decode(dc, pc, 0, a, q, D);
        a.seqs = &sg; a.feedback = fg; xb_out og = xb_decode(dg, pg, 1, a, q, D);
        if (oc.st != IKV_OK || og.st != IKV_OK) { BREAK("%s: CPU %s CUDA %s (%s)", fcs[i].name, ikv_status_name(oc.st), ikv_status_name(og.st), ikv_last_error()); continue; }
        cmp_feedback(fcs[i].name, fc, fg, sc, sg);
        xb_out_free(&oc); xb_out_free(&og);
    }
    /* 2. block scores from the feedback */
    {
        ikv_layout *lc, *lg; IK(ikv_layout_create(&lc));
        ikv_block_desc bd = ikv_block_desc_default();
        const char *names[4] = {"a", "b", "c", "d"}; const uint32_t cut[5] = {0, 90, 200, 330, LEN};
        for (int i = 0; i < 4; ++i) { bd.name = names[i]; bd.start = cut[i]; bd.end = cut[i + 1]; IK(ikv_layout_add(lc, &bd, NULL)); }
        IK(ikv_layout_clone(lc, &lg));
        ikv_status s1 = ikv_page_feedback_block_scores(fc, sc, lc), s2 = ikv_page_feedback_block_scores(fg, sg, lg);
        if (s1 != s2) BREAK("block_scores: CPU %s CUDA %s", ikv_status_name(s1), ikv_status_name(s2));
        int ok = 1;
        for (size_t i = 0; i < 4; ++i) {
            ikv_block_info x, y; IK(ikv_layout_at(lc, i, &x)); IK(ikv_layout_at(lg, i, &y));
            if (fabs(x.score - y.score) > 1e-4 * fmax(fabs(x.score), 1e-3) + 1e-6) { ok = 0; BREAK("block_scores: block %zu CPU %.9g CUDA %.9g", i, x.score, y.score); }
        }
        if (ok) OKMSG("feedback block scores agree");
        ikv_layout_destroy(lc); ikv_layout_destroy(lg);
    }
    /* 3. top-k with the feedback prior */
    for (int sco = 0; sco < 2; ++sco) {
        ikv_decode_args a = ikv_decode_args_default();
        a.n_q_heads = HQ; a.topk_token_budget = 96; a.topk_feedback_weight = 0.5f; a.topk_score = sco ? IKV_TOPK_SCORE_HYBRID : IKV_TOPK_SCORE_QUEST;
        a.seqs = &sc; a.feedback = fc; xb_out oc = xb_decode(dc, pc, 0, a, q2, D);
        a.seqs = &sg; a.feedback = fg; xb_out og = xb_decode(dg, pg, 1, a, q2, D);
        const char *nm = sco ? "top-k HYBRID + feedback prior 0.5" : "top-k QUEST + feedback prior 0.5";
        if (oc.st != IKV_OK || og.st != IKV_OK) { BREAK("%s: CPU %s CUDA %s (%s)", nm, ikv_status_name(oc.st), ikv_status_name(og.st), ikv_last_error()); continue; }
        cmp_sel(nm, dc, dg);
        cmp_out(nm, pc, pg, sc, sg, dc, dg, &oc, &og, q2, 1);
        cmp_feedback(nm, fc, fg, sc, sg);
        xb_out_free(&oc); xb_out_free(&og);
    }
    /* 4. query memory (turns 4, turns 0), QUEST and HYBRID */
    for (int turns = 0; turns <= 4; turns += 4) {
        ikv_query_memory_config mc = ikv_query_memory_default_config(); mc.n_q_heads = HQ; mc.turns = (uint32_t)turns; mc.decay = 0.6f;
        ikv_query_memory *mcpu, *mgpu;
        IK(ikv_query_memory_create(pc, &mc, &mcpu)); IK(ikv_query_memory_create(pg, &mc, &mgpu));
        for (int turn = 0; turn < 3; ++turn) {
            float *qt = xb_rows(2 * HQ, 1, D, 300 + turn, 1.0f);
            IK(ikv_query_memory_remember(mcpu, sc, 0, qt, IKV_DTYPE_F32, 2)); IK(ikv_query_memory_remember(mgpu, sg, 0, qt, IKV_DTYPE_F32, 2));
            IK(ikv_query_memory_end_turn(mcpu, sc)); IK(ikv_query_memory_end_turn(mgpu, sg));
            free(qt);
        }
        for (int sco = 0; sco < 2; ++sco) {
            char nm[128]; snprintf(nm, sizeof nm, "top-k %s + query memory (turns %d)", sco ? "HYBRID" : "QUEST", turns);
            ikv_decode_args a = ikv_decode_args_default();
            a.n_q_heads = HQ; a.topk_token_budget = 128; a.topk_score = sco ? IKV_TOPK_SCORE_HYBRID : IKV_TOPK_SCORE_QUEST;
            a.seqs = &sc; a.query_memory = mcpu; xb_out oc = xb_decode(dc, pc, 0, a, q2, D);
            a.seqs = &sg; a.query_memory = mgpu; xb_out og = xb_decode(dg, pg, 1, a, q2, D);
            if (oc.st != IKV_OK || og.st != IKV_OK) { BREAK("%s: CPU %s CUDA %s (%s)", nm, ikv_status_name(oc.st), ikv_status_name(og.st), ikv_last_error()); continue; }
            cmp_sel(nm, dc, dg);
            cmp_out(nm, pc, pg, sc, sg, dc, dg, &oc, &og, q2, 1);
            xb_out_free(&oc); xb_out_free(&og);
        }
        /* forget: scored as without memory on both */
        IK(ikv_query_memory_forget(mcpu, sc)); IK(ikv_query_memory_forget(mgpu, sg));
        ikv_decode_args a = ikv_decode_args_default();
        a.n_q_heads = HQ; a.topk_token_budget = 128;
        a.seqs = &sc; a.query_memory = mcpu; xb_out oc = xb_decode(dc, pc, 0, a, q2, D);
        a.seqs = &sg; a.query_memory = mgpu; xb_out og = xb_decode(dg, pg, 1, a, q2, D);
        if (oc.st == IKV_OK && og.st == IKV_OK) cmp_sel("top-k with a memory that forgot the sequence", dc, dg);
        else BREAK("decode after forget: CPU %s CUDA %s", ikv_status_name(oc.st), ikv_status_name(og.st));
        xb_out_free(&oc); xb_out_free(&og);
        ikv_query_memory_destroy(mcpu); ikv_query_memory_destroy(mgpu);
    }
    ikv_page_feedback_destroy(fc); ikv_page_feedback_destroy(fg);
    ikv_plan_destroy(plan);
    ikv_decoder_destroy(dc); ikv_decoder_destroy(dg);
    ikv_pool_destroy(pc); ikv_pool_destroy(pg);
    free(k); free(v); free(q); free(q2);
    return probe_exit();
}
