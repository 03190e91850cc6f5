/*
 * Header (ikv_pool_reserve, rules while a CUDA sequence has room): "one that
 * would pass the room writes nothing and is reported by ikv_pool_sync
 * (IKV_E_RANGE), or by the call itself (IKV_E_RANGE) when the host already
 * knows it would or the append is synchronous".
 * The code once broke it (fixed since; this checks it stays fixed): src/pool/pool_reserve.cpp room_append_run: after a synchronous room
 * append it calls take_room_lengths, which records the overrun only
 * "if (!pool->room_report.found)"; the call then returns IKV_E_RANGE only if
 * pool->room_report names one of ITS sequences. When an earlier incident of
 * another sequence is pending (taken by ikv_pool_reserve, which never
 * reports), the synchronous append that wrote nothing returns IKV_OK and its
 * own incident is dropped for good.
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


static ikv_status scenario(int with_pending_incident, uint32_t *len_out) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *dk = dev_floats(8 * 32, 51), *dv = dev_floats(8 * 32, 52);
    ikv_pool *pool = small_cuda_pool(1, 8, 64ull << 20, 0);
    ikv_seq_id a, b;
    IK(ikv_seq_create(pool, &a));
    IK(ikv_seq_create(pool, &b));
    if (with_pending_incident) {
        IK(dev_append(pool, a, 0, 1, dk, dv, NULL, 0));
        IK(ikv_pool_reserve(pool, &a, 1, 1));
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));  /* a passes its room on the device */
        CK(cudaStreamSynchronize(s));
        IK(ikv_pool_reserve(pool, &a, 1, 4));         /* takes a's lengths and its incident, reports nothing */
    }
    IK(dev_append(pool, b, 0, 1, dk, dv, NULL, 0));
    IK(ikv_pool_reserve(pool, &b, 1, 1));             /* b's room ends at 2 */
    IK(dev_append(pool, b, 0, 1, dk, dv, s, 1));      /* device length 2; the host still counts 1 */
    CK(cudaStreamSynchronize(s));
    /* Synchronous append: the host thinks 1 + 1 <= 2; the device has no room left. */
    const ikv_status st = dev_append(pool, b, 0, 1, dk, dv, s, 0);
    printf("info: %s pending incident: the synchronous append returned %s%s%s\n",
           with_pending_incident ? "with a" : "without a", ikv_status_name(st), st ? ": " : "",
           st ? ikv_last_error() : "");
    IK(ikv_seq_length(pool, b, len_out));
    /* Drain whatever is left. */
    for (int i = 0; i < 3; ++i) {
        ikv_status ss = ikv_pool_sync(pool);
        printf("info:   ikv_pool_sync #%d -> %s%s%s\n", i + 1, ikv_status_name(ss), ss ? ": " : "",
               ss ? ikv_last_error() : "");
    }
    ikv_pool_destroy(pool);
    cudaFree(dk);
    cudaFree(dv);
    cudaStreamDestroy(s);
    return st;
}

int main(void) {
    require_gpu();
    uint32_t len = 0;
    ikv_status st = scenario(0, &len);
    if (st == IKV_E_RANGE)
        OKMSG("control: a synchronous append past the room returns IKV_E_RANGE (length %u)", len);
    else
        BREAK("control: the synchronous append past the room returned %s (length %u)", ikv_status_name(st), len);
    st = scenario(1, &len);
    if (st == IKV_E_RANGE)
        OKMSG("with another sequence's incident pending: IKV_E_RANGE as well");
    else if (st == IKV_OK)
        BREAK("a synchronous append to a sequence with room that wrote nothing (its room was full on the device; "
              "length stays %u) returned IKV_OK because another sequence's overrun was pending; the header says the "
              "call itself reports IKV_E_RANGE", len);
    else
        BREAK("the synchronous append returned %s", ikv_status_name(st));
    return probe_exit();
}
