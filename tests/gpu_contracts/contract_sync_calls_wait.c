/*
 * Header (intentkv.h:683-684, IKV_APPEND_ASYNC): "The pool's synchronous
 * calls (reads, truncate, fork, format changes, appends without this flag)
 * first wait for its asynchronous appends."
 * The code once broke it (fixed since; this checks it stays fixed): src/pool/pool_edit.cpp seq_truncate makes no store call when the new
 * length is page aligned (keep == 0), and src/pool/pool.cpp seq_fork only
 * waits inside stage_copy, i.e. only when the parent has a partial tail page.
 * Neither waits for a pending IKV_APPEND_ASYNC append then.
 * Method: a host function blocks the engine stream; an async append is
 * enqueued behind it; the call under test must not return before the stream
 * is released (a watchdog releases it after 1.5 s).
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


typedef ikv_status (*op_fn)(ikv_pool *, ikv_seq_id, void *);

static ikv_status op_truncate_aligned(ikv_pool *p, ikv_seq_id s, void *u) { (void)u; return ikv_seq_truncate(p, s, 8); }
static ikv_status op_truncate_partial(ikv_pool *p, ikv_seq_id s, void *u) { (void)u; return ikv_seq_truncate(p, s, 3); }
static ikv_status op_fork(ikv_pool *p, ikv_seq_id s, void *u) { return ikv_seq_fork(p, s, (ikv_seq_id *)u); }
static ikv_status op_read(ikv_pool *p, ikv_seq_id s, void *u) {
    return ikv_seq_read(p, s, 0, 0, 8, (float *)u, (float *)u + 8 * 32);
}

/* Returns 1 if the call waited for the async append, 0 if not, -1 if inconclusive. */
static int round_trip(ikv_pool *pool, ikv_seq_id seq, cudaStream_t s, const float *dk, const float *dv, op_fn op,
                      void *user, const char *name, int expect_break_if_nowait) {
    block_stream(s);
    const double t0 = now_s();
    ikv_status st = dev_append(pool, seq, 0, 8, dk, dv, s, 1);
    const double t_app = now_s() - t0;
    if (st != IKV_OK) {
        atomic_store(&g_release, 1);
        cudaStreamSynchronize(s);
        BREAK("%s: the async append failed: %s: %s", name, ikv_status_name(st), ikv_last_error());
        return -1;
    }
    if (t_app > 0.5) INCONCL("%s: the async append itself took %.3f s (blocked)", name, t_app);
    pthread_t w = start_watchdog(1500);
    const double t1 = now_s();
    st = op(pool, seq, user);
    const double t_op = now_s() - t1;
    const int released_before_return = atomic_load(&g_release);
    pthread_join(w, NULL);
    CK(cudaStreamSynchronize(s));
    if (st != IKV_OK) {
        BREAK("%s returned %s: %s", name, ikv_status_name(st), ikv_last_error());
        return -1;
    }
    if (!released_before_return) {
        if (expect_break_if_nowait)
            BREAK("%s returned after %.3f s while an IKV_APPEND_ASYNC append to the pool was still pending on its "
                  "stream (it did not wait, although the header says truncate/fork/reads wait for async appends)",
                  name, t_op);
        else
            BREAK("%s did not wait for the pending async append (%.3f s)", name, t_op);
        return 0;
    }
    OKMSG("%s waited for the pending async append (returned after %.3f s, once the stream was released)", name, t_op);
    return 1;
}

int main(void) {
    require_gpu();
    ikv_pool *pool = small_cuda_pool(1, 8, 64ull << 20, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *dk = dev_floats(64 * 32, 1), *dv = dev_floats(64 * 32, 2);
    ikv_seq_id a, b, c, d, child = 0;
    IK(ikv_seq_create(pool, &a));
    IK(ikv_seq_create(pool, &b));
    IK(ikv_seq_create(pool, &c));
    IK(ikv_seq_create(pool, &d));
    ikv_seq_id all[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) IK(dev_append(pool, all[i], 0, 16, dk, dv, NULL, 0));  /* two whole pages each */
    /* Warm-up: one async append and a sync, so that every buffer exists. */
    IK(dev_append(pool, d, 0, 8, dk, dv, s, 1));
    IK(ikv_pool_sync(pool));
    CK(cudaDeviceSynchronize());

    float *host = (float *)malloc(2 * 8 * 32 * sizeof(float));
    /* Control: a read must wait (it does: read_rows -> wait_async). */
    round_trip(pool, c, s, dk, dv, op_read, host, "ikv_seq_read (control)", 1);
    /* Control: a truncate that leaves a partial tail re-stages through the store and waits. */
    round_trip(pool, d, s, dk, dv, op_truncate_partial, NULL, "ikv_seq_truncate to a partial tail (control)", 1);
    /* Suspected: a truncate to a page boundary never reaches the store. */
    round_trip(pool, a, s, dk, dv, op_truncate_aligned, NULL, "ikv_seq_truncate to a page boundary", 1);
    /* Suspected: a fork of a sequence whose tail page is full copies no staging. */
    round_trip(pool, b, s, dk, dv, op_fork, &child, "ikv_seq_fork of a sequence with a full tail page", 1);

    IK(ikv_pool_sync(pool));
    ikv_pool_destroy(pool);
    cudaFree(dk);
    cudaFree(dv);
    free(host);
    return probe_exit();
}
