// A decode's page lists for sequences with room reserved ahead
// (ikv_pool_reserve): the host lists each such sequence up to the room's end,
// since the true length is known only to the device when the kernels run (a
// captured step's appends advance it at every replay). Before the decode this
// kernel takes the layer's device length and rewrites the list's last entries
// from their full copies, clipped to it, with the list's count and the
// sequence's length, so every later kernel (top-k scoring, decode, the
// multi-token path, feedback) sees exactly the lists an eager call at that
// length builds on the host. With `restore` it writes the room's entries back
// as the host listed them, to the room's end: what a decode that appends its
// token reads (FusedAppend), where a clip may have cut them.
#include <cuda_runtime.h>

#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "room_lists.cuh"

namespace ikv {
namespace cuda {
namespace {

// One block per sequence with room; its threads take the entries in parallel
// (a single thread walking them waited a load round trip per entry: 19 us of
// every layer at B = 1, 32K, with a 1300-token room on the H200).
constexpr uint32_t kClipThreads = 128;

__global__ void __launch_bounds__(kClipThreads) room_clip_kernel(const RoomTail *tails, const DevPage *full,
                                                                 DevPage *pages, uint32_t stride, uint32_t *counts,
                                                                 uint32_t *seq_len, uint32_t layer, bool restore) {
    pdl_wait();  // the lengths come from the step's appends (kernels/launch_pdl.cuh)
    pdl_launch_dependents();
    const RoomTail t = tails[blockIdx.x];
    if (restore) {  // the room's entries as the host listed them, to its end (a decode that appends reads them)
        DevPage *out = pages + uint64_t(t.seq) * stride;
        for (uint32_t j = threadIdx.x; j < t.n; j += blockDim.x) out[t.first + j] = full[t.offset + j];
        if (threadIdx.x == 0) counts[t.seq] = t.first + t.n;
        return;
    }
    const DevPage first = room_first_entry(t, full);  // in flight with the record's fields
    const uint32_t gen = t.record->generation, len = *room_length(t.record, layer);
    if (gen != t.generation) {  // lists of an earlier room: read nothing, report
        if (threadIdx.x == 0) counts[t.seq] = 0, t.record->stale_read = 1;
        return;
    }
    const uint32_t kept = clip_room_entries(t, full, pages + uint64_t(t.seq) * stride, len, first);
    if (threadIdx.x == 0) {
        counts[t.seq] = t.first + kept;
        seq_len[t.seq] = len;
        if (len > t.list_end) t.record->stale_read = 1;  // a graph captured before the room grew
    }
}

}  // namespace

cudaError_t launch_room_clip(const RoomTail *tails, uint32_t n_tails, const DevPage *full, DevPage *pages,
                             uint32_t stride, uint32_t *counts, uint32_t *seq_len, uint32_t layer, bool restore,
                             cudaStream_t stream) {
    if (n_tails == 0) return cudaSuccess;
    return launch_pdl(room_clip_kernel, dim3(n_tails), dim3(kClipThreads), 0, stream, tails, full, pages, stride,
                      counts, seq_len, layer, restore);
}

}  // namespace cuda
}  // namespace ikv
