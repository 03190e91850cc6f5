/* p2_decode_formats: the same decodes on a CPU pool and a CUDA pool fed the same tokens, every page
 * format, F32/F16/BF16 queries and outputs, GQA groups 1/4/8, causal multi-token steps, softcap and
 * scale, partial-page plans, evicted pages, an empty selection, a batch of two sequences, and a
 * multi-token step on the GEMM path (F32 queries, >= 64 rows per kv-head).
 * Each backend's output is checked against a float64 reference computed from that pool's stored values
 * (ikv_seq_read) with the tolerance its docs state (docs/DECODE.md 283-289 for the CPU;
 * docs/CUDA.md 535-544, 555-561, 564-569 for CUDA); both backends must accept every call (IKV_OK);
 * a query with no key must give out = 0 and lse = -inf on both (intentkv.h ikv_decode_args "Output").
 * Exit 0 OK / 1 BREAK / 2 inconclusive. */
#include "equiv_util.h"

static const uint32_t L = 2, H = 2, D = 128, P = 16;
static int n_cases = 0;

typedef struct dcase {
    const char *name;
    uint32_t Hq, T;
    ikv_dtype qd, od;
    float scale, softcap;
    int use_plan; /* ranges below */
    int gemm;     /* expected on CUDA's GEMM path (F32 queries, >= 64 rows per kv-head) */
} dcase;

static void run_case(const char *fmtname, ikv_format fmt, ikv_pool *cpu, ikv_pool *gpu, ikv_decoder *dc,
                     ikv_decoder *dg, const ikv_seq_id *sc, const ikv_seq_id *sg, uint32_t nseq, const dcase *c,
                     ikv_plan *plan, const unsigned char *plan_mask, uint32_t Lmax) {
    xb_shape s = {L, H, D, P, fmt, 0};
    const size_t per_seq = (size_t)c->T * c->Hq * D;
    float *q = xb_rows(nseq * c->T * c->Hq, 1, D, 777 + c->Hq * 13 + c->T, 1.0f);
    /* round q to its dtype once (the reference sees what the library sees) */
    float *qr = (float *)malloc(nseq * per_seq * 4); memcpy(qr, q, nseq * per_seq * 4);
    void *tmp = to_dtype(qr, nseq * per_seq, c->qd); free(tmp);
    const ikv_plan *plans_c[2] = {plan, plan}, *plans_g[2] = {plan, plan};
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 1; a.n_seqs = nseq; a.n_query_tokens = c->T; a.n_q_heads = c->Hq;
    a.q_dtype = c->qd; a.out_dtype = c->od; a.scale = c->scale; a.softcap = c->softcap;
    a.seqs = sc; a.plans = c->use_plan ? plans_c : NULL;
    xb_out oc = xb_decode(dc, cpu, 0, a, qr, D);
    a.seqs = sg; a.plans = c->use_plan ? plans_g : NULL;
    xb_out og = xb_decode(dg, gpu, 1, a, qr, D);
    ++n_cases;
    if (oc.st != IKV_OK || og.st != IKV_OK) {
        BREAK("%s %s: ikv_decode CPU %s, CUDA %s (%s)", fmtname, c->name, ikv_status_name(oc.st),
              ikv_status_name(og.st), ikv_last_error());
        goto done;
    }
    for (uint32_t b = 0; b < nseq; ++b) {
        double *rc = (double *)malloc(per_seq * 8), *rg = (double *)malloc(per_seq * 8);
        double *lc = (double *)malloc((size_t)c->T * c->Hq * 8), *lg = (double *)malloc((size_t)c->T * c->Hq * 8);
        unsigned char *mask = NULL;
        if (c->use_plan) {
            mask = (unsigned char *)malloc((size_t)H * Lmax);
            for (uint32_t h = 0; h < H; ++h) memcpy(mask + (size_t)h * Lmax, plan_mask, Lmax);
        }
        xb_ref(cpu, sc[b], 1, &s, c->Hq, c->T, qr + b * per_seq, mask, Lmax, c->scale, c->softcap, rc, lc);
        xb_ref(gpu, sg[b], 1, &s, c->Hq, c->T, qr + b * per_seq, mask, Lmax, c->scale, c->softcap, rg, lg);
        const double ec = xb_rel_l2(oc.out + b * per_seq, rc, per_seq);
        const double eg = xb_rel_l2(og.out + b * per_seq, rg, per_seq);
        const double lec = xb_lse_err(oc.lse + (size_t)b * c->T * c->Hq, lc, (size_t)c->T * c->Hq);
        const double leg = xb_lse_err(og.lse + (size_t)b * c->T * c->Hq, lg, (size_t)c->T * c->Hq);
        const double tc = tol_cpu(c->od, fmt), tg = tol_cuda(c->qd, c->od, c->gemm);
        const double tlc = 2e-4, tlg = tol_lse_cuda(c->qd);
        /* empty rows: out exactly 0 on both */
        int empty_ok = 1;
        for (size_t r = 0; r < (size_t)c->T * c->Hq; ++r)
            if (lc[r] == -INFINITY)
                for (uint32_t d = 0; d < D; ++d)
                    if (oc.out[b * per_seq + r * D + d] != 0.0f || og.out[b * per_seq + r * D + d] != 0.0f) empty_ok = 0;
        if (ec > tc || lec > tlc)
            BREAK("%s %s seq %u: CPU decode rel L2 %.3g (tol %.1g), lse err %.3g (tol %.1g)", fmtname, c->name, b,
                  ec, tc, lec, tlc);
        if (eg > tg || leg > tlg)
            BREAK("%s %s seq %u: CUDA decode rel L2 %.3g (tol %.1g), lse err %.3g (tol %.1g x (1+|lse|)); CPU had %.3g",
                  fmtname, c->name, b, eg, tg, leg, tlg, ec);
        else if (ec <= tc && lec <= tlc)
            OKMSG("%s %s seq %u: CPU %.2g, CUDA %.2g rel L2 vs float64; lse %.2g / %.2g", fmtname, c->name, b, ec, eg,
                  lec, leg);
        if (!empty_ok) BREAK("%s %s seq %u: a query with no key did not get out = 0 on both backends", fmtname, c->name, b);
        free(rc); free(rg); free(lc); free(lg); free(mask);
    }
done:
    xb_out_free(&oc); xb_out_free(&og);
    free(q); free(qr);
}

int main(void) {
    require_gpu();
    const double t0 = now_s();
    const ikv_format fmts[5] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    const uint32_t LEN = 203, LEN2 = 77;
    /* plan with partial pages: [3,20) [37,40) [64,100) [150,203) */
    const ikv_token_range rr[4] = {{3, 20}, {37, 40}, {64, 100}, {150, 203}};
    unsigned char pmask[203];
    memset(pmask, 0, sizeof pmask);
    for (int i = 0; i < 4; ++i) for (uint32_t t = rr[i].begin; t < rr[i].end; ++t) pmask[t] = 1;
    ikv_plan *plan = NULL, *empty_plan = NULL;
    IK(ikv_plan_from_ranges(rr, 4, LEN, P, IKV_FMT_F16, &plan));
    const ikv_token_range er[1] = {{20, 30}};  /* evicted below: an empty selection */
    IK(ikv_plan_from_ranges(er, 1, LEN, P, IKV_FMT_F16, &empty_plan));
    unsigned char emask[203];
    memset(emask, 0, sizeof emask);
    for (uint32_t t = 20; t < 30; ++t) emask[t] = 1;

    const dcase cases[] = {
        {"dense T1 G4 f32/f32", 8, 1, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 0, 0},
        {"dense T1 G1 f32/f32", 2, 1, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 0, 0},
        {"dense T1 G8 f16/f16", 16, 1, IKV_DTYPE_F16, IKV_DTYPE_F16, 0, 0, 0, 0},
        {"dense T3 causal G4 softcap f32/f32", 8, 3, IKV_DTYPE_F32, IKV_DTYPE_F32, 0.2f, 2.5f, 0, 0},
        {"dense T3 causal G4 f16/f32", 8, 3, IKV_DTYPE_F16, IKV_DTYPE_F32, 0, 0, 0, 0},
        {"dense T3 causal G4 bf16/bf16 softcap", 8, 3, IKV_DTYPE_BF16, IKV_DTYPE_BF16, 0, 3.0f, 0, 0},
        {"dense T1 G4 f32/bf16", 8, 1, IKV_DTYPE_F32, IKV_DTYPE_BF16, 0, 0, 0, 0},
        {"dense T1 G4 bf16/f16", 8, 1, IKV_DTYPE_BF16, IKV_DTYPE_F16, 0, 0, 0, 0},
        {"plan(partial pages) T1 G4 f32/f32", 8, 1, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 1, 0},
        {"plan(partial pages) T3 G4 f16/f16", 8, 3, IKV_DTYPE_F16, IKV_DTYPE_F16, 0, 0, 1, 0},
        {"plan(partial pages) T3 G1 f32/f32 softcap", 2, 3, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 4.0f, 1, 0},
        {"dense T17 G4 f32/f32 (CUDA GEMM path)", 8, 17, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 0, 1},
        {"dense T17 G4 f16/f16 (multi-token)", 8, 17, IKV_DTYPE_F16, IKV_DTYPE_F16, 0, 1.5f, 0, 0},
    };
    const uint32_t nc = sizeof cases / sizeof cases[0];
    for (int f = 0; f < 5; ++f) {
        const char *fn = ikv_format_name(fmts[f]);
        xb_shape s = {L, H, D, P, fmts[f], 0};
        ikv_pool *cpu = xb_pool(&s, IKV_BACKEND_CPU), *gpu = xb_pool(&s, IKV_BACKEND_CUDA);
        ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
        ikv_seq_id sc[2], sg[2];
        float *k = xb_rows(LEN * L, H, D, 100 + f, 1.0f), *v = xb_rows(LEN * L, H, D, 200 + f, 1.0f);
        for (int b = 0; b < 2; ++b) {
            const uint32_t n = b == 0 ? LEN : LEN2;
            IK(ikv_seq_create(cpu, &sc[b]));
            IK(ikv_seq_create(gpu, &sg[b]));
            ikv_append ac = ikv_append_default(cpu, n), ag = ikv_append_default(gpu, n);
            ac.layer = ag.layer = IKV_ALL_LAYERS;
            ac.k = ag.k = k + (b ? 5 * H * D : 0); ac.v = ag.v = v + (b ? 9 * H * D : 0);
            ac.layer_stride = ag.layer_stride = (int64_t)LEN * H * D;
            IK(ikv_pool_append(cpu, sc[b], &ac));
            IK(ikv_pool_append(gpu, sg[b], &ag));
        }
        for (uint32_t i = 0; i < nc; ++i) {
            run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 1, &cases[i], plan, pmask, LEN);
        }
        /* batch of two sequences of different lengths (dense, and the plan clipped to the shorter one) */
        dcase bc = {"batch of 2 (203, 77 tokens) T2 G4 f32/f32", 8, 2, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 0, 0};
        run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 2, &bc, plan, pmask, LEN);
        dcase bp = {"batch of 2 plan(clipped) T1 G4 f16/f32", 8, 1, IKV_DTYPE_F16, IKV_DTYPE_F32, 0, 0, 1, 0};
        run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 2, &bp, plan, pmask, LEN);
        /* evict pages [16, 48) of sequence 0 on both, then dense, plan, and an all-evicted (empty) plan */
        ikv_status e1 = ikv_seq_evict(cpu, sc[0], 16, 48), e2 = ikv_seq_evict(gpu, sg[0], 16, 48);
        if (e1 != IKV_OK || e2 != IKV_OK) {
            BREAK("%s: ikv_seq_evict CPU %s CUDA %s", fn, ikv_status_name(e1), ikv_status_name(e2));
        } else {
            dcase ed = {"evicted [16,48) dense T3 G4 f32/f32", 8, 3, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 0, 0};
            run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 1, &ed, plan, pmask, LEN);
            dcase ep = {"evicted [16,48) plan T1 G4 f16/bf16", 8, 1, IKV_DTYPE_F16, IKV_DTYPE_BF16, 0, 0, 1, 0};
            run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 1, &ep, plan, pmask, LEN);
            dcase ee = {"empty selection (plan inside evicted pages) T1 G4", 8, 1, IKV_DTYPE_F32, IKV_DTYPE_F32, 0, 0, 1, 0};
            run_case(fn, fmts[f], cpu, gpu, dc, dg, sc, sg, 1, &ee, empty_plan, emask, LEN);
        }
        free(k); free(v);
        ikv_decoder_destroy(dc); ikv_decoder_destroy(dg);
        ikv_pool_destroy(cpu); ikv_pool_destroy(gpu);
    }
    ikv_plan_destroy(plan); ikv_plan_destroy(empty_plan);
    printf("info: %d cases in %.1f s\n", n_cases, now_s() - t0);
    return probe_exit();
}
