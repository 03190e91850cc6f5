/*
 * Header (intentkv.h, ikv_page_feedback, CUDA pools): a decode with feedback
 * enqueues the copy of its shares and returns without waiting for it; up to
 * 8 decodes' copies are in flight, a 9th decode waits for the oldest; a
 * decode with the top-k prior waits for the earlier decodes of its own layer
 * only; _get, _forget and _destroy wait for every copy in flight, and what
 * they see holds every decode before them.
 * Method: a host function blocks the decodes' stream, so no copy can finish
 * until it is released; a watchdog releases it after 1.5 s. A call that must
 * not wait returns while the stream is still blocked; a call that must wait
 * returns only after the release. The averages are compared with a second
 * feedback fed the same decodes with the stream synchronized after each.
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"

enum { kLen = 128, kD = 32 };

static ikv_status fb_decode(ikv_decoder *dec, ikv_pool *pool, ikv_seq_id *seq, uint32_t layer, const float *q,
                            float *out, cudaStream_t s, ikv_page_feedback *fb, float prior) {
    ikv_decode_args d = step1_args(seq, q, out, s);
    d.layer = layer;
    d.feedback = fb;
    if (prior > 0.0f) d.topk_token_budget = 48, d.topk_feedback_weight = prior;
    return ikv_decode(dec, pool, &d);
}

/* The step a case runs: which decoder, layer and prior. */
typedef struct {
    ikv_decoder *dec;
    uint32_t layer;
    float prior;
} step;

static ikv_pool *g_pool;
static ikv_seq_id g_seq;
static float *g_q, *g_out;

/* The reference: the same steps on fb with the stream synchronized after each. */
static void reference_steps(ikv_page_feedback *fb, const step *st, int n, cudaStream_t s) {
    for (int i = 0; i < n; ++i) {
        IK(fb_decode(st[i].dec, g_pool, &g_seq, st[i].layer, g_q, g_out, s, fb, st[i].prior));
        CK(cudaStreamSynchronize(s));
    }
}

static void expect_same(ikv_page_feedback *a, ikv_page_feedback *b, const char *name) {
    for (uint32_t l = 0; l < 2; ++l) {
        float ma[kLen / 16], mb[kLen / 16];
        uint32_t na = 0, nb = 0;
        IK(ikv_page_feedback_get(a, g_seq, l, 0, ma, kLen / 16, &na));
        IK(ikv_page_feedback_get(b, g_seq, l, 0, mb, kLen / 16, &nb));
        if (na != nb || memcmp(ma, mb, sizeof ma) != 0) {
            BREAK("%s: layer %u averages differ from the synchronized reference's (%u vs %u pages fed back)", name, l,
                  na, nb);
            return;
        }
    }
    OKMSG("%s: averages equal the synchronized reference's", name);
}

/* Runs st[0..n) on the blocked stream; want_wait[i]: whether step i must wait for the release. */
static void blocked_steps(ikv_page_feedback *fb, const step *st, int n, const int *want_wait, cudaStream_t s,
                          const char *name) {
    block_stream(s);
    pthread_t w = start_watchdog(1500);
    for (int i = 0; i < n; ++i) {
        const int before = atomic_load(&g_release);
        const ikv_status r = fb_decode(st[i].dec, g_pool, &g_seq, st[i].layer, g_q, g_out, s, fb, st[i].prior);
        const int after = atomic_load(&g_release);
        if (r != IKV_OK) BREAK("%s: decode %d returned %s: %s", name, i, ikv_status_name(r), ikv_last_error());
        else if (!before && want_wait[i] && !after) BREAK("%s: decode %d returned without waiting for the copy it must wait for", name, i);
        else if (!before && !want_wait[i] && after) BREAK("%s: decode %d waited for the stream (it must only enqueue)", name, i);
    }
    pthread_join(w, NULL);
    CK(cudaStreamSynchronize(s));
}

int main(void) {
    require_gpu();
    g_pool = small_cuda_pool(2, 16, 64ull << 20, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *dk = dev_floats(kLen * kD, 11), *dv = dev_floats(kLen * kD, 12);
    IK(ikv_seq_create(g_pool, &g_seq));
    IK(dev_append(g_pool, g_seq, 0, kLen, dk, dv, NULL, 0));
    IK(dev_append(g_pool, g_seq, 1, kLen, dk, dv, NULL, 0));
    g_q = dev_floats(kD, 13);
    CK(cudaMalloc((void **)&g_out, kD * sizeof(float)));
    ikv_decoder *dense = NULL, *prior = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    IK(ikv_decoder_create(&dc, &dense));
    IK(ikv_decoder_create(&dc, &prior));
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    ikv_page_feedback *fb = NULL, *ref = NULL;
    IK(ikv_page_feedback_create(g_pool, &fc, &fb));
    IK(ikv_page_feedback_create(g_pool, &fc, &ref));
    /* Warm-up: each decoder's call once (its lists, then reused: no list upload waits below). */
    ikv_page_feedback *warm = NULL;
    IK(ikv_page_feedback_create(g_pool, &fc, &warm));
    IK(fb_decode(dense, g_pool, &g_seq, 0, g_q, g_out, s, warm, 0.0f));
    IK(fb_decode(prior, g_pool, &g_seq, 1, g_q, g_out, s, warm, 0.5f));
    IK(fb_decode(prior, g_pool, &g_seq, 0, g_q, g_out, s, warm, 0.5f));
    CK(cudaStreamSynchronize(s));
    ikv_page_feedback_destroy(warm);

    /* 1. A decode returns before its copy; a layer-1 prior decode does not wait for layer 0's copy; _get waits. */
    {
        const step st[2] = {{dense, 0, 0.0f}, {prior, 1, 0.5f}};
        const int ww[2] = {0, 0};
        block_stream(s);
        pthread_t w = start_watchdog(1500);
        int bad = 0;
        for (int i = 0; i < 2; ++i) {
            const ikv_status r = fb_decode(st[i].dec, g_pool, &g_seq, st[i].layer, g_q, g_out, s, fb, st[i].prior);
            if (r != IKV_OK) { BREAK("case 1: decode %d returned %s: %s", i, ikv_status_name(r), ikv_last_error()); bad = 1; }
            else if (atomic_load(&g_release) && !ww[i]) { BREAK("case 1: decode %d waited for the stream", i); bad = 1; }
        }
        float m[kLen / 16];
        uint32_t n = 0;
        const ikv_status r = ikv_page_feedback_get(fb, g_seq, 0, 0, m, kLen / 16, &n);
        if (r != IKV_OK) { BREAK("case 1: _get returned %s: %s", ikv_status_name(r), ikv_last_error()); bad = 1; }
        else if (!atomic_load(&g_release)) { BREAK("case 1: _get returned before the copy of the decode's shares could finish"); bad = 1; }
        pthread_join(w, NULL);
        CK(cudaStreamSynchronize(s));
        if (!bad) OKMSG("case 1: decodes returned at once (one with the prior of another layer); _get waited for their copies");
        reference_steps(ref, st, 2, s);
        expect_same(fb, ref, "case 1");
    }
    /* 2. A prior decode waits for an earlier decode of its own layer. */
    {
        const step st[2] = {{dense, 0, 0.0f}, {prior, 0, 0.5f}};
        const int ww[2] = {0, 1};
        blocked_steps(fb, st, 2, ww, s, "case 2");
        reference_steps(ref, st, 2, s);
        expect_same(fb, ref, "case 2");
    }
    /* 3. Eight decodes' copies in flight; the ninth waits for the oldest. */
    {
        step st[9];
        int ww[9];
        for (int i = 0; i < 9; ++i) st[i] = (step){dense, 0, 0.0f}, ww[i] = i == 8;
        blocked_steps(fb, st, 9, ww, s, "case 3");
        reference_steps(ref, st, 9, s);
        expect_same(fb, ref, "case 3");
    }
    /* 4. _forget waits, and forgets the shares in flight too. */
    {
        block_stream(s);
        pthread_t w = start_watchdog(1500);
        IK(fb_decode(dense, g_pool, &g_seq, 0, g_q, g_out, s, fb, 0.0f));
        const ikv_status r = ikv_page_feedback_forget(fb, g_seq);
        const int released = atomic_load(&g_release);
        pthread_join(w, NULL);
        CK(cudaStreamSynchronize(s));
        uint32_t n = 99;
        IK(ikv_page_feedback_get(fb, g_seq, 0, 0, NULL, 0, &n));
        if (r != IKV_OK) BREAK("case 4: _forget returned %s", ikv_status_name(r));
        else if (!released) BREAK("case 4: _forget returned before the copy in flight could finish");
        else if (n != 0) BREAK("case 4: after _forget, %u pages fed back (the shares in flight came back after it)", n);
        else OKMSG("case 4: _forget waited and forgot the shares in flight");
    }
    /* 5. _destroy waits for the copy in flight (its pinned memory is freed after). */
    {
        block_stream(s);
        pthread_t w = start_watchdog(1500);
        IK(fb_decode(dense, g_pool, &g_seq, 0, g_q, g_out, s, fb, 0.0f));
        ikv_page_feedback_destroy(fb);
        const int released = atomic_load(&g_release);
        pthread_join(w, NULL);
        CK(cudaStreamSynchronize(s));
        if (!released) BREAK("case 5: _destroy returned before the copy in flight could finish (it frees the memory the copy writes)");
        else OKMSG("case 5: _destroy waited for the copy in flight");
    }
    ikv_page_feedback_destroy(ref);
    ikv_decoder_destroy(dense);
    ikv_decoder_destroy(prior);
    ikv_pool_destroy(g_pool);
    return probe_exit();
}
