// The multi-token attention path: many query tokens per step (chunked
// prefill, long speculative verification) as cuBLASLt GEMMs over dequantized
// key tiles instead of the fused decode kernel, which re-reads every page once
// per 8 query rows. Depends only on the kernels' interface and cuBLASLt (no
// ikv status plumbing), so bench/gpu builds it standalone.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ikv_kernels.h"

namespace ikv {
namespace cuda {

// Steps with at least this many query rows per kv-head (T * G) take the GEMM
// path under IKV_CUDA_MULTI_TOKEN=auto when the fused kernel would run SIMT
// (F32 queries, or IKV_CUDA_DECODE_COMPUTE=simt). Measured on an H100
// (bench/RESULTS.md, "cuBLASLt multi-token path", G = 4, D = 128, 8K/32K
// context, dense and 25%, the SIMT kernel of the time):
// the GEMM path is faster from T = 16 (64 rows) in every shape, from T = 8 at
// B = 4; at T <= 4 the fused kernel is faster everywhere (its single pass over
// the pages beats gathering them into tiles).
constexpr uint32_t kMultiTokenGemmMinRows = 64;
// The same when the fused kernel runs on tensor cores (F16/BF16 queries with
// more than kSimtMaxQueryRows rows per kv-head, since 2026-11-27: 16 rows
// per CTA at 2 CTAs per SM). Measured on the H100 (bench/RESULTS.md section
// 5b; G = 4, D = 128, F16 pages, dense): fused faster up to T = 128 (512
// rows) in every shape (0.79-0.88x the GEMM time), at T = 256 16% faster at
// B = 1, 32K and even (+0.8%) at B = 8; GEMM 6% faster at B = 8, T = 512.
constexpr uint32_t kMultiTokenGemmMinRowsTc = 2048;

// Per-tile buffers (S, K/V tiles, positions) stay within this many bytes,
// whatever the context: the key tile shrinks, then (bh) pairs are processed
// in groups. Whole-step buffers are output-sized (Q operands, fp32 O, m, l).
constexpr uint64_t kMultiTokenTileBytes = 256ull << 20;
constexpr uint64_t kMultiTokenLtWorkspace = 32ull << 20;  // cuBLASLt's own scratch

// Tiling limits (the defaults above; checks shrink them to force many key
// tiles and groups, the benchmark compares budgets).
struct MultiTokenTiling {
    uint64_t tile_bytes = kMultiTokenTileBytes;
    uint32_t max_tile_keys = 16384;  // rounded down to a multiple of 128, >= 128
    uint32_t max_group_pairs = 0;    // (seq, kv-head) pairs per group; 0 = as many as fit
};

// cuBLASLt handle + cached matmul descriptors and algorithms (per shape).
struct MultiTokenGemm;

// Create the handle (host side; call outside graph capture). Returns
// cudaErrorUnknown when cuBLASLt fails (multi_token_error says which call).
cudaError_t multi_token_create(MultiTokenGemm **out);
void multi_token_destroy(MultiTokenGemm *g);
// The cuBLASLt call that failed last, with its status ("" if none).
const char *multi_token_error(const MultiTokenGemm *g);

// Device workspace the path needs for p when no list holds more than
// max_tokens rows (p.workspace must have this many bytes, 256-aligned).
uint64_t multi_token_workspace_bytes(const DecodeParams &p, uint32_t max_tokens,
                                     const MultiTokenTiling &tiling = MultiTokenTiling());

// Enqueue one step on stream: stage, per key tile gather + S = scale Q K^T +
// softmax + O += P V, then finalize into p.out / p.lse. No host
// synchronization, no allocation. p.n_splits is ignored.
cudaError_t multi_token_run(MultiTokenGemm *g, const DecodeParams &p, uint32_t max_tokens, cudaStream_t stream,
                            const MultiTokenTiling &tiling = MultiTokenTiling());

}  // namespace cuda
}  // namespace ikv
