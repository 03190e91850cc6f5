// The stages of the device top-k (kernels/score_topk.cu runs them in order
// on one stream, each launched with programmatic dependent launch): host-side
// launchers, one file each. Internal to the kernels.
#pragma once

#include <cuda_runtime.h>

#include "ikv_kernels.h"

namespace ikv {
namespace cuda {
namespace topk {

// Score rows per kv-head up to which the one-block select and the mass kernel
// do the hybrid combine themselves (no combine kernel between them and the scores).
constexpr uint32_t kMaxFusedRows = 8;

// kernels/score_pages.cu: a query memory's recall (mem non-NULL), the page
// scores, the hybrid shift (p.hybrid and combine: otherwise the next stage
// fuses it) and the feedback prior (p.prior).
cudaError_t launch_page_scores(const TopkParams &p, const MemoryRecall *mem, bool combine, cudaStream_t stream);
// kernels/mass_budget.cu: IKV_TOPK_MASS's budgets (fused_rows > 0: doing the hybrid combine of that many rows).
cudaError_t launch_mass_budget(const TopkParams &p, uint32_t fused_rows, cudaStream_t stream);
// kernels/select_pages.cu: whether this step selects on thread-block clusters, and the two select launches.
bool select_on_clusters(const TopkParams &p);
cudaError_t launch_select(const TopkParams &p, uint32_t npad, uint32_t fused_rows, cudaStream_t stream);
cudaError_t launch_select_clusters(const TopkParams &p, cudaStream_t stream);

}  // namespace topk
}  // namespace cuda
}  // namespace ikv
