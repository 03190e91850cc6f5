/* p7_lists_bytes: without query-aware selection both backends must report the same
 * ikv_decoder_last_selection runs, the same exact ikv_decoder_last_bytes_read (intentkv.h: "for every
 * (sequence, kv-head) and every run of tokens of one page it read, the K and V rows plus that page's scales";
 * only top-k makes CUDA's an estimate), ikv_decoder_get_stats.last_bytes_read equal to it, and the same
 * steps / lists_built / lists_reused after the same calls (the reuse rule of ikv_decoder_stats is stated
 * for both backends: same pool, sequences, lengths, plans, no block-table change). Every format, a batch
 * of two sequences, plans with partial pages, eviction, a format change, appends that stay inside a page
 * and that open one. */
#include "equiv_util.h"

static const uint32_t L = 2, H = 2, D = 64, P = 16, HQ = 4;

static void compare(const char *fmt, const char *step, ikv_decoder *dc, ikv_decoder *dg, uint32_t nseq, xb_out *oc, xb_out *og) {
    if (oc->st != IKV_OK || og->st != IKV_OK) { BREAK("%s %s: decode CPU %s CUDA %s", fmt, step, ikv_status_name(oc->st), ikv_status_name(og->st)); return; }
    int ok = 1;
    for (uint32_t b = 0; b < nseq; ++b)
        for (uint32_t h = 0; h < H; ++h) {
            ikv_token_range *rc, *rg; size_t nc, ng;
            IK(xb_sel(dc, b, h, &rc, &nc)); IK(xb_sel(dg, b, h, &rg, &ng));
            if (!xb_same_runs(rc, nc, rg, ng)) { ok = 0; BREAK("%s %s: seq %u kv-head %u last_selection differs", fmt, step, b, h); xb_print_runs("CPU ", rc, nc); xb_print_runs("CUDA", rg, ng); }
            free(rc); free(rg);
        }
    uint64_t bc, bg; IK(ikv_decoder_last_bytes_read(dc, &bc)); IK(ikv_decoder_last_bytes_read(dg, &bg));
    ikv_decoder_stats sc, sg; memset(&sc, 0, sizeof sc); memset(&sg, 0, sizeof sg); sc.struct_size = sg.struct_size = sizeof sc;
    IK(ikv_decoder_get_stats(dc, &sc)); IK(ikv_decoder_get_stats(dg, &sg));
    if (bc != bg) { ok = 0; BREAK("%s %s: last_bytes_read CPU %llu CUDA %llu (no top-k: both exact)", fmt, step, (unsigned long long)bc, (unsigned long long)bg); }
    if (sc.last_bytes_read != bc || sg.last_bytes_read != bg) { ok = 0; BREAK("%s %s: get_stats.last_bytes_read differs from last_bytes_read", fmt, step); }
    if (sc.steps != sg.steps || sc.lists_built != sg.lists_built || sc.lists_reused != sg.lists_reused) {
        ok = 0;
        BREAK("%s %s: decoder stats CPU steps %llu built %llu reused %llu, CUDA %llu %llu %llu", fmt, step, (unsigned long long)sc.steps, (unsigned long long)sc.lists_built, (unsigned long long)sc.lists_reused, (unsigned long long)sg.steps, (unsigned long long)sg.lists_built, (unsigned long long)sg.lists_reused);
    }
    if (ok) OKMSG("%s %s: same runs, bytes %llu, stats built %llu reused %llu", fmt, step, (unsigned long long)bc, (unsigned long long)sc.lists_built, (unsigned long long)sc.lists_reused);
    xb_out_free(oc); xb_out_free(og);
}

int main(void) {
    require_gpu();
    const ikv_format fmts[5] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    const size_t row = (size_t)H * D;
    for (int f = 0; f < 5; ++f) {
        const char *fn = ikv_format_name(fmts[f]);
        xb_shape s = {L, H, D, P, fmts[f], 0};
        ikv_pool *pc = xb_pool(&s, IKV_BACKEND_CPU), *pg = xb_pool(&s, IKV_BACKEND_CUDA);
        ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
        float *k = xb_rows(300, H, D, 7 + f, 1.0f), *v = xb_rows(300, H, D, 8 + f, 1.0f);
        ikv_seq_id sc[2], sg[2];
        for (int b = 0; b < 2; ++b) {
            IK(ikv_seq_create(pc, &sc[b])); IK(ikv_seq_create(pg, &sg[b]));
            IK(xb_append(pc, sc[b], IKV_ALL_LAYERS, b ? 90 : 150, k + b * 3 * row, v, NULL));
            IK(xb_append(pg, sg[b], IKV_ALL_LAYERS, b ? 90 : 150, k + b * 3 * row, v, NULL));
        }
        ikv_token_range rr[3] = {{3, 21}, {40, 41}, {70, 140}};
        ikv_plan *plan; IK(ikv_plan_from_ranges(rr, 3, 150, P, IKV_FMT_F16, &plan));
        const ikv_plan *plans[2] = {plan, NULL};
        float *q = xb_rows(2 * HQ, 1, D, 5, 1.0f);
        ikv_decode_args a = ikv_decode_args_default(); a.n_seqs = 2; a.n_q_heads = HQ; a.layer = 0;
        ikv_decode_args ap = a; ap.plans = plans;
        ikv_decode_args a1 = a; a1.layer = 1;
#define STEP(name, args) do { ikv_decode_args x_ = (args); x_.seqs = sc; xb_out o1 = xb_decode(dc, pc, 0, x_, q, D); x_.seqs = sg; xb_out o2 = xb_decode(dg, pg, 1, x_, q, D); compare(fn, name, dc, dg, 2, &o1, &o2); } while (0)
        STEP("dense batch", a);
        STEP("dense batch again (reuse)", a);
        STEP("dense batch, layer 1 (same lengths: reuse)", a1);
        STEP("plan + dense batch", ap);
        STEP("plan + dense batch again", ap);
        /* an append inside a page to layer 0 of both sequences, then a page-opening one */
        for (int b = 0; b < 2; ++b) { IK(xb_append(pc, sc[b], 0, 1, k, v, NULL)); IK(xb_append(pg, sg[b], 0, 1, k, v, NULL)); }
        STEP("after a 1-token append to layer 0", ap);
        STEP("layer 1 (other length)", a1);
        for (int b = 0; b < 2; ++b) { IK(xb_append(pc, sc[b], 0, 10, k, v, NULL)); IK(xb_append(pg, sg[b], 0, 10, k, v, NULL)); }
        STEP("after a page-opening append to layer 0", ap);
        IK(ikv_seq_evict(pc, sc[0], 16, 48)); IK(ikv_seq_evict(pg, sg[0], 16, 48));
        STEP("after evicting [16,48) of sequence 0", ap);
        STEP("dense over the hole", a);
        IK(ikv_seq_set_page_format(pc, sc[1], 1, IKV_FMT_INT4)); IK(ikv_seq_set_page_format(pg, sg[1], 1, IKV_FMT_INT4));
        STEP("after a format change of sequence 1 page 1", ap);
        STEP("the same again (reuse)", ap);
        ikv_plan_destroy(plan); free(q); free(k); free(v);
        ikv_decoder_destroy(dc); ikv_decoder_destroy(dg); ikv_pool_destroy(pc); ikv_pool_destroy(pg);
    }
    return probe_exit();
}
