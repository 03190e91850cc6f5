/* p6_tier: the host tier of a CUDA pool keeps outputs and stored bytes identical, with the stats the
 * header documents; a CPU pool fed the same tokens is the reference for the common stats.
 * intentkv.h ikv_seq_offload: "its block table entry, format, bytes and key summary are the same in both,
 * and a decode reads a host-tier page where it is ... the output is the same byte for byte"; "Moved are the
 * whole pages in range that this sequence alone holds and whose every layer is complete; pages a fork
 * shares, the partial tail page, evicted pages and pages already in the target tier stay";
 * ikv_pool_stats: used_bytes (device pages only with a host tier), pages_used / pages_by_format /
 * bytes_by_format "every tier", host_used_bytes, host_pages, bytes_offloaded, bytes_fetched,
 * host_page_reads ("one per page and call"); ikv_seq_page_tier; a format change re-stores a host page in
 * device memory; ikv_pool_tier_step report fields. Decodes: dense, a plan, top-k, on the same decoder
 * (reused lists must follow the moved pages) and on a fresh one, after the freed device memory was reused
 * by another sequence's appends. */
#include "equiv_util.h"

static const uint32_t L = 2, H = 2, D = 64, P = 16, HQ = 8, LEN = 203;

static int outs_equal(const xb_out *a, const xb_out *b, size_t rows) {
    return memcmp(a->out, b->out, rows * D * 4) == 0 && memcmp(a->lse, b->lse, rows * 4) == 0;
}

int main(void) {
    require_gpu();
    if (xb_selftest()) { printf("INCONCLUSIVE: the host tier needs a CUDA pool (no selftest)\n"); return 2; }
    xb_shape st = {L, H, D, P, IKV_FMT_INT8, 64ull << 20}, sn = st;
    sn.host_cap = 0;
    ikv_pool *pt = xb_pool(&st, IKV_BACKEND_CUDA), *pc = xb_pool(&sn, IKV_BACKEND_CPU);
    const uint64_t pb = ikv_pool_page_bytes(pt, IKV_FMT_INT8);
    float *k = xb_rows(LEN, H, D, 71, 1.0f), *v = xb_rows(LEN, H, D, 72, 1.0f);
    ikv_seq_id a, ac, other;
    IK(ikv_seq_create(pt, &a)); IK(ikv_seq_create(pc, &ac));
    IK(xb_append(pt, a, IKV_ALL_LAYERS, LEN, k, v, NULL)); IK(xb_append(pc, ac, IKV_ALL_LAYERS, LEN, k, v, NULL));
    ikv_token_range rr[2] = {{5, 60}, {120, LEN}};
    ikv_plan *plan; IK(ikv_plan_from_ranges(rr, 2, LEN, P, IKV_FMT_INT8, &plan));
    const ikv_plan *plans[1] = {plan};
    float *q = xb_rows(HQ, 1, D, 73, 1.0f);
    ikv_decoder *d1 = xb_decoder();
    ikv_decode_args da = ikv_decode_args_default(); da.layer = 1; da.n_q_heads = HQ; da.seqs = &a;
    ikv_decode_args pa = da; pa.plans = plans;
    ikv_decode_args ta = da; ta.topk_token_budget = 64;
    xb_out r_dense = xb_decode(d1, pt, 1, da, q, D), r_plan = xb_decode(d1, pt, 1, pa, q, D), r_topk = xb_decode(d1, pt, 1, ta, q, D);
    xb_out r_dense2 = xb_decode(d1, pt, 1, da, q, D); /* d1's lists now those of the dense call */
    if (r_dense.st || r_plan.st || r_topk.st || r_dense2.st) { INCONCL("decodes before offload failed"); return probe_exit(); }
    float *k0 = malloc((size_t)LEN * H * D * 4), *v0 = malloc((size_t)LEN * H * D * 4);
    IK(ikv_seq_read(pt, a, 1, 0, LEN, k0, v0));
    ikv_pool_stats s0 = xb_stats(pt);

    uint32_t moved = 999;
    IK(ikv_seq_offload(pt, a, 0, LEN, NULL, &moved));
    const uint32_t full = LEN / P;
    if (moved != full) BREAK("offload [0,%u): moved %u pages, want the %u whole pages (not the partial tail)", LEN, moved, full);
    for (uint32_t pg = 0; pg <= full; ++pg) {
        int on = -1; IK(ikv_seq_page_tier(pt, a, pg, &on));
        if (on != (pg < full)) BREAK("page_tier(%u) = %d after offload", pg, on);
    }
    ikv_pool_stats s1 = xb_stats(pt);
    if (s1.host_pages != full || s1.host_used_bytes != full * pb) BREAK("after offload host_pages %llu host_used_bytes %llu, want %u and %llu", (unsigned long long)s1.host_pages, (unsigned long long)s1.host_used_bytes, full, (unsigned long long)(full * pb));
    if (s1.used_bytes != s0.used_bytes - full * pb) BREAK("used_bytes after offload %llu, want %llu (device pages only)", (unsigned long long)s1.used_bytes, (unsigned long long)(s0.used_bytes - full * pb));
    if (s1.pages_used != s0.pages_used || memcmp(s1.bytes_by_format, s0.bytes_by_format, sizeof s0.bytes_by_format) || memcmp(s1.pages_by_format, s0.pages_by_format, sizeof s0.pages_by_format))
        BREAK("pages_used / pages_by_format / bytes_by_format changed by an offload (they count every tier)");
    if (s1.bytes_offloaded != s0.bytes_offloaded + full * pb) BREAK("bytes_offloaded %llu, want %llu", (unsigned long long)s1.bytes_offloaded, (unsigned long long)(s0.bytes_offloaded + full * pb));
    if (s1.host_reserved_bytes < s1.host_used_bytes) BREAK("host_reserved_bytes < host_used_bytes");
    /* the freed device memory is reused by another sequence's pages */
    IK(ikv_seq_create(pt, &other));
    float *k2 = xb_rows(LEN, H, D, 91, 3.0f), *v2 = xb_rows(LEN, H, D, 92, 3.0f);
    IK(xb_append(pt, other, IKV_ALL_LAYERS, LEN, k2, v2, NULL));
    float *k1 = malloc((size_t)LEN * H * D * 4), *v1 = malloc((size_t)LEN * H * D * 4);
    IK(ikv_seq_read(pt, a, 1, 0, LEN, k1, v1));
    if (memcmp(k0, k1, (size_t)LEN * H * D * 4) || memcmp(v0, v1, (size_t)LEN * H * D * 4)) BREAK("ikv_seq_read differs after offload");
    float kc[(size_t)203 * 2 * 64], vc[(size_t)203 * 2 * 64];
    IK(ikv_seq_read(pc, ac, 1, 0, LEN, kc, vc));
    if (memcmp(kc, k1, sizeof kc) || memcmp(vc, v1, sizeof vc)) BREAK("ikv_seq_read of the host-tier pages differs from the CPU pool's");
    for (uint32_t pg = 0; pg <= full; ++pg) {
        float m1[3 * 64], m2[3 * 64]; uint32_t n1, n2;
        IK(ikv_seq_page_summary(pt, a, 1, 1, pg, m1, m1 + D, m1 + 2 * D, &n1));
        IK(ikv_seq_page_summary(pc, ac, 1, 1, pg, m2, m2 + D, m2 + 2 * D, &n2));
        if (n1 != n2 || memcmp(m1, m2, sizeof m1)) BREAK("page %u summary of a host-tier page differs from the CPU pool's", pg);
    }
    /* decodes over host pages: same decoder (same call as its last: lists reusable only if the move is seen) */
    uint64_t reads0 = xb_stats(pt).host_page_reads;
    xb_out h_dense = xb_decode(d1, pt, 1, da, q, D);
    uint64_t reads1 = xb_stats(pt).host_page_reads;
    if (h_dense.st != IKV_OK || !outs_equal(&h_dense, &r_dense, HQ)) BREAK("dense decode over host-tier pages (same decoder) is not byte-identical (%s)", ikv_status_name(h_dense.st));
    else OKMSG("dense decode over host-tier pages byte-identical");
    if (reads1 - reads0 != full) BREAK("host_page_reads grew by %llu for a dense call over %u host pages", (unsigned long long)(reads1 - reads0), full);
    ikv_decoder *d2 = xb_decoder();
    xb_out h_plan = xb_decode(d2, pt, 1, pa, q, D), h_topk = xb_decode(d2, pt, 1, ta, q, D);
    if (h_plan.st != IKV_OK || !outs_equal(&h_plan, &r_plan, HQ)) BREAK("plan decode over host-tier pages not byte-identical (%s)", ikv_status_name(h_plan.st));
    else OKMSG("plan decode over host-tier pages byte-identical");
    if (h_topk.st != IKV_OK || !outs_equal(&h_topk, &r_topk, HQ)) BREAK("top-k decode over host-tier pages not byte-identical (%s)", ikv_status_name(h_topk.st));
    else OKMSG("top-k decode over host-tier pages byte-identical");
    /* fetch part back */
    ikv_pool_stats s2 = xb_stats(pt);
    IK(ikv_seq_fetch(pt, a, 0, 100, NULL, &moved));
    const uint32_t fetched = (100 + P - 1) / P;
    if (moved != fetched) BREAK("fetch [0,100): moved %u, want %u (pages overlapping the range)", moved, fetched);
    ikv_pool_stats s3 = xb_stats(pt);
    if (s3.bytes_fetched != s2.bytes_fetched + fetched * pb || s3.host_pages != full - fetched) BREAK("after fetch bytes_fetched %llu host_pages %llu", (unsigned long long)s3.bytes_fetched, (unsigned long long)s3.host_pages);
    xb_out f_dense = xb_decode(d1, pt, 1, da, q, D);
    if (f_dense.st != IKV_OK || !outs_equal(&f_dense, &r_dense, HQ)) BREAK("dense decode after a partial fetch not byte-identical");
    /* a fork shares the pages: they stay */
    ikv_seq_id ch; IK(ikv_seq_fork(pt, a, &ch));
    IK(ikv_seq_offload(pt, a, 0, LEN, NULL, &moved));
    if (moved != 0) BREAK("offload of pages a fork shares moved %u pages", moved);
    IK(ikv_seq_destroy(pt, ch));
    /* a format change re-stores a host page in device memory */
    int on = 0; IK(ikv_seq_page_tier(pt, a, 9, &on));
    if (on) {
        IK(ikv_seq_set_page_format(pt, a, 9, IKV_FMT_F16));
        IK(ikv_seq_set_page_format(pc, ac, 9, IKV_FMT_F16));
        IK(ikv_seq_page_tier(pt, a, 9, &on));
        if (on) BREAK("a host-tier page given another format is still in the host tier");
        float m1[3 * 64], m2[3 * 64]; uint32_t n1, n2;
        IK(ikv_seq_page_summary(pt, a, 0, 0, 9, m1, m1 + D, m1 + 2 * D, &n1));
        IK(ikv_seq_page_summary(pc, ac, 0, 0, 9, m2, m2 + D, m2 + 2 * D, &n2));
        float ka[16 * 128], va[16 * 128], kb[16 * 128], vb[16 * 128];
        IK(ikv_seq_read(pt, a, 0, 144, 160, ka, va)); IK(ikv_seq_read(pc, ac, 0, 144, 160, kb, vb));
        if (memcmp(m1, m2, sizeof m1) || memcmp(ka, kb, sizeof ka) || memcmp(va, vb, sizeof va)) BREAK("format change of a host-tier page stored other bytes than the CPU pool's change of the same page");
        else OKMSG("format change of a host-tier page: device page, same bytes as the CPU pool");
    } else INCONCL("page 9 not in the host tier");
    /* tier policy */
    ikv_tier_policy tp; memset(&tp, 0, sizeof tp); tp.struct_size = sizeof tp;
    IK(ikv_pool_set_tier_policy(pt, &tp));
    /* the reference for after tier_step: page 9 changed format above, so r_plan (INT8 page 9) no longer is */
    xb_out r_plan9 = xb_decode(d2, pt, 1, pa, q, D);
    if (r_plan9.st != IKV_OK) { INCONCL("plan decode before tier_step failed"); return probe_exit(); }
    ikv_tier_step_report rep; memset(&rep, 0, sizeof rep); rep.struct_size = sizeof rep;
    ikv_pool_stats s4 = xb_stats(pt);
    IK(ikv_pool_tier_step(pt, &a, plans, 1, NULL, &rep));
    ikv_pool_stats s5 = xb_stats(pt);
    if (rep.step != 1) BREAK("tier_step report.step %llu after the first call", (unsigned long long)rep.step);
    if (s5.host_pages + rep.pages_fetched - rep.pages_offloaded != s4.host_pages) BREAK("tier_step report (fetched %u, offloaded %u) does not match host_pages %llu -> %llu", rep.pages_fetched, rep.pages_offloaded, (unsigned long long)s4.host_pages, (unsigned long long)s5.host_pages);
    if (s5.bytes_fetched - s4.bytes_fetched != 0 && rep.pages_fetched == 0) BREAK("bytes_fetched grew with pages_fetched 0");
    /* plan pages: [5,60) -> pages 0..3, [120,203) -> 7..12; prefetch none (plan_from_ranges) */
    uint32_t plan_on_host = 0;
    for (uint32_t pg = 0; pg <= full; ++pg) {
        int h = 0; IK(ikv_seq_page_tier(pt, a, pg, &h));
        if (h && (pg <= 3 || pg >= 7)) ++plan_on_host;
    }
    if (plan_on_host != rep.pages_on_host) BREAK("tier_step pages_on_host %u, but %u of the plan's pages are in host memory", rep.pages_on_host, plan_on_host);
    if (plan_on_host != 0) BREAK("tier_step left %u plan pages on the host with ample device room", plan_on_host);
    xb_out t_plan = xb_decode(d2, pt, 1, pa, q, D);
    if (t_plan.st != IKV_OK || !outs_equal(&t_plan, &r_plan9, HQ)) BREAK("plan decode after tier_step not byte-identical to the same plan's decode before it");
    else OKMSG("tier_step: report consistent, plan decode byte-identical");
    /* the common stats against the CPU pool (which lacks `other`: compare before it, per format of a) */
    {
        ikv_seq_id oc_; IK(ikv_seq_create(pc, &oc_)); IK(xb_append(pc, oc_, IKV_ALL_LAYERS, LEN, k2, v2, NULL));
        ikv_pool_stats c = xb_stats(pc), g = xb_stats(pt);
        if (c.pages_used != g.pages_used || memcmp(c.bytes_by_format, g.bytes_by_format, sizeof c.bytes_by_format) || c.tokens_total != g.tokens_total)
            BREAK("pages_used / bytes_by_format / tokens_total of the tiered CUDA pool (%llu pages) differ from the CPU pool's (%llu)", (unsigned long long)g.pages_used, (unsigned long long)c.pages_used);
        if (c.host_pages || c.host_used_bytes || c.bytes_offloaded || c.host_page_reads) BREAK("a CPU pool reports host-tier stats");
        if (g.used_bytes + g.host_used_bytes != c.used_bytes) BREAK("device used_bytes %llu + host_used_bytes %llu != the CPU pool's used_bytes %llu", (unsigned long long)g.used_bytes, (unsigned long long)g.host_used_bytes, (unsigned long long)c.used_bytes);
    }
    return probe_exit();
}
