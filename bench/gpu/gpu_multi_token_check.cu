// Standalone check and benchmark of the multi-token (cuBLASLt GEMM) attention
// path: kernels/multi_token_attention.cu + src/cuda/cuda_multi_token.cpp.
//
//   gpu_multi_token_check [--check] [--bench] [--quick] [--out DIR]
//
// --check (default): the GEMM path against a float64 reference computed on the
//   stored (dequantized) values with quant.hpp's reader, for every format and
//   a mixed-format list x head_dim 32/64/128/256 x group 1/4/8 x page 16/64 x
//   random partial bounds x per-sequence and per-(seq, head) lists x an empty
//   list x T in {1, 17, 64, 300} causal query tokens x q/out F32/F16/BF16 x
//   softcap, with the key tile forced small (many tiles: the online merge) and
//   pairs processed in groups; outputs NaN-poisoned first. Tolerances (rel. L2
//   of out against float64): the operands are 16-bit, so they set the error,
//   not the output dtype: f16 operands (q F32/F16) 2e-3, bf16 operands (q BF16)
//   1e-2; F32/F16 out adds nothing above that, BF16 out adds its own rounding
//   (1e-2). lse (from logits of 16-bit operands) within 1e-3 * (1 + |lse|)
//   with f16 operands (11-bit significands), 1e-2 * (1 + |lse|) with bf16
//   operands (8-bit significands: a logit of magnitude 5 is off by ~5e-3).
//   Also: a CUDA-graph capture of the path replays bit-identically.
// --bench: fused kernel vs GEMM path per step (CUDA events, median; inputs
//   rotated over copies >= 3x L2), 32 q-heads, 8 kv-heads, D=128, P=16, F16
//   pages, B in {1, 4}, context 8K/32K, dense and a fixed 25% of pages,
//   T in {1, ..., 1024}; ms/step, effective TFLOP/s (4*B*Hq*D*sum of visible
//   keys per query row), and the T where the GEMM path starts to win.
#include <cuda_fp16.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <thread>

#include "cuda/cuda_multi_token.hpp"
#include "gpu_bench.cuh"
#include "gpu_check_common.cuh"

using namespace gpucheck;
using ikv::cuda::DevLists;
using ikv::cuda::DevPage;

namespace {


// Float64 causal attention over the lists' rows, one thread per (seq, kv-head).
void reference(const PageShape &s, uint32_t layer, const std::vector<HostSeq> &seqs,
               const std::vector<HostList> &lists, uint32_t list_heads, uint32_t T, uint32_t Hq,
               const std::vector<float> &q, double scale, double softcap, std::vector<double> *out,
               std::vector<double> *lse) {
    const uint32_t D = s.head_dim, Hkv = s.n_kv_heads, G = Hq / Hkv, P = s.page_size, B = uint32_t(seqs.size());
    out->assign(size_t(B) * T * Hq * D, 0.0);
    lse->assign(size_t(B) * T * Hq, -INFINITY);
    auto one = [&](uint32_t b, uint32_t h) {
        const HostList &L = lists[list_heads > 1 ? b * list_heads + h : b];
        std::vector<uint32_t> pos;
        std::vector<double> K, V;
        std::vector<float> kr(D), vr(D);
        for (size_t i = 0; i < L.pages.size(); ++i) {
            const DevPage &pg = L.pages[i];
            const uint8_t *sub =
                seqs[b].pages[L.page_idx[i]].data() + ikv::subpage_offset(s, ikv_format(pg.format), layer, h);
            for (uint32_t r = pg.begin; r < pg.end; ++r) {
                ikv::read_subpage_row(ikv_format(pg.format), P, D, sub, 0, r, kr.data());
                ikv::read_subpage_row(ikv_format(pg.format), P, D, sub, 1, r, vr.data());
                pos.push_back(pg.pos0 + r);
                K.insert(K.end(), kr.begin(), kr.end());
                V.insert(V.end(), vr.begin(), vr.end());
            }
        }
        std::vector<double> logit(pos.size()), acc(D);
        for (uint32_t t = 0; t < T; ++t)
            for (uint32_t g = 0; g < G; ++g) {
                const size_t oi = (size_t(b) * T + t) * Hq + h * G + g;
                const uint32_t qpos = seqs[b].length - T + t;
                double m = -INFINITY;
                for (size_t j = 0; j < pos.size(); ++j) {
                    if (pos[j] > qpos) {
                        logit[j] = -INFINITY;
                        continue;
                    }
                    double a = 0.0;
                    for (uint32_t d = 0; d < D; ++d) a += double(q[oi * D + d]) * K[j * D + d];
                    a *= scale;
                    if (softcap > 0) a = softcap * tanh(a / softcap);
                    logit[j] = a;
                    m = std::max(m, a);
                }
                if (m == -INFINITY) continue;
                double l = 0.0;
                std::fill(acc.begin(), acc.end(), 0.0);
                for (size_t j = 0; j < pos.size(); ++j) {
                    if (logit[j] == -INFINITY) continue;
                    const double p = exp(logit[j] - m);
                    l += p;
                    for (uint32_t d = 0; d < D; ++d) acc[d] += p * V[j * D + d];
                }
                for (uint32_t d = 0; d < D; ++d) (*out)[oi * D + d] = acc[d] / l;
                (*lse)[oi] = m + log(l);
            }
    };
    std::vector<std::thread> th;
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t h = 0; h < Hkv; ++h) th.emplace_back(one, b, h);
    for (auto &t : th) t.join();
}

struct Case {
    uint32_t D, G, P, T;
    std::vector<ikv_format> fmts;
    ikv_dtype q_dtype = IKV_DTYPE_F16, out_dtype = IKV_DTYPE_F16;
    bool per_head = false, with_empty = false;
    float softcap = 0.0f;
    uint32_t tile_keys = 128, group_pairs = 0;  // small tiles: many online-softmax merges
};

const char *fmt_name(ikv_format f) {
    static const char *n[] = {"f16", "bf16", "fp8", "int8", "int4"};
    return unsigned(f) < 5 ? n[f] : "?";
}

// Tolerance of out (rel. L2 vs float64): see the file comment.
double out_tolerance(ikv_dtype q_dtype, ikv_dtype out_dtype) {
    return q_dtype == IKV_DTYPE_BF16 || out_dtype == IKV_DTYPE_BF16 ? 1e-2 : 2e-3;
}

void *upload_q(const std::vector<float> &q, ikv_dtype dt, std::vector<float> *seen, std::vector<void *> *allocs) {
    *seen = q;
    if (dt == IKV_DTYPE_F32) return to_device(q, allocs);
    std::vector<uint16_t> b(q.size());
    for (size_t i = 0; i < q.size(); ++i) b[i] = to_half_bits(q[i], dt), (*seen)[i] = from_bits(b[i], dt);
    return to_device(b, allocs);
}

bool run_case(const Case &c, ikv::cuda::MultiTokenGemm *gemm, uint64_t seed) {
    std::vector<void *> allocs;
    const PageShape s{2, 2, c.D, c.P};
    const uint32_t Hq = s.n_kv_heads * c.G, B = 3, T = c.T, D = c.D;
    Rng rng(seed);
    std::vector<HostSeq> seqs;
    std::vector<HostList> lists;
    const std::vector<uint32_t> lens_v = {T + c.P * 5 + 7, T + c.P * 2, T + c.P * 9 + 1};
    random_case(s, lens_v, c.fmts, c.per_head, c.with_empty, rng, &seqs, &lists, &allocs);
    const uint32_t list_heads = c.per_head ? s.n_kv_heads : 1;
    uint32_t max_pages = 0, max_tokens = 0;
    for (const HostList &L : lists) {
        max_pages = std::max<uint32_t>(max_pages, uint32_t(L.pages.size()));
        uint32_t t = 0;
        for (const DevPage &d : L.pages) t += d.end - d.begin;
        max_tokens = std::max(max_tokens, t);
    }
    const uint32_t stride = std::max<uint32_t>(max_pages, 1);
    std::vector<DevPage> flat(lists.size() * stride);
    std::vector<uint32_t> counts(lists.size());
    for (size_t i = 0; i < lists.size(); ++i) {
        std::copy(lists[i].pages.begin(), lists[i].pages.end(), flat.begin() + i * stride);
        counts[i] = uint32_t(lists[i].pages.size());
    }
    std::vector<float> q(size_t(B) * T * Hq * D), qseen;
    for (float &x : q) x = rng.normal();

    ikv::cuda::DecodeParams p{};
    p.shape = s;
    p.layer = 1;
    p.n_seqs = B;
    p.n_query_tokens = T;
    p.n_q_heads = Hq;
    p.lists = DevLists{to_device(flat, &allocs), to_device(counts, &allocs), stride, list_heads};
    p.seq_len = to_device(lens_v, &allocs);
    p.q = upload_q(q, c.q_dtype, &qseen, &allocs);
    p.q_dtype = c.q_dtype;
    p.out_dtype = c.out_dtype;
    p.scale = 1.0f / sqrtf(float(D));
    p.softcap = c.softcap;
    p.max_pages = stride;
    p.n_splits = 1;
    const size_t n_out = size_t(B) * T * Hq * D, n_lse = size_t(B) * T * Hq, esz = c.out_dtype == IKV_DTYPE_F32 ? 4 : 2;
    void *dout = nullptr;
    float *dlse = nullptr;
    CK(cudaMalloc(&dout, n_out * esz));
    CK(cudaMalloc(&dlse, n_lse * 4));
    allocs.push_back(dout);
    allocs.push_back(dlse);
    CK(cudaMemset(dout, 0xFF, n_out * esz));  // NaN: every element must be written
    CK(cudaMemset(dlse, 0xFF, n_lse * 4));
    p.out = dout;
    p.lse = dlse;
    ikv::cuda::MultiTokenTiling tiling;
    tiling.max_tile_keys = c.tile_keys;
    tiling.max_group_pairs = c.group_pairs;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ikv::cuda::multi_token_workspace_bytes(p, max_tokens, tiling)));
    allocs.push_back(ws);
    p.workspace = ws;
    const cudaError_t err = ikv::cuda::multi_token_run(gemm, p, max_tokens, 0, tiling);
    if (err != cudaSuccess) {
        printf("multi_token_run: %s (%s)\n", cudaGetErrorName(err), ikv::cuda::multi_token_error(gemm));
        report(false, "multi_token_run returned an error");
        free_all(&allocs);
        return false;
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> got(n_out), got_lse(n_lse);
    if (c.out_dtype == IKV_DTYPE_F32) {
        CK(cudaMemcpy(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<uint16_t> bits(n_out);
        CK(cudaMemcpy(bits.data(), dout, n_out * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n_out; ++i) got[i] = from_bits(bits[i], c.out_dtype);
    }
    CK(cudaMemcpy(got_lse.data(), dlse, n_lse * 4, cudaMemcpyDeviceToHost));
    std::vector<double> ref, ref_lse;
    reference(s, p.layer, seqs, lists, list_heads, T, Hq, qseen, p.scale, c.softcap, &ref, &ref_lse);
    double num = 0, den = 0;
    bool ok = true;
    size_t bad_lse = 0;
    double max_lse_err = 0;
    for (size_t i = 0; i < n_out; ++i) {
        if (!std::isfinite(got[i])) ok = false;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    for (size_t i = 0; i < n_lse; ++i) {
        const double lse_tol = c.q_dtype == IKV_DTYPE_BF16 ? 1e-2 : 1e-3;
        const bool good = std::isinf(ref_lse[i]) ? (std::isinf(got_lse[i]) && got_lse[i] < 0)
                                                 : fabs(got_lse[i] - ref_lse[i]) <= lse_tol * (1.0 + fabs(ref_lse[i]));
        if (!good) ++bad_lse;
        if (!std::isinf(ref_lse[i])) max_lse_err = std::max(max_lse_err, fabs(got_lse[i] - ref_lse[i]));
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num), tol = out_tolerance(c.q_dtype, c.out_dtype);
    ok = ok && bad_lse == 0 && rel <= tol;
    std::string fm;
    for (ikv_format f : c.fmts) fm += std::string(fm.empty() ? "" : "+") + fmt_name(f);
    char what[320];
    snprintf(what, sizeof what,
             "gemm D=%u G=%u P=%u T=%u fmt=%s q=%d out=%d tile=%u group=%u%s%s%s rel_l2=%.2e (tol %.0e) max|dlse|=%.1e bad_lse=%zu",
             D, c.G, c.P, T, fm.c_str(), int(c.q_dtype), int(c.out_dtype), c.tile_keys, c.group_pairs,
             c.per_head ? " per-head-lists" : "", c.with_empty ? " empty-list" : "", c.softcap > 0 ? " softcap" : "",
             rel, tol, max_lse_err, bad_lse);
    report(ok, what);
    free_all(&allocs);
    return ok;
}

void check_gemm(bool quick, ikv::cuda::MultiTokenGemm *gemm) {
    const std::vector<std::vector<ikv_format>> fmt_sets = {
        {IKV_FMT_F16}, {IKV_FMT_BF16}, {IKV_FMT_FP8_E4M3}, {IKV_FMT_INT8}, {IKV_FMT_INT4},
        {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4, IKV_FMT_FP8_E4M3, IKV_FMT_BF16}};
    // D = 32 last, so the other head dims keep the cases (and seeds) they had before it.
    const uint32_t Ds[] = {64, 128, 256, 32}, Gs[] = {1, 4, 8}, Ps[] = {16, 64}, Ts[] = {1, 17, 64};
    const ikv_dtype dts[] = {IKV_DTYPE_F16, IKV_DTYPE_BF16, IKV_DTYPE_F32};
    uint64_t seed = 7;
    int k = 0;
    for (uint32_t D : Ds)
        for (const auto &fm : fmt_sets)
            for (uint32_t G : Gs)
                for (uint32_t P : Ps) {
                    if (quick && (D != 128 || G != 4)) continue;
                    Case c{D, G, P, Ts[k % 3], fm};
                    c.q_dtype = dts[(k / 2) % 3];
                    c.out_dtype = dts[(k / 5) % 3];
                    c.per_head = k % 5 == 2;
                    c.with_empty = k % 7 == 3;
                    c.softcap = k % 11 == 4 ? 5.0f : 0.0f;
                    c.tile_keys = k % 4 == 0 ? 16384 : 128u << (k % 3);  // one tile, or 128/256/512-key tiles
                    c.group_pairs = k % 6 == 1 ? 2 : 0;
                    ++k;
                    run_case(c, gemm, seed++);
                }
    // Long steps: T = 300 (chunked prefill) with many tiles and groups.
    Case a{128, 4, 16, 300, {IKV_FMT_F16}};
    run_case(a, gemm, seed++);
    Case b{128, 8, 64, 300, {IKV_FMT_INT8, IKV_FMT_F16, IKV_FMT_INT4}};
    b.q_dtype = IKV_DTYPE_BF16, b.out_dtype = IKV_DTYPE_F32, b.per_head = true, b.group_pairs = 3, b.softcap = 30.0f;
    run_case(b, gemm, seed++);
    if (!quick) {
        Case d{256, 1, 16, 300, {IKV_FMT_FP8_E4M3, IKV_FMT_BF16}};
        d.q_dtype = IKV_DTYPE_F32, d.out_dtype = IKV_DTYPE_BF16, d.with_empty = true, d.tile_keys = 256;
        run_case(d, gemm, seed++);
        Case e{64, 8, 16, 300, {IKV_FMT_INT4}};
        e.tile_keys = 16384;
        run_case(e, gemm, seed++);
    }
}

// Capture of the whole path in a graph: replays write the same bits as a plain run.
void check_graph(ikv::cuda::MultiTokenGemm *gemm) {
    std::vector<void *> allocs;
    const PageShape s{1, 2, 128, 16};
    const uint32_t T = 64, Hq = 8, D = 128;  // G = 4
    Rng rng(99);
    HostSeq hs;
    build_seq(s, 700, {IKV_FMT_F16, IKV_FMT_INT8}, rng, &hs);
    upload_seq(&hs, &allocs);
    HostList L = random_list(s, hs, rng, 0.7, false);
    uint32_t tokens = 0;
    for (const DevPage &d : L.pages) tokens += d.end - d.begin;
    std::vector<uint32_t> counts{uint32_t(L.pages.size())}, lens{hs.length};
    std::vector<uint16_t> qh(size_t(T) * Hq * D);
    for (auto &x : qh) x = ikv::f32_to_f16(rng.normal());
    ikv::cuda::DecodeParams p{};
    p.shape = s;
    p.n_seqs = 1;
    p.n_query_tokens = T;
    p.n_q_heads = Hq;
    p.lists = DevLists{to_device(L.pages, &allocs), to_device(counts, &allocs), uint32_t(L.pages.size()), 1};
    p.seq_len = to_device(lens, &allocs);
    p.q = to_device(qh, &allocs);
    p.q_dtype = p.out_dtype = IKV_DTYPE_F16;
    p.scale = 0.088f;
    p.max_pages = uint32_t(L.pages.size());
    const size_t n = size_t(T) * Hq * D;
    void *o1, *o2, *ws;
    CK(cudaMalloc(&o1, n * 2));
    CK(cudaMalloc(&o2, n * 2));
    ikv::cuda::MultiTokenTiling tiling;
    tiling.max_tile_keys = 256;
    CK(cudaMalloc(&ws, ikv::cuda::multi_token_workspace_bytes(p, tokens, tiling)));
    allocs.insert(allocs.end(), {o1, o2, ws});
    p.workspace = ws;
    p.out = o1;
    CK(ikv::cuda::multi_token_run(gemm, p, tokens, 0, tiling));
    CK(cudaDeviceSynchronize());  // the captured replays reuse the workspace on another stream
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    p.out = o2;
    CK(cudaMemsetAsync(o2, 0xFF, n * 2, st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const cudaError_t rerr = ikv::cuda::multi_token_run(gemm, p, tokens, st, tiling);
    CK(cudaStreamEndCapture(st, &graph));
    CK(rerr);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    bool same = true;
    for (int r = 0; r < 3; ++r) {
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        std::vector<uint16_t> a(n), b(n);
        CK(cudaMemcpy(a.data(), o1, n * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), o2, n * 2, cudaMemcpyDeviceToHost));
        same = same && a == b;
        CK(cudaMemsetAsync(o2, 0xFF, n * 2, st));
    }
    report(same, "gemm path captured in a CUDA graph: 3 replays bit-identical to a plain run");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    free_all(&allocs);
}

// ------------------------------------------------------------------ bench --

__global__ void fill_f16(uint16_t *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        uint32_t x = uint32_t(i) * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 0x2c1b3c6dU;
        x ^= x >> 12;
        p[i] = __half_as_ushort(__float2half(float(int(x % 2001u) - 1000) * 1e-3f));
    }
}

struct Row {
    std::string sel;
    uint32_t B, ctx, T;
    double fused_ms, gemm_ms, gemm_small_ms, flop;
};

void run_bench(const cudaDeviceProp &prop, bool quick, const char *out_dir, ikv::cuda::MultiTokenGemm *gemm) {
    const PageShape s{1, 8, 128, 16};
    const uint32_t Hq = 32, D = 128, P = 16, Hkv = 8, G = Hq / Hkv;
    const std::vector<uint32_t> Ts = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    const std::vector<uint32_t> Bs = {1, 4}, ctxs = quick ? std::vector<uint32_t>{8192}
                                                          : std::vector<uint32_t>{8192, 32768};
    const uint64_t pb = ikv::page_bytes(s, IKV_FMT_F16), l2 = uint64_t(prop.l2CacheSize);
    std::vector<Row> rows;
    Timer tm;
    // A second GEMM tiling: tile buffers within ~L2 (S stays in cache between the
    // GEMMs and the softmax) against the default budget.
    ikv::cuda::MultiTokenTiling small;
    small.tile_bytes = l2 / 2;
    for (uint32_t B : Bs)
        for (uint32_t ctx : ctxs) {
            const uint32_t n_pages = ctx / P;
            const uint64_t one = uint64_t(B) * n_pages * pb;
            const uint32_t nrot = uint32_t(std::max<uint64_t>(1, (3 * l2 + one - 1) / one));
            std::vector<void *> allocs;
            uint8_t *pool = nullptr;
            CK(cudaMalloc(&pool, one * nrot));
            allocs.push_back(pool);
            fill_f16<<<1024, 256>>>(reinterpret_cast<uint16_t *>(pool), one * nrot / 2, 12345u);
            CK(cudaGetLastError());
            for (int quarter = 0; quarter < 2; ++quarter) {
                std::vector<DevPage> flat(size_t(nrot) * B * n_pages);
                std::vector<uint32_t> cnt(size_t(nrot) * B);
                uint32_t max_tokens = 0;
                std::vector<std::vector<uint32_t>> positions(B);  // page starts read by sequence b
                for (uint32_t r = 0; r < nrot; ++r)
                    for (uint32_t b = 0; b < B; ++b) {
                        uint32_t n = 0;
                        DevPage *L = flat.data() + (size_t(r) * B + b) * n_pages;
                        for (uint32_t i = 0; i < n_pages; ++i) {
                            if (quarter && i + 1 < n_pages && hash32(b * 1000003u + i) % 4 != 0) continue;
                            DevPage d{};
                            d.base = pool + r * one + (uint64_t(b) * n_pages + i) * pb;
                            d.pos0 = i * P;
                            d.end = uint8_t(P);
                            d.format = IKV_FMT_F16;
                            L[n++] = d;
                            if (r == 0) positions[b].push_back(i * P);
                        }
                        cnt[size_t(r) * B + b] = n;
                        max_tokens = std::max(max_tokens, n * P);
                    }
                DevPage *dflat = to_device(flat, &allocs);
                uint32_t *dcnt = to_device(cnt, &allocs);
                std::vector<uint32_t> lens(B, ctx);
                for (uint32_t T : Ts) {
                    // Visible keys summed over query rows (causal), for the FLOP count.
                    double keys = 0;
                    for (uint32_t b = 0; b < B; ++b)
                        for (uint32_t t = 0; t < T; ++t) {
                            const uint32_t qpos = ctx - T + t;
                            for (uint32_t st : positions[b]) keys += st > qpos ? 0 : std::min(P, qpos - st + 1);
                        }
                    const double flop = 4.0 * D * keys * Hq;
                    std::vector<uint16_t> qh(size_t(B) * T * Hq * D);
                    for (size_t i = 0; i < qh.size(); ++i) qh[i] = ikv::f32_to_f16(float(int(i % 13) - 6) * 0.05f);
                    ikv::cuda::DecodeParams p{};
                    p.shape = s;
                    p.n_seqs = B;
                    p.n_query_tokens = T;
                    p.n_q_heads = Hq;
                    p.seq_len = to_device(lens, &allocs);
                    p.q = to_device(qh, &allocs);
                    p.q_dtype = p.out_dtype = IKV_DTYPE_F16;
                    p.scale = 1.0f / sqrtf(float(D));
                    p.max_pages = n_pages;
                    p.n_splits = ikv::cuda::decode_choose_splits(p, prop.multiProcessorCount);
                    const uint64_t ws_bytes =
                        std::max({ikv::cuda::decode_workspace_bytes(p, p.n_splits),
                                  ikv::cuda::multi_token_workspace_bytes(p, max_tokens),
                                  ikv::cuda::multi_token_workspace_bytes(p, max_tokens, small)});
                    void *ws = nullptr, *out = nullptr;
                    CK(cudaMalloc(&ws, ws_bytes));
                    CK(cudaMalloc(&out, qh.size() * 2));
                    p.workspace = ws;
                    p.out = out;
                    auto lists_of = [&](int k) {
                        const uint32_t r = uint32_t(k) % nrot;
                        return DevLists{dflat + size_t(r) * B * n_pages, dcnt + size_t(r) * B, n_pages, 1};
                    };
                    auto fused = [&](int k) {
                        ikv::cuda::DecodeParams q = p;
                        q.lists = lists_of(k);
                        CK(ikv::cuda::launch_decode(q, 0));
                    };
                    auto gemm_step = [&](int k, const ikv::cuda::MultiTokenTiling &t) {
                        ikv::cuda::DecodeParams q = p;
                        q.lists = lists_of(k);
                        const cudaError_t e = ikv::cuda::multi_token_run(gemm, q, max_tokens, 0, t);
                        if (e != cudaSuccess) {
                            fprintf(stderr, "multi_token_run: %s (%s)\n", cudaGetErrorName(e),
                                    ikv::cuda::multi_token_error(gemm));
                            exit(2);
                        }
                    };
                    // Fewer repetitions where one step is long (the fused kernel at large T).
                    auto timed = [&](auto &&step) {
                        step(0);
                        CK(cudaDeviceSynchronize());
                        cudaEvent_t a, b;
                        CK(cudaEventCreate(&a));
                        CK(cudaEventCreate(&b));
                        CK(cudaEventRecord(a));
                        step(1);
                        CK(cudaEventRecord(b));
                        CK(cudaEventSynchronize(b));
                        float once = 0;
                        CK(cudaEventElapsedTime(&once, a, b));
                        cudaEventDestroy(a);
                        cudaEventDestroy(b);
                        const int reps = once > 20 ? 3 : once > 2 ? 7 : 15, batch = once > 2 ? 1 : 8;
                        return tm.median_ms(step, reps, batch);
                    };
                    Row row{quarter ? "sel25" : "dense", B, ctx, T, 0, 0, 0, flop};
                    row.fused_ms = timed(fused);
                    row.gemm_ms = timed([&](int k) { gemm_step(k, ikv::cuda::MultiTokenTiling()); });
                    row.gemm_small_ms = timed([&](int k) { gemm_step(k, small); });
                    rows.push_back(row);
                    printf("%-5s B=%u ctx=%-5u T=%-4u fused %9.4f ms  gemm %9.4f ms  gemm(L2 tiles) %9.4f ms  "
                           "%.1f GFLOP\n",
                           row.sel.c_str(), B, ctx, T, row.fused_ms, row.gemm_ms, row.gemm_small_ms, flop / 1e9);
                    fflush(stdout);
                    CK(cudaDeviceSynchronize());
                    cudaFree(ws);
                    cudaFree(out);
                }
            }
            CK(cudaDeviceSynchronize());
            free_all(&allocs);
        }
    // Report: per shape, the table and the first T from which GEMM wins at every larger T.
    std::string md = "# fused kernel vs cuBLASLt multi-token path\n\ndevice: " + std::string(prop.name) +
                     "; Hq=32 Hkv=8 D=128 P=16, F16 pages, F16 q/out; TFLOP/s = 4*D*Hq*(visible keys summed over "
                     "query tokens) / time\n\n| sel | B | ctx | T | fused ms | fused TFLOP/s | gemm ms | gemm TFLOP/s "
                     "| gemm (L2 tiles) ms | best |\n|---|---|---|---|---|---|---|---|---|---|\n";
    std::string csv = "sel,B,ctx,T,fused_ms,gemm_ms,gemm_l2_ms,flop\n";
    std::string summary = "\nswitch-over (smallest T from which the GEMM path is faster at every larger T):\n";
    char line[400];
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row &r = rows[i];
        const double g = std::min(r.gemm_ms, r.gemm_small_ms);
        snprintf(line, sizeof line, "| %s | %u | %u | %u | %.4f | %.2f | %.4f | %.2f | %.4f | %s |\n", r.sel.c_str(), r.B,
                 r.ctx, r.T, r.fused_ms, r.flop / (r.fused_ms * 1e-3) / 1e12, r.gemm_ms,
                 r.flop / (r.gemm_ms * 1e-3) / 1e12, r.gemm_small_ms, g < r.fused_ms ? "gemm" : "fused");
        md += line;
        snprintf(line, sizeof line, "%s,%u,%u,%u,%.6f,%.6f,%.6f,%.0f\n", r.sel.c_str(), r.B, r.ctx, r.T, r.fused_ms,
                 r.gemm_ms, r.gemm_small_ms, r.flop);
        csv += line;
        const bool last = i + 1 == rows.size() || rows[i + 1].T < r.T;
        if (last) {  // end of one shape's T sweep: find the switch-over
            size_t j0 = i;
            while (j0 > 0 && rows[j0 - 1].T < rows[j0].T) --j0;
            uint32_t sw = 0;
            for (size_t j = i + 1; j-- > j0;) {
                if (std::min(rows[j].gemm_ms, rows[j].gemm_small_ms) < rows[j].fused_ms) sw = rows[j].T;
                else break;
            }
            snprintf(line, sizeof line, "  %s B=%u ctx=%u: %s\n", r.sel.c_str(), r.B, r.ctx,
                     sw ? ("T >= " + std::to_string(sw) + " (rows T*G >= " + std::to_string(sw * G) + ")").c_str()
                        : "never");
            summary += line;
        }
    }
    md += summary;
    printf("\n%s", md.c_str());
    if (out_dir && *out_dir) {
        const std::string d(out_dir);
        if (FILE *fp = fopen((d + "/multi_token_bench.md").c_str(), "w")) fputs(md.c_str(), fp), fclose(fp);
        if (FILE *fp = fopen((d + "/multi_token_bench.csv").c_str(), "w")) fputs(csv.c_str(), fp), fclose(fp);
    }
    (void)Hkv;
}

}  // namespace

int main(int argc, char **argv) {
    CheckArgs args;
    if (!parse_check_args(argc, argv, &args)) return 2;
    const bool check = args.check, bench = args.bench, quick = args.quick;
    const char *out_dir = args.out_dir;
    cudaDeviceProp prop{};
    if (!first_device(&prop)) return 77;
    ikv::cuda::MultiTokenGemm *gemm = nullptr;
    if (ikv::cuda::multi_token_create(&gemm) != cudaSuccess) {
        printf("FAIL: cuBLASLt handle: %s\n", ikv::cuda::multi_token_error(gemm));
        return 1;
    }
    if (check) {
        check_gemm(quick, gemm);
        check_graph(gemm);
        printf("%s: %d of %d multi-token checks passed\n", g_failures ? "FAIL" : "PASS", g_cases - g_failures, g_cases);
    }
    if (bench) run_bench(prop, quick, out_dir, gemm);
    ikv::cuda::multi_token_destroy(gemm);
    return g_failures ? 1 : 0;
}
