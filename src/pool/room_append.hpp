// An append to sequences with room (ikv_pool_reserve) in two halves, for a
// decode that appends its step's tokens (ikv_decode_args.append): every
// check first, leaving the append ready (nothing enqueued, nothing changed),
// then either its own launch (room_append_run) or, on CUDA, the decode's
// kernels doing it (cuda_decode.cpp, between pool_fused_append_begin and
// _end). ikv_pool_append is the two halves back to back (room_append).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "intentkv.h"
#include "pool/append_rows.hpp"

struct ikv_pool;

namespace ikv {

struct Seq;

struct RoomAppendReady {
    bool pending = false;  // prepared and not yet enqueued by anyone
    AppendSource src;
    std::vector<void *> records;  // the store's room records, in the batch's order
    std::vector<std::shared_ptr<Seq>> seqs;  // held: the run may come after the append call returned
    std::vector<ikv_seq_id> ids;
    uint32_t l0 = 0, l1 = 0;
    int only_format = -1;  // the format of every page the rooms hold, or -1
    bool pages16 = false;  // every page the rooms hold is F16 or BF16
    bool capturing = false;
};

ikv_status room_append_prepare(ikv_pool *pool, const std::shared_ptr<Seq> *seqs, const ikv_seq_id *ids, uint32_t n_seqs,
                               const AppendSource &src, uint32_t l0, uint32_t l1, RoomAppendReady *out);
// Enqueue the ready append (and, when synchronous, take the lengths); clears pending.
ikv_status room_append_run(ikv_pool *pool, RoomAppendReady &r);
// The decode's kernels do the ready append (PageStore::fused_append_begin /
// _end: ordering, the input rows and error record as a cuda::FusedAppend in
// *fused); end clears pending.
ikv_status pool_fused_append_begin(ikv_pool *pool, const RoomAppendReady &r, void *fused);
ikv_status pool_fused_append_end(ikv_pool *pool, RoomAppendReady &r);

}  // namespace ikv
