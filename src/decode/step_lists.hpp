// A decoder's memory of the page lists it built: what decides them, and
// whether the lists of the last call can serve this one.
//
// An engine calls ikv_decode once per layer of a step with the same
// sequences and plans. The lists (which tokens of which pages each sequence
// reads, with their addresses) do not depend on the layer: pages hold every
// layer. They depend on each sequence's block table and the layer's stored
// length, and on the plan. So a call whose pool, sequences, lengths, block
// table generations (pool_view.hpp SeqState) and plan identities equal the
// last successful call's reuses its lists: no snapshots, no host list
// building, and on CUDA no upload (bench/RESULTS.md section 1h).
#pragma once

#include <cstdint>
#include <vector>

#include "decode/selection.hpp"
#include "intentkv.h"
#include "pool/pool_view.hpp"

namespace ikv {

// What the page lists of one call are a function of.
struct StepKey {
    const ikv_pool *pool = nullptr;
    dvec<ikv_seq_id> seqs;
    dvec<uint32_t> lengths;   // at the call's layer
    dvec<uint64_t> tables;    // block table generations
    dvec<uint64_t> plans;     // plan identities (0: dense)
    bool operator==(const StepKey &o) const {
        return pool == o.pool && seqs == o.seqs && lengths == o.lengths && tables == o.tables && plans == o.plans;
    }
};

struct RoomAppendReady;

// One call's view of the lists, handed to the backends.
struct StepLists {
    bool reuse = false;  // in: the last call's lists (and snapshots) are this call's
    bool keep = false;   // out: this call's lists stay valid for a later call (set by the backend)
    bool captured = false;  // out: the call was captured into a CUDA graph (set by the CUDA backend)
    std::vector<SeqSnapshot> *snaps = nullptr;  // sequence b's block table at the layer (once taken)
    const ikv_pool *pool = nullptr;
    const ikv_decode_args *args = nullptr;
    // args->append to sequences with room, checked and not yet enqueued
    // (pool/room_append.hpp): the CUDA backend runs it or does it in its kernels.
    RoomAppendReady *append = nullptr;
    bool append_fused = false;  // out: the decode's kernels wrote it (set by the CUDA backend)
    // Fill *snaps for args' sequences (a backend that builds lists calls it).
    // The sequences were checked already, so only IKV_E_NOMEM remains.
    ikv_status take_snapshots() const;
};

// Per decoder: the key of the lists it holds, the key of the call in
// progress, and counters (ikv_decoder_get_stats).
class ListMemory {
public:
    // Record the call's key from the pool; the pool's errors pass through
    // (message set). states(b) gives sequence b's SeqState afterwards.
    ikv_status observe(const ikv_pool *pool, const ikv_decode_args &a);
    const SeqState &state(uint32_t b) const { return states_[b]; }
    // True when the held lists are exactly this call's.
    bool reusable() const { return valid_ && now_ == held_; }
    // The call did not finish, or its lists must not be reused.
    void forget() { valid_ = false; }
    // The call succeeded and left lists built from its key (keep) or not.
    void finish(bool reused, bool keep);

    std::vector<SeqSnapshot> snaps;
    uint64_t steps = 0, built = 0, reused = 0;

private:
    StepKey now_, held_;
    dvec<SeqState> states_;
    bool valid_ = false;
};

}  // namespace ikv
