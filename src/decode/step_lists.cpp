#include "decode/step_lists.hpp"

#include <string>
#include <utility>

#include "common/error.hpp"
#include "plan/plan.hpp"

namespace ikv {

ikv_status StepLists::take_snapshots() const {
    snaps->resize(args->n_seqs);
    for (uint32_t b = 0; b < args->n_seqs; ++b) {
        const ikv_status st = pool_snapshot(pool, args->seqs[b], b, args->layer, &(*snaps)[b]);
        if (st != IKV_OK) return st;
    }
    return IKV_OK;
}

ikv_status ListMemory::observe(const ikv_pool *pool, const ikv_decode_args &a) {
    const uint32_t B = a.n_seqs;
    now_.pool = pool;
    now_.seqs.assign(a.seqs, a.seqs + B);
    now_.lengths.resize(B);
    now_.tables.resize(B);
    now_.plans.resize(B);
    states_.resize(B);
    for (uint32_t b = 0; b < B; ++b) {
        const ikv_status st = pool_seq_state(pool, a.seqs[b], b, a.layer, &states_[b]);
        if (st != IKV_OK) return st;  // its sentence names args->seqs[b] or the layer
        now_.lengths[b] = states_[b].length;
        now_.tables[b] = states_[b].table_gen;
        now_.plans[b] = plan_uid(a.plans ? a.plans[b] : nullptr);
    }
    return IKV_OK;
}

void ListMemory::finish(bool reused_lists, bool keep) {
    ++steps;
    ++(reused_lists ? reused : built);
    if (keep && !reused_lists) std::swap(held_, now_);
    valid_ = keep;
}

}  // namespace ikv
