/* p1_bad_input: the same refused calls on a CPU pool and a CUDA pool: each must return the same status on
 * both (intentkv.h conventions, lines 17-27: "the objects involved are left exactly as they were"; CUDA
 * differences only where the header names them), decode refusals must write nothing ("Errors (nothing is
 * written on error ...)" of ikv_decode: output and lse buffers stay poisoned), and afterwards both pools
 * hold the same, unchanged state (lengths, stored values, pool stats) and the decoders' last_selection is
 * IKV_E_STATE on both after a failed call. Covers appends, decode arguments (incl. the top-k options,
 * query memory and feedback of another pool, args->append), query memory and feedback calls, truncate,
 * fork, evict, format changes, reserve, reads, summaries and the tier calls. */
#include "equiv_util.h"

static const uint32_t L = 2, H = 2, D = 64, P = 16;
static int n_checked = 0;
static void same(const char *what, ikv_status c, ikv_status g, ikv_status expect) {
    ++n_checked;
    if (c != g) BREAK("%s: CPU %s, CUDA %s (%s)", what, ikv_status_name(c), ikv_status_name(g), ikv_last_error());
    else if (c != expect) printf("info: %s: both %s (the header names %s)\n", what, ikv_status_name(c), ikv_status_name(expect));
}

typedef struct snap { uint32_t len[4]; float *kv[4]; ikv_pool_stats st; } snap;
static void take(snap *s, ikv_pool *p, const ikv_seq_id *seqs, int n) {
    for (int i = 0; i < n; ++i) {
        IK(ikv_seq_layer_length(p, seqs[i], 0, &s->len[i]));
        s->kv[i] = calloc((size_t)2 * L * 64 * H * D, 4);
        for (uint32_t l = 0; l < L; ++l) {
            uint32_t ll = 0; ikv_seq_layer_length(p, seqs[i], l, &ll);
            for (uint32_t p0 = 0; p0 < ll; p0 += P) {
                int ev = 0; ikv_seq_is_evicted(p, seqs[i], p0, &ev);
                if (ev) continue;
                uint32_t e = p0 + P < ll ? p0 + P : ll;
                IK(ikv_seq_read(p, seqs[i], l, p0, e, s->kv[i] + ((size_t)l * 64 + p0) * H * D, s->kv[i] + ((size_t)(L + l) * 64 + p0) * H * D));
            }
        }
    }
    s->st = xb_stats(p);
}
static int same_snap(const snap *a, const snap *b, int n) {
    for (int i = 0; i < n; ++i) {
        if (a->len[i] != b->len[i]) return 0;
        if (memcmp(a->kv[i], b->kv[i], (size_t)2 * L * 64 * H * D * 4)) return 0;
    }
    return a->st.used_bytes == b->st.used_bytes && a->st.pages_used == b->st.pages_used &&
           a->st.tokens_total == b->st.tokens_total && a->st.n_sequences == b->st.n_sequences &&
           a->st.staging_bytes == b->st.staging_bytes && !memcmp(a->st.bytes_by_format, b->st.bytes_by_format, sizeof a->st.bytes_by_format);
}

int main(void) {
    require_gpu();
    xb_shape s = {L, H, D, P, IKV_FMT_INT8, 0};
    ikv_pool *pc = xb_pool(&s, IKV_BACKEND_CPU), *pg = xb_pool(&s, IKV_BACKEND_CUDA);
    ikv_pool *oc = xb_pool(&s, IKV_BACKEND_CPU), *og = xb_pool(&s, IKV_BACKEND_CUDA); /* "another pool" */
    ikv_pool *pools[2] = {pc, pg}, *others[2] = {oc, og};
    const size_t row = (size_t)H * D;
    float *k = xb_rows(64, H, D, 1, 1.0f), *v = xb_rows(64, H, D, 2, 1.0f);
    ikv_seq_id A[2], B[2], C[2];
    for (int b = 0; b < 2; ++b) {
        IK(ikv_seq_create(pools[b], &A[b]));
        IK(xb_append(pools[b], A[b], IKV_ALL_LAYERS, 40, k, v, NULL));
        IK(ikv_seq_fork(pools[b], A[b], &B[b]));
        IK(ikv_seq_create(pools[b], &C[b]));
        IK(xb_append(pools[b], C[b], IKV_ALL_LAYERS, 20, k, v, NULL));
        IK(xb_append(pools[b], C[b], 0, 3, k, v, NULL)); /* layers of unequal length */
        IK(ikv_seq_evict(pools[b], B[b], 16, 32));
    }
    snap before[2];
    { ikv_seq_id sq[3]; for (int b = 0; b < 2; ++b) { sq[0] = A[b]; sq[1] = B[b]; sq[2] = C[b]; take(&before[b], pools[b], sq, 3); } }
    ikv_plan *plan32 = NULL; ikv_token_range r0 = {0, 40};
    IK(ikv_plan_from_ranges(&r0, 1, 40, 32, IKV_FMT_F16, &plan32));
    const ikv_seq_id bogus = 987654u;
    float nanrow[128 * 2]; for (int i = 0; i < 256; ++i) nanrow[i] = 0.5f; nanrow[77] = NAN;

    /* ---- appends ---- */
#define BOTH(expr_c, expr_g, what, expect) do { ikv_status c_ = (expr_c), g_ = (expr_g); same(what, c_, g_, expect); } while (0)
    {
        ikv_append a[2];
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 0); a[b].k = k; a[b].v = v; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append n_tokens 0", IKV_E_INVALID);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 2); a[b].k = k; a[b].v = v; a[b].token_stride = 10; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append token_stride < head_dim", IKV_E_INVALID);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 2); a[b].k = k; a[b].v = v; a[b].layer = 7; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append layer out of range", IKV_E_RANGE);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 1); a[b].k = nanrow; a[b].v = v; a[b].layer = 1; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append NaN in K (host input)", IKV_E_INVALID);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 1); a[b].k = k; a[b].v = v; a[b].flags = 0x80; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append unknown flags", IKV_E_INVALID);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 1); a[b].k = k; a[b].v = v; a[b].formats = plan32; }
        BOTH(ikv_pool_append(pc, A[0], &a[0]), ikv_pool_append(pg, A[1], &a[1]), "append formats plan of another page_size", IKV_E_INVALID);
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 1); a[b].k = k; a[b].v = v; }
        BOTH(ikv_pool_append(pc, bogus, &a[0]), ikv_pool_append(pg, bogus, &a[1]), "append unknown sequence", IKV_E_NOT_FOUND);
        ikv_seq_id dup[2][2] = {{A[0], A[0]}, {A[1], A[1]}};
        BOTH(ikv_pool_append_batch(pc, dup[0], 2, &a[0]), ikv_pool_append_batch(pg, dup[1], 2, &a[1]), "append_batch sequence listed twice", IKV_E_INVALID);
        BOTH(ikv_pool_append_batch(pc, dup[0], 0, &a[0]), ikv_pool_append_batch(pg, dup[1], 0, &a[1]), "append_batch n_seqs 0", IKV_E_INVALID);
        ikv_seq_id two[2][2] = {{A[0], C[0]}, {A[1], C[1]}};
        for (int b = 0; b < 2; ++b) { a[b] = ikv_append_default(pools[b], 1); a[b].k = nanrow; a[b].v = v; a[b].seq_stride = 0; a[b].layer = 1; }
        BOTH(ikv_pool_append_batch(pc, two[0], 2, &a[0]), ikv_pool_append_batch(pg, two[1], 2, &a[1]), "append_batch NaN (atomic over the batch)", IKV_E_INVALID);
    }
    /* ---- decode arguments ---- */
    ikv_decoder *dc = xb_decoder(), *dg = xb_decoder();
    ikv_query_memory_config qmc = ikv_query_memory_default_config(); qmc.n_q_heads = 4;
    ikv_query_memory *qm_other[2], *qm_heads8[2];
    ikv_page_feedback *fb_other[2];
    ikv_page_feedback_config fbc = ikv_page_feedback_default_config();
    for (int b = 0; b < 2; ++b) {
        IK(ikv_query_memory_create(others[b], &qmc, &qm_other[b]));
        ikv_query_memory_config q8 = qmc; q8.n_q_heads = 8;
        IK(ikv_query_memory_create(pools[b], &q8, &qm_heads8[b]));
        IK(ikv_page_feedback_create(others[b], &fbc, &fb_other[b]));
    }
    /* one successful decode first so that last_selection has something to lose */
    {
        ikv_decode_args a = ikv_decode_args_default(); a.n_q_heads = 4;
        float *q = xb_rows(4, 1, D, 3, 1.0f);
        a.seqs = &A[0]; xb_out o1 = xb_decode(dc, pc, 0, a, q, D);
        a.seqs = &A[1]; xb_out o2 = xb_decode(dg, pg, 1, a, q, D);
        if (o1.st != IKV_OK || o2.st != IKV_OK) INCONCL("a valid decode failed: %s / %s", ikv_status_name(o1.st), ikv_status_name(o2.st));
        xb_out_free(&o1); xb_out_free(&o2); free(q);
    }
    struct { const char *name; ikv_status expect; int field; } dcases[] = {
        {"decode n_seqs 0", IKV_E_INVALID, 0}, {"decode layer out of range", IKV_E_RANGE, 1},
        {"decode n_q_heads 3 (not a multiple of 2)", IKV_E_INVALID, 2}, {"decode n_query_tokens 0", IKV_E_INVALID, 3},
        {"decode n_query_tokens 41 > length 40", IKV_E_INVALID, 4}, {"decode n_query_tokens 2049", IKV_E_INVALID, 5},
        {"decode q_dtype 7", IKV_E_INVALID, 6}, {"decode out_dtype 9", IKV_E_INVALID, 7},
        {"decode scale -1", IKV_E_INVALID, 8}, {"decode scale NaN", IKV_E_INVALID, 9}, {"decode softcap inf", IKV_E_INVALID, 10},
        {"decode topk_mode 5", IKV_E_INVALID, 11}, {"decode topk_score 3", IKV_E_INVALID, 12},
        {"decode MASS topk_mass 0", IKV_E_INVALID, 13}, {"decode MASS topk_mass 1.5", IKV_E_INVALID, 14},
        {"decode MASS topk_min_tokens > topk_token_budget", IKV_E_INVALID, 15},
        {"decode topk_feedback_weight 1.5", IKV_E_INVALID, 16}, {"decode topk_feedback_weight NaN", IKV_E_INVALID, 17},
        {"decode plan of another page_size", IKV_E_INVALID, 18}, {"decode unknown sequence", IKV_E_NOT_FOUND, 19},
        {"decode query_memory of another pool (top-k on)", IKV_E_INVALID, 20},
        {"decode query_memory with other n_q_heads", IKV_E_INVALID, 21}, {"decode feedback of another pool", IKV_E_INVALID, 22},
        {"decode struct_size 4", IKV_E_INVALID, 23}, {"decode seqs NULL", IKV_E_NULL, 24},
        {"decode args->append->layer != args->layer", IKV_E_INVALID, 25},
        {"decode args->append->stream != args->stream", IKV_E_INVALID, 26},
        {"decode query_memory of another pool (top-k off)", IKV_E_INVALID, 27},
        {"decode args->append with NaN (nothing appended)", IKV_E_INVALID, 28},
        {"decode with args->append, n_query_tokens 42 > 40 + 1", IKV_E_INVALID, 29},
    };
    float *q = xb_rows(2100 * 4, 1, D, 4, 1.0f);
    for (size_t i = 0; i < sizeof dcases / sizeof dcases[0]; ++i) {
        xb_out o[2];
        ikv_append ap[2];
        for (int b = 0; b < 2; ++b) {
            ikv_decode_args a = ikv_decode_args_default();
            a.n_q_heads = 4; a.seqs = &A[b]; a.layer = 1;
            const ikv_plan *pl[1] = {plan32};
            ap[b] = ikv_append_default(pools[b], 1); ap[b].k = k; ap[b].v = v; ap[b].layer = 1;
            switch (dcases[i].field) {
            case 0: a.n_seqs = 0; break; case 1: a.layer = 2; break; case 2: a.n_q_heads = 3; break;
            case 3: a.n_query_tokens = 0; break; case 4: a.n_query_tokens = 41; break; case 5: a.n_query_tokens = 2049; break;
            case 6: a.q_dtype = (ikv_dtype)7; break; case 7: a.out_dtype = (ikv_dtype)9; break;
            case 8: a.scale = -1.0f; break; case 9: a.scale = NAN; break; case 10: a.softcap = INFINITY; break;
            case 11: a.topk_mode = (ikv_topk_mode)5; break; case 12: a.topk_score = (ikv_topk_score)3; break;
            case 13: a.topk_mode = IKV_TOPK_MASS; a.topk_mass = 0.0f; break;
            case 14: a.topk_mode = IKV_TOPK_MASS; a.topk_mass = 1.5f; break;
            case 15: a.topk_mode = IKV_TOPK_MASS; a.topk_token_budget = 16; a.topk_min_tokens = 32; break;
            case 16: a.topk_feedback_weight = 1.5f; break; case 17: a.topk_feedback_weight = NAN; break;
            case 18: a.plans = pl; break; case 19: a.seqs = &bogus; break;
            case 20: a.topk_token_budget = 16; a.query_memory = qm_other[b]; break;
            case 21: a.topk_token_budget = 16; a.query_memory = qm_heads8[b]; break;
            case 22: a.feedback = fb_other[b]; break;
            case 23: a.struct_size = 4; break; case 24: a.seqs = NULL; break;
            case 25: ap[b].layer = 0; a.append = &ap[b]; break;
            case 26: ap[b].stream = (void *)0x1; a.append = &ap[b]; break;
            case 27: a.query_memory = qm_other[b]; break;
            case 28: ap[b].k = nanrow; a.append = &ap[b]; break;
            case 29: a.n_query_tokens = 42; a.append = &ap[b]; break;
            }
            o[b] = xb_decode(b ? dg : dc, pools[b], b, a, q, D);
        }
        same(dcases[i].name, o[0].st, o[1].st, dcases[i].expect);
        for (int b = 0; b < 2; ++b) {
            int untouched = 1;
            for (size_t j = 0; j < o[b].n_rows * D; ++j) if (!isnan(o[b].out[j])) untouched = 0;
            for (size_t j = 0; j < o[b].n_rows; ++j) if (!isnan(o[b].lse[j])) untouched = 0;
            if (o[b].st != IKV_OK && !untouched) BREAK("%s: the %s decode returned %s but wrote out/lse", dcases[i].name, b ? "CUDA" : "CPU", ikv_status_name(o[b].st));
            size_t n = 0;
            ikv_status ls = ikv_decoder_last_selection(b ? dg : dc, 0, 0, NULL, 0, &n);
            if (o[b].st != IKV_OK && ls != IKV_E_STATE) BREAK("%s: after the failed call %s last_selection returned %s, not IKV_E_STATE", dcases[i].name, b ? "CUDA" : "CPU", ikv_status_name(ls));
            xb_out_free(&o[b]);
        }
    }
    /* ---- query memory / feedback ---- */
    {
        ikv_query_memory *m[2] = {0, 0};
        ikv_query_memory_config c = qmc; c.n_q_heads = 3;
        BOTH(ikv_query_memory_create(pc, &c, &m[0]), ikv_query_memory_create(pg, &c, &m[1]), "query_memory_create n_q_heads 3", IKV_E_INVALID);
        c = qmc; c.decay = 1.0f;
        BOTH(ikv_query_memory_create(pc, &c, &m[0]), ikv_query_memory_create(pg, &c, &m[1]), "query_memory_create decay 1", IKV_E_INVALID);
        c = qmc; c.turns = 65;
        BOTH(ikv_query_memory_create(pc, &c, &m[0]), ikv_query_memory_create(pg, &c, &m[1]), "query_memory_create turns 65", IKV_E_INVALID);
        IK(ikv_query_memory_create(pc, &qmc, &m[0])); IK(ikv_query_memory_create(pg, &qmc, &m[1]));
        float qq[4 * 64]; for (int i = 0; i < 256; ++i) qq[i] = 0.1f * (i % 7); 
        BOTH(ikv_query_memory_remember(m[0], A[0], 9, qq, IKV_DTYPE_F32, 1), ikv_query_memory_remember(m[1], A[1], 9, qq, IKV_DTYPE_F32, 1), "remember layer 9", IKV_E_RANGE);
        BOTH(ikv_query_memory_remember(m[0], A[0], 0, qq, IKV_DTYPE_F32, 0), ikv_query_memory_remember(m[1], A[1], 0, qq, IKV_DTYPE_F32, 0), "remember n_tokens 0", IKV_E_INVALID);
        BOTH(ikv_query_memory_remember(m[0], A[0], 0, qq, (ikv_dtype)5, 1), ikv_query_memory_remember(m[1], A[1], 0, qq, (ikv_dtype)5, 1), "remember q_dtype 5", IKV_E_INVALID);
        qq[5] = NAN;
        BOTH(ikv_query_memory_remember(m[0], A[0], 0, qq, IKV_DTYPE_F32, 1), ikv_query_memory_remember(m[1], A[1], 0, qq, IKV_DTYPE_F32, 1), "remember NaN", IKV_E_INVALID);
        BOTH(ikv_query_memory_end_turn(m[0], A[0]), ikv_query_memory_end_turn(m[1], A[1]), "end_turn with nothing remembered (after refused remembers)", IKV_OK);
        ikv_page_feedback *f[2] = {0, 0};
        ikv_page_feedback_config fc = fbc; fc.rate = 0.0f;
        BOTH(ikv_page_feedback_create(pc, &fc, &f[0]), ikv_page_feedback_create(pg, &fc, &f[1]), "feedback_create rate 0", IKV_E_INVALID);
        fc.rate = 1.5f;
        BOTH(ikv_page_feedback_create(pc, &fc, &f[0]), ikv_page_feedback_create(pg, &fc, &f[1]), "feedback_create rate 1.5", IKV_E_INVALID);
        IK(ikv_page_feedback_create(pc, &fbc, &f[0])); IK(ikv_page_feedback_create(pg, &fbc, &f[1]));
        float mass[8]; uint32_t np = 0;
        BOTH(ikv_page_feedback_get(f[0], A[0], 5, 0, mass, 8, &np), ikv_page_feedback_get(f[1], A[1], 5, 0, mass, 8, &np), "feedback_get layer 5", IKV_E_RANGE);
        BOTH(ikv_page_feedback_get(f[0], A[0], 0, 5, mass, 8, &np), ikv_page_feedback_get(f[1], A[1], 0, 5, mass, 8, &np), "feedback_get kv_head 5", IKV_E_RANGE);
        for (int b = 0; b < 2; ++b) { ikv_query_memory_destroy(m[b]); ikv_page_feedback_destroy(f[b]); }
    }
    /* ---- truncate / fork / evict / formats / reserve / reads ---- */
    BOTH(ikv_seq_truncate(pc, A[0], 41), ikv_seq_truncate(pg, A[1], 41), "truncate n_tokens > length", IKV_E_RANGE);
    BOTH(ikv_seq_truncate(pc, bogus, 1), ikv_seq_truncate(pg, bogus, 1), "truncate unknown sequence", IKV_E_NOT_FOUND);
    BOTH(ikv_seq_truncate(pc, C[0], 1), ikv_seq_truncate(pg, C[1], 1), "truncate layers of unequal length", IKV_E_STATE);
    BOTH(ikv_seq_truncate(pc, B[0], 20), ikv_seq_truncate(pg, B[1], 20), "truncate into an evicted page", IKV_E_EVICTED);
    { ikv_seq_id x, y; BOTH(ikv_seq_fork(pc, bogus, &x), ikv_seq_fork(pg, bogus, &y), "fork unknown parent", IKV_E_NOT_FOUND); }
    BOTH(ikv_seq_evict(pc, A[0], 3, 16), ikv_seq_evict(pg, A[1], 3, 16), "evict unaligned", IKV_E_INVALID);
    BOTH(ikv_seq_evict(pc, A[0], 0, 48), ikv_seq_evict(pg, A[1], 0, 48), "evict the tail page", IKV_E_RANGE);
    BOTH(ikv_seq_evict(pc, A[0], 32, 16), ikv_seq_evict(pg, A[1], 32, 16), "evict begin > end", IKV_E_RANGE);
    BOTH(ikv_seq_evict(pc, bogus, 0, 16), ikv_seq_evict(pg, bogus, 0, 16), "evict unknown sequence", IKV_E_NOT_FOUND);
    BOTH(ikv_seq_set_page_format(pc, A[0], 1, (ikv_format)9), ikv_seq_set_page_format(pg, A[1], 1, (ikv_format)9), "set_page_format format 9", IKV_E_INVALID);
    BOTH(ikv_seq_set_page_format(pc, A[0], 1, IKV_FMT_AUTO), ikv_seq_set_page_format(pg, A[1], 1, IKV_FMT_AUTO), "set_page_format AUTO", IKV_E_INVALID);
    BOTH(ikv_seq_set_page_format(pc, A[0], 10, IKV_FMT_F16), ikv_seq_set_page_format(pg, A[1], 10, IKV_FMT_F16), "set_page_format page out of range", IKV_E_RANGE);
    BOTH(ikv_seq_set_page_format(pc, A[0], 0, IKV_FMT_F16), ikv_seq_set_page_format(pg, A[1], 0, IKV_FMT_F16), "set_page_format shared page", IKV_E_SHARED);
    BOTH(ikv_seq_set_page_format(pc, B[0], 1, IKV_FMT_F16), ikv_seq_set_page_format(pg, B[1], 1, IKV_FMT_F16), "set_page_format evicted page", IKV_E_EVICTED);
    BOTH(ikv_seq_apply_plan_formats(pc, A[0], plan32), ikv_seq_apply_plan_formats(pg, A[1], plan32), "apply_plan_formats plan of another page_size", IKV_E_INVALID);
    { ikv_seq_id d0[2] = {A[0], A[0]}, d1[2] = {A[1], A[1]};
      BOTH(ikv_pool_reserve(pc, d0, 0, 8), ikv_pool_reserve(pg, d1, 0, 8), "reserve n_seqs 0", IKV_E_INVALID);
      BOTH(ikv_pool_reserve(pc, d0, 2, 8), ikv_pool_reserve(pg, d1, 2, 8), "reserve a sequence listed twice", IKV_E_INVALID);
      BOTH(ikv_pool_reserve(pc, &bogus, 1, 8), ikv_pool_reserve(pg, &bogus, 1, 8), "reserve unknown sequence", IKV_E_NOT_FOUND); }
    {
        float *kb = calloc(64 * row, 4), *vb = calloc(64 * row, 4), mn[64]; uint32_t nt;
        BOTH(ikv_seq_read(pc, A[0], 0, 0, 41, kb, vb), ikv_seq_read(pg, A[1], 0, 0, 41, kb, vb), "seq_read end > length", IKV_E_RANGE);
        BOTH(ikv_seq_read(pc, A[0], 0, 20, 10, kb, vb), ikv_seq_read(pg, A[1], 0, 20, 10, kb, vb), "seq_read begin > end", IKV_E_RANGE);
        BOTH(ikv_seq_read(pc, A[0], 2, 0, 4, kb, vb), ikv_seq_read(pg, A[1], 2, 0, 4, kb, vb), "seq_read layer out of range", IKV_E_RANGE);
        BOTH(ikv_seq_read(pc, B[0], 0, 10, 20, kb, vb), ikv_seq_read(pg, B[1], 0, 10, 20, kb, vb), "seq_read into an evicted page", IKV_E_EVICTED);
        BOTH(ikv_seq_page_summary(pc, A[0], 2, 0, 0, mn, NULL, NULL, &nt), ikv_seq_page_summary(pg, A[1], 2, 0, 0, mn, NULL, NULL, &nt), "page_summary layer out of range", IKV_E_RANGE);
        BOTH(ikv_seq_page_summary(pc, A[0], 0, 2, 0, mn, NULL, NULL, &nt), ikv_seq_page_summary(pg, A[1], 0, 2, 0, mn, NULL, NULL, &nt), "page_summary kv_head out of range", IKV_E_RANGE);
        BOTH(ikv_seq_page_summary(pc, A[0], 0, 0, 3, mn, NULL, NULL, &nt), ikv_seq_page_summary(pg, A[1], 0, 0, 3, mn, NULL, NULL, &nt), "page_summary page beyond the tokens", IKV_E_RANGE);
        BOTH(ikv_seq_page_summary(pc, B[0], 0, 0, 1, mn, NULL, NULL, &nt), ikv_seq_page_summary(pg, B[1], 0, 0, 1, mn, NULL, NULL, &nt), "page_summary evicted page", IKV_E_EVICTED);
        BOTH(ikv_seq_page_summary(pc, C[0], 1, 0, 1, mn, NULL, NULL, &nt), ikv_seq_page_summary(pg, C[1], 1, 0, 1, mn, NULL, NULL, &nt), "page_summary page with no token of the layer (C layer 1 page 1 holds 4 tokens: valid)", IKV_OK);
        int t0 = -1, t1 = -1;
        BOTH(ikv_seq_page_tier(pc, A[0], 0, &t0), ikv_seq_page_tier(pg, A[1], 0, &t1), "page_tier of a device page", IKV_OK);
        if (t0 != 0 || t1 != 0) BREAK("page_tier: CPU %d, CUDA (no host tier) %d; both must be 0", t0, t1);
        BOTH(ikv_seq_page_tier(pc, A[0], 9, &t0), ikv_seq_page_tier(pg, A[1], 9, &t1), "page_tier page beyond the sequence", IKV_E_RANGE);
        uint32_t mv = 77;
        BOTH(ikv_seq_offload(pc, A[0], 0, 32, NULL, &mv), ikv_seq_offload(pg, A[1], 0, 32, NULL, &mv), "offload without a host tier", IKV_E_UNSUPPORTED);
        ikv_tier_policy tp; memset(&tp, 0, sizeof tp); tp.struct_size = sizeof tp;
        BOTH(ikv_pool_set_tier_policy(pc, &tp), ikv_pool_set_tier_policy(pg, &tp), "set_tier_policy without a host tier", IKV_E_UNSUPPORTED);
        BOTH(ikv_pool_tier_step(pc, NULL, NULL, 0, NULL, NULL), ikv_pool_tier_step(pg, NULL, NULL, 0, NULL, NULL), "tier_step without a host tier", IKV_E_UNSUPPORTED);
        free(kb); free(vb);
    }
    /* ---- state unchanged, and equal on both ---- */
    snap after[2];
    { ikv_seq_id sq[3]; for (int b = 0; b < 2; ++b) { sq[0] = A[b]; sq[1] = B[b]; sq[2] = C[b]; take(&after[b], pools[b], sq, 3); } }
    if (!same_snap(&before[0], &after[0], 3)) BREAK("the CPU pool changed under refused calls");
    if (!same_snap(&before[1], &after[1], 3)) BREAK("the CUDA pool changed under refused calls");
    if (!same_snap(&after[0], &after[1], 3)) BREAK("CPU and CUDA pools differ after the same calls");
    ikv_decoder_stats s1, s2; memset(&s1, 0, sizeof s1); memset(&s2, 0, sizeof s2); s1.struct_size = s2.struct_size = sizeof s1;
    IK(ikv_decoder_get_stats(dc, &s1)); IK(ikv_decoder_get_stats(dg, &s2));
    if (s1.steps != 1 || s2.steps != 1) BREAK("decoder steps after one valid and many refused decodes: CPU %llu CUDA %llu (want 1)", (unsigned long long)s1.steps, (unsigned long long)s2.steps);
    if (!g_break) OKMSG("%d refused calls: same status on both backends, nothing written, state unchanged and equal", n_checked);
    return probe_exit();
}
