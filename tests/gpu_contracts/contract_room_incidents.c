/*
 * Header (ikv_pool_sync): "An append to such a sequence that would have
 * passed its room wrote nothing ...: reported here as IKV_E_RANGE naming the
 * sequence and layer, and the replay of a graph captured with a room that
 * has since been replaced or ended (or whose sequence was destroyed) as
 * IKV_E_STATE. The first incident found is reported and every one found is
 * cleared (the non-finite report takes precedence)."
 * The code once broke it (fixed since; this checks it stays fixed):
 *  (a) src/pool/pool_append.cpp pool_sync calls take_room_reports(pool,
 *      !bad.found): with a non-finite report, the room incident is moved into
 *      pool->room_report but not cleared (take_room_reports returns before
 *      the reset), so the NEXT ikv_pool_sync reports it again.
 *  (b) src/cuda/device_rooms.cpp retire()/collect()/take_retired(): an
 *      overrun recorded by an eager async append on a room that then ends
 *      (ikv_seq_destroy) is reported as stale_read -> IKV_E_STATE ("a graph
 *      ... was replayed"), although no graph exists: it is an overrun
 *      (IKV_E_RANGE).
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


int main(void) {
    require_gpu();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *dk = dev_floats(8 * 32, 41), *dv = dev_floats(8 * 32, 42);
    float nan_row[32];
    for (int i = 0; i < 32; ++i) nan_row[i] = 0.5f;
    nan_row[3] = __builtin_nanf("");
    float *dnan;
    CK(cudaMalloc((void **)&dnan, sizeof nan_row));
    CK(cudaMemcpy(dnan, nan_row, sizeof nan_row, cudaMemcpyHostToDevice));

    /* (a) non-finite + overrun in one sync window. */
    {
        ikv_pool *pool = small_cuda_pool(1, 8, 64ull << 20, 0);
        ikv_seq_id a, b;
        IK(ikv_seq_create(pool, &a));
        IK(ikv_seq_create(pool, &b));
        IK(dev_append(pool, a, 0, 1, dk, dv, NULL, 0));
        IK(dev_append(pool, b, 0, 1, dk, dv, NULL, 0));
        IK(ikv_pool_reserve(pool, &a, 1, 1));          /* room ends at 2 */
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));   /* fills the room (device length 2) */
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));   /* passes it: the device writes nothing, records it */
        IK(dev_append(pool, b, 0, 1, dnan, dv, s, 1)); /* b has no room: the NaN is stored as 0, recorded */
        CK(cudaStreamSynchronize(s));
        ikv_status s1 = ikv_pool_sync(pool);
        char m1[400];
        snprintf(m1, sizeof m1, "%s", ikv_last_error());
        ikv_status s2 = ikv_pool_sync(pool);
        char m2[400];
        snprintf(m2, sizeof m2, "%s", ikv_last_error());
        if (s1 == IKV_E_INVALID)
            OKMSG("first ikv_pool_sync reports the non-finite input first (IKV_E_INVALID)");
        else
            BREAK("first ikv_pool_sync returned %s: %s", ikv_status_name(s1), m1);
        if (s2 == IKV_OK)
            OKMSG("second ikv_pool_sync: nothing left (every incident found was cleared)");
        else
            BREAK("the second ikv_pool_sync, with no new append, returned %s (\"%s\"): the overrun found by the "
                  "first sync was not cleared", ikv_status_name(s2), s2 == IKV_OK ? "" : m2);
        ikv_pool_destroy(pool);
    }
    /* (b) an eager overrun, then the sequence is destroyed. */
    {
        ikv_pool *pool = small_cuda_pool(1, 8, 64ull << 20, 0);
        ikv_seq_id a;
        IK(ikv_seq_create(pool, &a));
        IK(dev_append(pool, a, 0, 1, dk, dv, NULL, 0));
        IK(ikv_pool_reserve(pool, &a, 1, 1));
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));
        IK(dev_append(pool, a, 0, 1, dk, dv, s, 1));  /* overrun */
        CK(cudaStreamSynchronize(s));
        IK(ikv_seq_destroy(pool, a));
        ikv_status s1 = ikv_pool_sync(pool);
        char m1[400];
        snprintf(m1, sizeof m1, "%s", ikv_last_error());
        if (s1 == IKV_E_RANGE)
            OKMSG("the overrun of a destroyed sequence is reported as IKV_E_RANGE");
        else if (s1 == IKV_E_STATE)
            BREAK("an eager async append that passed its room (no graph involved), followed by ikv_seq_destroy, is "
                  "reported by ikv_pool_sync as IKV_E_STATE (\"%s\"), the status the header reserves for replays "
                  "of graphs with an ended room; an overrun is IKV_E_RANGE", m1);
        else if (s1 == IKV_OK)
            BREAK("an async append that passed its room, followed by ikv_seq_destroy, was never reported by "
                  "ikv_pool_sync (IKV_OK)");
        else
            BREAK("ikv_pool_sync returned %s: %s", ikv_status_name(s1), m1);
        ikv_pool_destroy(pool);
    }
    return probe_exit();
}
