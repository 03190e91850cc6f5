// Device-side query-aware page selection (Quest upper bound or hybrid score,
// then the top pages within a token budget), producing the work lists the
// decode kernel reads. This file runs the stages in order on one stream, each
// launched with programmatic dependent launch on sm_90+
// (kernels/launch_pdl.cuh); no allocation, no host synchronization (graph
// capturable). Two launches for Quest bounds, more where a step needs them:
//   kernels/score_pages.cu   memory_recall_kernel (a query memory), then
//                  score_mma_kernel (sm_80+, up to 8 scored rows per kv-head;
//                  else score_kernel, the SIMT version): the upper bound
//                  max_g sum_d max(q_gd*kmin_d, q_gd*kmax_d) from the page's
//                  bf16 key summary (query token 0) as a matrix product on
//                  tensor cores, 16 pages per warp tile (kernels/score_mma.cuh);
//                  hybrid_combine_kernel (the hybrid shift, where no later
//                  stage fuses it) and feedback_prior_kernel (a feedback prior);
//   kernels/mass_budget.cu   mass_budget_kernel (IKV_TOPK_MASS: each pair's
//                  budget from its scores' softmax mass);
//   kernels/select_pages.cu  select_kernel, one block per (sequence, kv-head),
//                  or a cluster of 8 when there are at most 16 such pairs
//                  with > 4096 candidates each (B = 1 or 2 beyond 64K
//                  tokens): a token-weighted radix select (4 passes of 8 bits
//                  over the order key: bound descending; warp-aggregated
//                  histogram, one warp scans it) finds where the budget runs
//                  out, ties at the boundary are taken in candidate order by a
//                  coalesced scan, then mandatory pages + the selected prefix
//                  are compacted in candidate order. Same rule as the CPU
//                  path: mandatory tokens count first; the first page (in
//                  bound order) that does not fit ends the selection.
// kernels/topk_shared.cuh holds what the kernels share (the hybrid shift, the
// order key); kernels/topk_stages.hpp declares the stages' launchers.
#include <cuda_runtime.h>

#include "ikv_kernels.h"
#include "topk_stages.hpp"

namespace ikv {
namespace cuda {

cudaError_t launch_score_topk(const TopkParams &p, const MemoryRecall *mem, cudaStream_t stream) {
    using namespace topk;
    const uint32_t rows = p.n_q_heads / p.shape.n_kv_heads * (mem ? 2 : 1);
    const uint32_t D = p.shape.head_dim;
    if (p.max_candidates == 0 || p.max_candidates > kMaxTopkCandidates || p.candidates.list_heads != 1 ||
        (p.hybrid && (p.rows == nullptr || rows > kMaxHybridGroup)) ||
        (p.budgets != nullptr && p.weights == nullptr) || ((p.prior != nullptr) != (p.prior_on != nullptr)) ||
        ((mem != nullptr) != (p.mem_rows != nullptr)) || (mem && (p.mem_ok == nullptr || p.n_seqs > kMaxMemorySeqs)) ||
        (D != 32 && D != 64 && D != 128 && D != 256))
        return cudaErrorInvalidValue;
    uint32_t npad = 1;
    while (npad < p.max_candidates) npad <<= 1;
    const bool clusters = select_on_clusters(p);
    // The one-block select does the hybrid combine itself when nothing reads the
    // scores in between (no feedback prior, no mass budget) and the rows fit.
    const bool fuse = p.hybrid && !clusters && p.prior == nullptr && p.budgets == nullptr && rows <= kMaxFusedRows;
    // ... or, with a mass budget, the mass kernel does it (it reads every score first).
    const bool fuse_mass = p.hybrid && p.prior == nullptr && p.budgets != nullptr && rows <= kMaxFusedRows;
    cudaError_t err = launch_page_scores(p, mem, !fuse && !fuse_mass, stream);
    if (err == cudaSuccess && p.budgets) err = launch_mass_budget(p, fuse_mass ? rows : 0u, stream);
    if (err != cudaSuccess) return err;
    if (clusters) return launch_select_clusters(p, stream);
    return launch_select(p, npad, fuse ? rows : 0u, stream);
}

cudaError_t launch_topk_select(const TopkParams &p, cudaStream_t stream) {
    using namespace topk;
    if (p.max_candidates == 0 || p.max_candidates > kMaxTopkCandidates ||
        p.candidates.list_heads != p.shape.n_kv_heads || p.candidates.stride != p.max_candidates || p.prior != nullptr)
        return cudaErrorInvalidValue;
    uint32_t npad = 1;
    while (npad < p.max_candidates) npad <<= 1;
    return launch_select(p, npad, 0u, stream);
}

}  // namespace cuda
}  // namespace ikv
