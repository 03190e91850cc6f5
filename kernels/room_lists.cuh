// The device side of a sequence's room (ikv_pool_reserve) that more than one
// kernel does: a decode list's room entries clipped to the layer's length
// (room_clip.cu before a decode; the merge of a decode that appended its
// token, decode_attention.cu), and a layer's length advanced past an append
// (the room append's last block, quantize_pages.cu; that merge).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "ikv_kernels.h"

namespace ikv {
namespace cuda {

// A list entry cut at the layer's length len (it starts before len).
__device__ __forceinline__ DevPage clip_entry(DevPage e, uint32_t len) {
    if (e.pos0 + e.end > len) {
        e.end = uint8_t(len - e.pos0);
        e.flags |= IKV_PAGE_PARTIAL;
    }
    return e;
}

// A layer's length and staging pointer in a record, by the record's layout
// (kernels/ikv_kernels.h room_*_offset): one load each, no pointer loaded first.
__device__ __forceinline__ uint32_t *room_length(const RoomRecord *r, uint32_t layer) {
    return reinterpret_cast<uint32_t *>(reinterpret_cast<uint8_t *>(const_cast<RoomRecord *>(r)) + room_lengths_offset()) + layer;
}
__device__ __forceinline__ float *room_stage(const RoomRecord *r, uint32_t layer, uint32_t n_layers) {
    return reinterpret_cast<float *const *>(reinterpret_cast<const uint8_t *>(r) + room_stages_offset(n_layers))[layer];
}

// This thread's full entry of the first pass over t's room (threads past t.n:
// an empty one). Loaded by the caller before the record's fields, so that
// both come back in one round trip instead of two in a row.
__device__ __forceinline__ DevPage room_first_entry(const RoomTail &t, const DevPage *full) {
    DevPage e{};
    if (threadIdx.x < t.n) e = full[t.offset + threadIdx.x];
    return e;
}

// Entries [t.first, t.first + t.n) of the list at `out` (sequence t.seq's),
// rewritten from their full copies clipped to len by the whole block; returns
// how many were kept (entries come in position order: the kept ones are a
// prefix). first: room_first_entry(t, full), loaded earlier.
__device__ __forceinline__ uint32_t clip_room_entries(const RoomTail &t, const DevPage *full, DevPage *out,
                                                      uint32_t len, DevPage first) {
    uint32_t kept = 0;
    for (uint32_t j0 = 0; j0 < t.n; j0 += blockDim.x) {
        const uint32_t j = j0 + threadIdx.x;
        bool keep = false;
        if (j < t.n) {
            const DevPage e = j0 == 0 ? first : full[t.offset + j];
            keep = e.pos0 + e.begin < len;
            if (keep) out[t.first + j] = clip_entry(e, len);
        }
        kept += uint32_t(__syncthreads_count(keep));
    }
    return kept;
}

// n tokens appended to `layer` at length pos: the length advances, or, when
// they would pass the room's end (nothing was written), the overrun is recorded.
__device__ __forceinline__ void advance_room_length(RoomRecord &r, uint32_t layer, uint32_t pos, uint32_t n) {
    if (uint64_t(pos) + n <= r.end)
        r.lengths[layer] = pos + n;
    else
        atomicCAS(&r.overrun, 0u, layer + 1);
}

}  // namespace cuda
}  // namespace ikv
