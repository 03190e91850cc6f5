/*
 * Header (intentkv.h:716, ikv_pool_append): "Atomic: on error nothing was
 * written and no page was allocated." and (intentkv.h:81) IKV_E_NOMEM is
 * "pool capacity exhausted or host/device allocation failed".
 * The code once broke it (fixed since; this checks it stays fixed): src/pool/pool_append.cpp seqs_append commits the block table
 * (commit_pages_locked) before PageStore::write_append and then commits the
 * lengths whatever write_append returned ("lengths are still committed").
 * src/cuda/cuda_page_store.cpp write_append allocates after that point
 * (ensure_scratch's cudaMalloc for the whole pages of a bulk append,
 * ensure_input for host input, JobRing slots) and turns a failed cudaMalloc
 * into IKV_E_DEVICE (cuda_fail), not IKV_E_NOMEM.
 * Method: one 8-token append (no scratch needed), then fill the GPU's free
 * memory with cudaMalloc, then append 320 tokens (39 whole pages -> scratch
 * stages needed). The pages come from the existing slab and the staging
 * free list, so only the scratch allocation can fail.
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


#define MAX_FILL 65536
static void *fill[MAX_FILL];
static int n_fill = 0;

static void fill_device(void) {
    for (size_t sz = 1ull << 30; sz >= 256; sz /= 2) {
        while (n_fill < MAX_FILL) {
            void *p = NULL;
            if (cudaMalloc(&p, sz) != cudaSuccess) {
                cudaGetLastError();
                break;
            }
            fill[n_fill++] = p;
        }
    }
}
static void unfill_device(void) {
    for (int i = 0; i < n_fill; ++i) cudaFree(fill[i]);
    n_fill = 0;
}

int main(void) {
    require_gpu();
    ikv_pool *pool = small_cuda_pool(1, 8, 64ull << 20, 0);
    float *dk = dev_floats(328 * 32, 5), *dv = dev_floats(328 * 32, 6);
    ikv_seq_id a;
    IK(ikv_seq_create(pool, &a));
    IK(dev_append(pool, a, 0, 8, dk, dv, NULL, 0));
    CK(cudaDeviceSynchronize());

    ikv_pool_stats before;
    memset(&before, 0, sizeof before);
    before.struct_size = sizeof before;
    IK(ikv_pool_get_stats(pool, &before));
    const uint64_t page = ikv_pool_page_bytes(pool, IKV_FMT_F16);
    if (page == 0 || before.reserved_bytes / page < 41) {
        INCONCL("the slab holds %llu pages; 41 needed for this probe",
                (unsigned long long)(page ? before.reserved_bytes / page : 0));
        return probe_exit();
    }
    uint32_t len0 = 0;
    IK(ikv_seq_length(pool, a, &len0));

    fill_device();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("info: filled the device with %d allocations; %zu bytes free\n", n_fill, free_b);
    const ikv_status st = dev_append(pool, a, 0, 320, dk + 8 * 32, dv + 8 * 32, NULL, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ikv_last_error());
    unfill_device();
    cudaGetLastError();

    ikv_pool_stats after;
    memset(&after, 0, sizeof after);
    after.struct_size = sizeof after;
    IK(ikv_pool_get_stats(pool, &after));
    uint32_t len1 = 0;
    IK(ikv_seq_length(pool, a, &len1));
    if (st == IKV_OK) {
        INCONCL("the append succeeded although device memory was filled (nothing to observe)");
    } else {
        printf("info: the append returned %s: %s\n", ikv_status_name(st), msg);
        if (len1 != len0 || after.pages_used != before.pages_used || after.used_bytes != before.used_bytes ||
            after.tokens_total != before.tokens_total)
            BREAK("a failed ikv_pool_append (%s) changed the sequence: length %u -> %u, pages_used %llu -> %llu, "
                  "used_bytes %llu -> %llu (header: on error nothing was written and no page was allocated)",
                  ikv_status_name(st), len0, len1, (unsigned long long)before.pages_used,
                  (unsigned long long)after.pages_used, (unsigned long long)before.used_bytes,
                  (unsigned long long)after.used_bytes);
        else
            OKMSG("the failed append left the sequence and the pool as they were");
        if (st == IKV_E_DEVICE && (strstr(msg, "cudaErrorMemoryAllocation") || strstr(msg, "out of memory")))
            BREAK("a device allocation failure was reported as IKV_E_DEVICE, not IKV_E_NOMEM (\"host/device "
                  "allocation failed\")");
        else if (st == IKV_E_NOMEM)
            OKMSG("the allocation failure was reported as IKV_E_NOMEM");
    }
    ikv_pool_destroy(pool);
    cudaFree(dk);
    cudaFree(dv);
    return probe_exit();
}
