// cuBLASLt orchestration of the multi-token path (see cuda_multi_token.hpp and
// kernels/multi_token_attention.cu for the kernels around the GEMMs).
//
// Per group of (seq, kv-head) pairs and per key tile of nk tokens:
//   gather   K, V [nbh][nk][D] operands + positions
//   GEMM 1   S = scale * Q K^T         batched over the group, fp32 out
//   softmax  mask, online max / denominator, P in place over S, O *= alpha
//   GEMM 2   O += P V                  batched, fp32 accumulate (beta = 1)
// then one finalize. In cuBLASLt's column-major terms, with every matrix
// row-major in memory: S^T (nk x M) = K^T' (T: K is D x nk) * Q^T (D x M), and
// O^T (D x M) = V^T (D x nk) * P^T (nk x M, leading dimension 2*nk because P
// sits in place over the fp32 S rows).
#include "cuda/cuda_multi_token.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <vector>

namespace ikv {
namespace cuda {

namespace {

uint64_t align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Workspace layout and tiling of one step.
struct Plan {
    uint32_t M = 0, BH = 0, nbh = 0, nk = 0, n_tiles = 0, n_lists = 0;
    uint64_t qs = 0, o = 0, m = 0, l = 0, offsets = 0, k = 0, v = 0, pos = 0, s = 0, lt = 0, total = 0;
};

Plan make_plan(const DecodeParams &p, uint32_t max_tokens, const MultiTokenTiling &tiling) {
    Plan pl;
    const uint32_t Hkv = p.shape.n_kv_heads, D = p.shape.head_dim;
    pl.M = p.n_query_tokens * (p.n_q_heads / Hkv);
    pl.BH = p.n_seqs * Hkv;
    pl.n_lists = p.n_seqs * (p.lists.list_heads > 1 ? p.lists.list_heads : 1);
    // Bytes per key per (bh) in a tile: S row entries, K and V operands, position.
    const uint64_t per_key = 4ull * pl.M + 4ull * D + 4;
    const uint64_t key_cap = std::max<uint64_t>(128, tiling.max_tile_keys / 128 * 128);
    const uint64_t want = std::min<uint64_t>((uint64_t(std::max(max_tokens, 1u)) + 127) / 128 * 128, key_cap);
    uint64_t nbh = tiling.max_group_pairs ? std::min(pl.BH, tiling.max_group_pairs) : pl.BH;
    uint64_t nk = std::min<uint64_t>(want, tiling.tile_bytes / (nbh * per_key) / 128 * 128);
    if (nk < std::min<uint64_t>(want, 512)) {  // keep tiles GEMM-sized; process fewer pairs at a time
        nk = std::min<uint64_t>(want, 512);
        nbh = std::max<uint64_t>(1, std::min<uint64_t>(nbh, tiling.tile_bytes / (nk * per_key)));
    }
    // Tiles of equal size: the fewest tiles of at most nk keys, each just large
    // enough (a last tile of a few keys would cost a whole tile's GEMMs).
    pl.n_tiles = max_tokens == 0 ? 0 : uint32_t((uint64_t(max_tokens) + nk - 1) / nk);
    if (pl.n_tiles > 0) nk = ((uint64_t(max_tokens) + pl.n_tiles - 1) / pl.n_tiles + 127) / 128 * 128;
    pl.nk = uint32_t(nk);
    pl.nbh = uint32_t(nbh);
    uint64_t off = 0;
    auto take = [&](uint64_t bytes) {
        const uint64_t at = off;
        off += align256(bytes);
        return at;
    };
    const uint64_t rows = uint64_t(pl.BH) * pl.M;
    pl.qs = take(rows * D * 2);
    pl.o = take(rows * D * 4);
    pl.m = take(rows * 4);
    pl.l = take(rows * 4);
    pl.offsets = take(uint64_t(pl.n_lists) * (p.lists.stride + 1) * 4);
    pl.k = take(nbh * nk * D * 2);
    pl.v = take(nbh * nk * D * 2);
    pl.pos = take(nbh * nk * 4);
    pl.s = take(nbh * pl.M * nk * 4);
    pl.lt = take(kMultiTokenLtWorkspace);
    pl.total = off;
    return pl;
}

// One strided-batched matmul D = alpha * op(A) B + beta * C (C == D), its
// descriptors and the heuristic's algorithm, built once per shape.
struct Gemm {
    // key
    bool trans_a = false, bf16 = false;
    uint64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, sa = 0, sb = 0, sc = 0;
    int batch = 0;
    // built
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool same(const Gemm &o) const {
        return trans_a == o.trans_a && bf16 == o.bf16 && m == o.m && n == o.n && k == o.k && lda == o.lda &&
               ldb == o.ldb && ldc == o.ldc && sa == o.sa && sb == o.sb && sc == o.sc && batch == o.batch;
    }
    void release() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
        desc = nullptr;
        a = b = c = nullptr;
    }
};

}  // namespace

struct MultiTokenGemm {
    cublasLtHandle_t lt = nullptr;
    std::vector<Gemm> cache;  // a handful of shapes: the step's two GEMMs, a last smaller group
    char error[160] = "";
};

namespace {

bool lt_ok(MultiTokenGemm *g, cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    std::snprintf(g->error, sizeof g->error, "cuBLASLt %s returned status %d", what, int(st));
    return false;
}

bool layout(MultiTokenGemm *g, cublasLtMatrixLayout_t *out, cudaDataType t, uint64_t rows, uint64_t cols,
            uint64_t ld, uint64_t stride, int batch) {
    if (!lt_ok(g, cublasLtMatrixLayoutCreate(out, t, rows, cols, int64_t(ld)), "MatrixLayoutCreate")) return false;
    const int64_t s = int64_t(stride);
    return lt_ok(g, cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
                 "MatrixLayoutSetAttribute(BATCH_COUNT)") &&
           lt_ok(g, cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
                 "MatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
}

// The cached Gemm for key (built on first use: descriptors + heuristic).
const Gemm *get_gemm(MultiTokenGemm *g, const Gemm &key) {
    for (const Gemm &e : g->cache)
        if (e.same(key)) return &e;
    if (g->cache.size() >= 8) {
        g->cache.front().release();
        g->cache.erase(g->cache.begin());
    }
    Gemm e = key;
    const cudaDataType op = key.bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    bool ok = lt_ok(g, cublasLtMatmulDescCreate(&e.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate") &&
              lt_ok(g, cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                    "MatmulDescSetAttribute(TRANSA)") &&
              lt_ok(g, cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                    "MatmulDescSetAttribute(TRANSB)") &&
              layout(g, &e.a, op, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda, key.sa,
                     key.batch) &&
              layout(g, &e.b, op, key.k, key.n, key.ldb, key.sb, key.batch) &&
              layout(g, &e.c, CUDA_R_32F, key.m, key.n, key.ldc, key.sc, key.batch);
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const uint64_t ws = kMultiTokenLtWorkspace;
    ok = ok && lt_ok(g, cublasLtMatmulPreferenceCreate(&pref), "MatmulPreferenceCreate") &&
         lt_ok(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "MatmulPreferenceSetAttribute") &&
         lt_ok(g, cublasLtMatmulAlgoGetHeuristic(g->lt, e.desc, e.a, e.b, e.c, e.c, pref, 1, &res, &found),
               "MatmulAlgoGetHeuristic");
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok && found == 0) ok = lt_ok(g, CUBLAS_STATUS_NOT_SUPPORTED, "MatmulAlgoGetHeuristic (no algorithm)");
    if (!ok) {
        e.release();
        return nullptr;
    }
    e.algo = res.algo;
    g->cache.push_back(e);
    return &g->cache.back();
}

bool matmul(MultiTokenGemm *g, const Gemm &key, float alpha, const void *A, const void *B, float beta, float *C,
            void *ws, cudaStream_t stream) {
    const Gemm *e = get_gemm(g, key);
    if (e == nullptr) return false;
    return lt_ok(g,
                 cublasLtMatmul(g->lt, e->desc, &alpha, A, e->a, B, e->b, &beta, C, e->c, C, e->c, &e->algo, ws,
                                kMultiTokenLtWorkspace, stream),
                 "Matmul");
}

}  // namespace

cudaError_t multi_token_create(MultiTokenGemm **out) {
    *out = nullptr;
    MultiTokenGemm *g = new (std::nothrow) MultiTokenGemm;
    if (g == nullptr) return cudaErrorMemoryAllocation;
    if (!lt_ok(g, cublasLtCreate(&g->lt), "Create")) {
        delete g;
        return cudaErrorUnknown;
    }
    *out = g;
    return cudaSuccess;
}

void multi_token_destroy(MultiTokenGemm *g) {
    if (g == nullptr) return;
    for (Gemm &e : g->cache) e.release();
    if (g->lt) cublasLtDestroy(g->lt);
    delete g;
}

const char *multi_token_error(const MultiTokenGemm *g) { return g ? g->error : "cuBLASLt handle missing"; }

uint64_t multi_token_workspace_bytes(const DecodeParams &p, uint32_t max_tokens, const MultiTokenTiling &tiling) {
    return make_plan(p, max_tokens, tiling).total;
}

cudaError_t multi_token_run(MultiTokenGemm *g, const DecodeParams &p, uint32_t max_tokens, cudaStream_t stream,
                            const MultiTokenTiling &tiling) {
    if (!head_dim_supported(p.shape.head_dim)) return cudaErrorInvalidValue;
    g->error[0] = '\0';
    const Plan pl = make_plan(p, max_tokens, tiling);
    const uint32_t D = p.shape.head_dim;
    const bool bf16 = p.q_dtype == IKV_DTYPE_BF16;
    uint8_t *w = static_cast<uint8_t *>(p.workspace);
    uint16_t *qs = reinterpret_cast<uint16_t *>(w + pl.qs);
    float *O = reinterpret_cast<float *>(w + pl.o), *m = reinterpret_cast<float *>(w + pl.m);
    float *l = reinterpret_cast<float *>(w + pl.l), *S = reinterpret_cast<float *>(w + pl.s);
    uint32_t *offsets = reinterpret_cast<uint32_t *>(w + pl.offsets), *pos = reinterpret_cast<uint32_t *>(w + pl.pos);
    uint16_t *K = reinterpret_cast<uint16_t *>(w + pl.k), *V = reinterpret_cast<uint16_t *>(w + pl.v);
    void *lt_ws = w + pl.lt;

    cudaError_t err = launch_mt_stage(p, bf16, qs, O, m, l, stream);
    if (err == cudaSuccess && pl.n_tiles > 0) err = launch_mt_offsets(p, pl.n_lists, offsets, stream);
    const uint64_t M = pl.M, nk = pl.nk;
    for (uint32_t bh0 = 0; err == cudaSuccess && bh0 < pl.BH && pl.n_tiles > 0; bh0 += pl.nbh) {
        const uint32_t nbh = std::min(pl.nbh, pl.BH - bh0);
        Gemm s_key;  // S^T (nk x M) = K^T (T of D x nk) * Q^T (D x M)
        s_key.trans_a = true;
        s_key.bf16 = bf16;
        s_key.m = nk, s_key.n = M, s_key.k = D;
        s_key.lda = D, s_key.ldb = D, s_key.ldc = nk;
        s_key.sa = nk * D, s_key.sb = M * D, s_key.sc = M * nk;
        s_key.batch = int(nbh);
        Gemm o_key;  // O^T (D x M) += V^T (D x nk) * P^T (nk x M, ld 2*nk)
        o_key.trans_a = false;
        o_key.bf16 = bf16;
        o_key.m = D, o_key.n = M, o_key.k = nk;
        o_key.lda = D, o_key.ldb = 2 * nk, o_key.ldc = D;
        o_key.sa = nk * D, o_key.sb = 2 * M * nk, o_key.sc = M * D;
        o_key.batch = int(nbh);
        const uint16_t *Qg = qs + uint64_t(bh0) * M * D;
        float *Og = O + uint64_t(bh0) * M * D;
        for (uint32_t t = 0; t < pl.n_tiles; ++t) {
            err = launch_mt_gather(p, bf16, offsets, bh0, nbh, t * pl.nk, pl.nk, K, V, pos, stream);
            if (err != cudaSuccess) break;
            if (!matmul(g, s_key, p.scale, K, Qg, 0.0f, S, lt_ws, stream)) return cudaErrorUnknown;
            err = launch_mt_softmax(p, bf16, bh0, nbh, pl.nk, pos, S, O, m, l, stream);
            if (err != cudaSuccess) break;
            if (!matmul(g, o_key, 1.0f, V, S, 1.0f, Og, lt_ws, stream)) return cudaErrorUnknown;
        }
    }
    if (err == cudaSuccess) err = launch_mt_finalize(p, O, m, l, stream);
    return err;
}

}  // namespace cuda
}  // namespace ikv
