// The append entry point shared by ikv_pool_append(_batch) and ikv_decode's
// args->append (api_pool.cpp): the ikv_append is read by its struct_size,
// checked, and handed to the pool core.
#pragma once

#include <cstdint>

#include "intentkv.h"

namespace ikv {

struct RoomAppendReady;
// With defer, an append to sequences with room is prepared into *defer and
// not enqueued (seqs_append); fn names the entry point in messages.
ikv_status append_entry(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs, const ikv_append *args,
                        const char *fn, RoomAppendReady *defer = nullptr);

}  // namespace ikv
