/*
 * Header (intentkv.h, ikv_decode "CUDA pools: q, out, lse are device
 * pointers; the call enqueues on stream and returns without synchronizing"
 * and "CUDA graphs: a call on a capturing stream is captured whole ... their
 * upload becomes a copy node reading the decoder's pinned staging at replay
 * time ... eager calls afterwards work as before").
 * The code once broke it (fixed since; this checks it stays fixed): src/cuda/cuda_decode.cpp build_lists: "if (s.copied_valid[half] &&
 * !capturing) cudaEventSynchronize(s.copied[half])" -- a captured call
 * writes the pinned staging half without waiting for the eager copy that
 * last read it, so an eager decode enqueued two calls earlier whose upload
 * has not run yet reads the captured call's lists.
 * Method: block stream S with a host function; eager decode #1 (sequence A)
 * and #2 (sequence C) on S; capture decode #3 (sequence B) on S (one stream,
 * as the header asks of a decoder's calls); release S.
 * #1's output must equal a later eager decode of A.
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


int main(void) {
    require_gpu();
    ikv_pool *pool = small_cuda_pool(1, 16, 64ull << 20, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ikv_seq_id A, B, C;
    IK(ikv_seq_create(pool, &A));
    IK(ikv_seq_create(pool, &B));
    IK(ikv_seq_create(pool, &C));
    float *ka = dev_floats(64 * 32, 11), *va = dev_floats(64 * 32, 12);
    float *kb = dev_floats(64 * 32, 21), *vb = dev_floats(64 * 32, 22);
    float *kc = dev_floats(64 * 32, 31), *vc = dev_floats(64 * 32, 32);
    IK(dev_append(pool, A, 0, 64, ka, va, NULL, 0));
    IK(dev_append(pool, B, 0, 64, kb, vb, NULL, 0));
    IK(dev_append(pool, C, 0, 64, kc, vc, NULL, 0));
    float *q = dev_floats(32, 99);
    float *out1, *out2, *out3, *refA, *refB;
    CK(cudaMalloc((void **)&out1, 32 * 4));
    CK(cudaMalloc((void **)&out2, 32 * 4));
    CK(cudaMalloc((void **)&out3, 32 * 4));
    CK(cudaMalloc((void **)&refA, 32 * 4));
    CK(cudaMalloc((void **)&refB, 32 * 4));
    CK(cudaMemset(out1, 0, 32 * 4));
    ikv_decoder *dec = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    IK(ikv_decoder_create(&dc, &dec));
    /* Warm-up: every buffer sized (same sizes for A, B, C), both staging halves used. */
    IK(decode1(dec, pool, &A, q, out3, s));
    IK(decode1(dec, pool, &B, q, out3, s));
    IK(decode1(dec, pool, &C, q, out3, s));
    CK(cudaDeviceSynchronize());

    block_stream(s);
    pthread_t w = start_watchdog(5000);
    ikv_status st1 = decode1(dec, pool, &A, q, out1, s);  /* eager: its upload waits behind the blocker */
    ikv_status st2 = decode1(dec, pool, &C, q, out2, s);  /* eager: the other staging half */
    cudaGraph_t graph = NULL;
    ikv_status st3 = IKV_E_INTERNAL;
    cudaError_t cb = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    if (cb == cudaSuccess) {
        st3 = decode1(dec, pool, &B, q, out3, s);  /* captured: refills the first half */
        cudaError_t ce = cudaStreamEndCapture(s, &graph);
        if (ce != cudaSuccess) cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
    } else {
        cudaGetLastError();
    }
    const int blocked = atomic_load(&g_watch_fired);
    atomic_store(&g_release, 1);
    pthread_join(w, NULL);
    CK(cudaStreamSynchronize(s));
    CK(cudaDeviceSynchronize());
    if (st1 != IKV_OK || st2 != IKV_OK || st3 != IKV_OK || cb != cudaSuccess) {
        BREAK("decodes: %s %s %s (capture begin %s): %s", ikv_status_name(st1), ikv_status_name(st2),
                ikv_status_name(st3), cudaGetErrorString(cb), ikv_last_error());
        return probe_exit();
    }
    if (blocked) BREAK("a decode call blocked on the stalled stream (the watchdog released it)");

    IK(decode1(dec, pool, &A, q, refA, s));
    CK(cudaStreamSynchronize(s));
    IK(decode1(dec, pool, &B, q, refB, s));
    CK(cudaStreamSynchronize(s));
    float h1[32], ha[32], hb[32];
    CK(cudaMemcpy(h1, out1, sizeof h1, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ha, refA, sizeof ha, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, refB, sizeof hb, cudaMemcpyDeviceToHost));
    if (memcmp(h1, ha, sizeof h1) != 0) {
        BREAK("an eager ikv_decode of sequence A, enqueued before a captured ikv_decode of sequence B on the same "
              "decoder, produced %s (out[0] %g, A's is %g, B's is %g): the capture overwrote the pinned page-list "
              "staging the eager call's pending upload reads",
              memcmp(h1, hb, sizeof h1) == 0 ? "B's output" : "a wrong output", h1[0], ha[0], hb[0]);
    } else {
        OKMSG("the eager decode enqueued before the capture produced its own output");
    }
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
    return probe_exit();
}
