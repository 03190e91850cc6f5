/* Attention feedback from the fused decode's own chunk sums (decode_attention.cu's feedback
 * variants, attention_feedback.cu feedback_from_chunks_kernel) against a CPU pool fed the same
 * tokens: the averages agree "to float rounding" (intentkv.h ikv_page_feedback). Every shape the
 * chunk bookkeeping distinguishes: page sizes 8, 16, 32, 64 (one chunk per entry, or 2 and 4 of 16
 * rows), F32 queries (SIMT) and F16 queries (tensor cores under IKV_CUDA_DECODE_COMPUTE=tensor-cores),
 * 1 and 5 query tokens (one and several row chunks per kv-head; causal), dense lists (one list per
 * sequence), a plan of partial pages, and top-k lists (one per kv-head). The compute mode is read
 * once per process, so each mode runs in a child process of its own. */
#include "equiv_util.h"

#include <sys/wait.h>
#include <unistd.h>

enum { H = 2, D = 64, HQ = 8 };

static void compare(const char *what, ikv_page_feedback *fc, ikv_page_feedback *fg, ikv_seq_id sc, ikv_seq_id sg,
                    double rel) {
    float mc[64], mg[64];
    for (uint32_t h = 0; h < H; ++h) {
        uint32_t nc = 0, ng = 0;
        IK(ikv_page_feedback_get(fc, sc, 0, h, mc, 64, &nc));
        IK(ikv_page_feedback_get(fg, sg, 0, h, mg, 64, &ng));
        if (nc != ng) { BREAK("%s kv-head %u: %u pages fed back on the CPU, %u on CUDA", what, h, nc, ng); return; }
        for (uint32_t i = 0; i < nc && i < 64; ++i)
            if (fabs((double)mc[i] - mg[i]) > rel * fmax(fabs((double)mc[i]), 1e-3) + 1e-6) {
                BREAK("%s kv-head %u page %u: average %.7g on the CPU, %.7g on CUDA", what, h, i, mc[i], mg[i]);
                return;
            }
    }
}

static int run(const char *mode) {
    require_gpu();
    static const uint32_t sizes[] = {8, 16, 32, 64};
    int cases = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; ++si) {
        const uint32_t P = sizes[si], LEN = 9 * P + 5;
        xb_shape s = {1, H, D, P, IKV_FMT_F16, 0};
        ikv_pool *pc = xb_pool(&s, IKV_BACKEND_CPU), *pg = xb_pool(&s, IKV_BACKEND_CUDA);
        ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
        float *k = xb_rows(LEN, H, D, 31 + P, 1.0f), *v = xb_rows(LEN, H, D, 32 + P, 1.0f);
        for (uint32_t t = 0; t < LEN; ++t)  /* pages of unequal weight */
            for (size_t i = 0; i < (size_t)H * D; ++i) k[(size_t)t * H * D + i] *= 0.3f + 0.25f * ((t / P) * 5 % 7);
        ikv_seq_id sc, sg;
        IK(ikv_seq_create(pc, &sc)); IK(ikv_seq_create(pg, &sg));
        IK(xb_append(pc, sc, 0, LEN, k, v, NULL)); IK(xb_append(pg, sg, 0, LEN, k, v, NULL));
        ikv_token_range rr[2] = {{3, 2 * P + 5}, {4 * P + 1, LEN}};
        ikv_plan *plan; IK(ikv_plan_from_ranges(rr, 2, LEN, P, IKV_FMT_F16, &plan));
        const ikv_plan *plans[1] = {plan};
        float *q = xb_rows(5 * HQ, 1, D, 41 + P, 1.0f);
        for (int dt = 0; dt < 2; ++dt)
            for (uint32_t T = 1; T <= 5; T += 4)
                for (int sel = 0; sel < 3; ++sel) {  /* dense, plan, top-k */
                    ikv_page_feedback_config fcfg = ikv_page_feedback_default_config();
                    fcfg.rate = 1.0f;  /* each average is the step's share */
                    ikv_page_feedback *fc, *fg;
                    IK(ikv_page_feedback_create(pc, &fcfg, &fc)); IK(ikv_page_feedback_create(pg, &fcfg, &fg));
                    ikv_decode_args a = ikv_decode_args_default();
                    a.n_q_heads = HQ; a.n_query_tokens = T; a.q_dtype = dt ? IKV_DTYPE_F16 : IKV_DTYPE_F32;
                    a.plans = sel == 1 ? plans : NULL;
                    a.topk_token_budget = sel == 2 ? 3 * P : 0;
                    char what[160];
                    snprintf(what, sizeof what, "%s: page %u, %s queries, T %u, %s", mode, P, dt ? "F16" : "F32", T,
                             sel == 0 ? "dense" : sel == 1 ? "plan" : "top-k");
                    a.seqs = &sc; a.feedback = fc; xb_out oc = xb_decode(dc, pc, 0, a, q, D);
                    a.seqs = &sg; a.feedback = fg; xb_out og = xb_decode(dg, pg, 1, a, q, D);
                    if (oc.st != IKV_OK || og.st != IKV_OK) {
                        BREAK("%s: CPU %s, CUDA %s (%s)", what, ikv_status_name(oc.st), ikv_status_name(og.st), ikv_last_error());
                    } else {
                        int same = 1;  /* top-k: compare where both picked the same pages */
                        for (uint32_t h = 0; sel == 2 && h < H; ++h) {
                            ikv_token_range *r1, *r2; size_t n1, n2;
                            IK(xb_sel(dc, 0, h, &r1, &n1)); IK(xb_sel(dg, 0, h, &r2, &n2));
                            same = same && xb_same_runs(r1, n1, r2, n2);
                            free(r1); free(r2);
                        }
                        if (same) compare(what, fc, fg, sc, sg, dt ? 2e-3 : 1e-4), ++cases;
                        else printf("info: %s: the selections differ (a near tie), not compared\n", what);
                    }
                    xb_out_free(&oc); xb_out_free(&og);
                    ikv_page_feedback_destroy(fc); ikv_page_feedback_destroy(fg);
                }
        free(q); free(k); free(v);
        ikv_plan_destroy(plan);
        ikv_decoder_destroy(dc); ikv_decoder_destroy(dg);
        ikv_pool_destroy(pc); ikv_pool_destroy(pg);
    }
    if (!g_break) OKMSG("%s: feedback averages agree with the CPU pool's in %d cases", mode, cases);
    return probe_exit();
}

int main(void) {
    static const char *modes[] = {"simt", "tensor-cores"};
    int worst = 0;
    for (int m = 0; m < 2; ++m) {
        fflush(stdout);
        const pid_t pid = fork();  /* before any CUDA call in this process: each child starts CUDA itself */
        if (pid == 0) {
            setenv("IKV_CUDA_DECODE_COMPUTE", modes[m], 1);
            exit(run(modes[m]));
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) {
            printf("BREAK: the %s child process did not exit normally\n", modes[m]);
            return 1;
        }
        const int code = WEXITSTATUS(status);
        if (code == 1 || (code == 2 && worst == 0)) worst = code;
    }
    return worst;
}
