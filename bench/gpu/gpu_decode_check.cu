// Standalone check and benchmark of the CUDA kernels (kernels/*.cu).
//
//   gpu_decode_check [--check] [--bench] [--quick] [--out DIR]
//
// --check (default when neither is given):
//   decode   every format (and a mixed list) x head_dim 32/64/128/256 x group 1/4/8
//            x page 16/64 x partial bounds x 1 or 4 causal query tokens x split
//            counts, against a float64 reference computed on the stored
//            (dequantized) values with quant.hpp's reader;
//   quantize device quantize-on-write bytes == host write_subpage bytes (and
//            the key summaries == the host store's);
//   top-k    device Quest bounds vs float64 bounds, device selection == host
//            selection recomputed from the device bounds, and a decode over
//            the device-produced per-head lists.
//   Prints one PASS/FAIL line per case group and exits 1 on any failure.
// --bench: see gpu_bench.cuh (CUDA-event timing, markdown + CSV into DIR).
#include <string.h>

#include <algorithm>
#include <string>

#include "gpu_bench.cuh"
#include "gpu_check_common.cuh"

using namespace gpucheck;
using ikv::cuda::DevLists;
using ikv::cuda::DevPage;

namespace {


// Device copy of queries in a dtype; *rounded receives the values the kernel sees.
void *upload_q(const std::vector<float> &q, ikv_dtype dt, std::vector<float> *rounded, std::vector<void *> *allocs) {
    rounded->resize(q.size());
    if (dt == IKV_DTYPE_F32) {
        *rounded = q;
        return to_device(q, allocs);
    }
    std::vector<uint16_t> b(q.size());
    for (size_t i = 0; i < q.size(); ++i) b[i] = to_half_bits(q[i], dt), (*rounded)[i] = from_bits(b[i], dt);
    return to_device(b, allocs);
}

// Float64 attention over the pages of the lists (list per seq, or per seq x head).
void reference(const PageShape &s, uint32_t layer, const std::vector<HostSeq> &seqs,
               const std::vector<HostList> &lists, uint32_t list_heads, uint32_t T, uint32_t Hq,
               const std::vector<float> &q, float scale, float softcap, std::vector<double> *out,
               std::vector<double> *lse) {
    const uint32_t D = s.head_dim, Hkv = s.n_kv_heads, G = Hq / Hkv, P = s.page_size;
    const uint32_t B = uint32_t(seqs.size());
    out->assign(size_t(B) * T * Hq * D, 0.0);
    lse->assign(size_t(B) * T * Hq, -INFINITY);
    std::vector<float> krow(D), vrow(D);
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t h = 0; h < Hkv; ++h) {
            const HostList &L = lists[list_heads > 1 ? b * list_heads + h : b];
            // Gather the rows once: position, K, V.
            std::vector<uint32_t> pos;
            std::vector<float> K, V;
            for (size_t i = 0; i < L.pages.size(); ++i) {
                const DevPage &pg = L.pages[i];
                const uint32_t pi = L.page_idx[i];
                const uint8_t *sub = seqs[b].pages[pi].data() + ikv::subpage_offset(s, ikv_format(pg.format), layer, h);
                for (uint32_t r = pg.begin; r < pg.end; ++r) {
                    ikv::read_subpage_row(ikv_format(pg.format), P, D, sub, 0, r, krow.data());
                    ikv::read_subpage_row(ikv_format(pg.format), P, D, sub, 1, r, vrow.data());
                    pos.push_back(pg.pos0 + r);
                    K.insert(K.end(), krow.begin(), krow.end());
                    V.insert(V.end(), vrow.begin(), vrow.end());
                }
            }
            for (uint32_t t = 0; t < T; ++t)
                for (uint32_t g = 0; g < G; ++g) {
                    const uint32_t qh = h * G + g;
                    const size_t oi = (size_t(b) * T + t) * Hq + qh;
                    const uint32_t qpos = seqs[b].length - T + t;
                    std::vector<double> logit;
                    std::vector<size_t> used;
                    double m = -INFINITY;
                    for (size_t j = 0; j < pos.size(); ++j) {
                        if (pos[j] > qpos) continue;
                        double a = 0.0;
                        for (uint32_t d = 0; d < D; ++d) a += double(q[oi * D + d]) * K[j * D + d];
                        a *= scale;
                        if (softcap > 0.0f) a = softcap * tanh(a / softcap);
                        logit.push_back(a);
                        used.push_back(j);
                        m = std::max(m, a);
                    }
                    if (used.empty()) continue;
                    double l = 0.0;
                    std::vector<double> acc(D, 0.0);
                    for (size_t u = 0; u < used.size(); ++u) {
                        const double p = exp(logit[u] - m);
                        l += p;
                        for (uint32_t d = 0; d < D; ++d) acc[d] += p * V[used[u] * D + d];
                    }
                    for (uint32_t d = 0; d < D; ++d) (*out)[oi * D + d] = acc[d] / l;
                    (*lse)[oi] = m + log(l);
                }
        }
}

struct DecodeCase {
    uint32_t D, G, P, T;
    std::vector<ikv_format> fmts;
    ikv_dtype q_dtype = IKV_DTYPE_F32, out_dtype = IKV_DTYPE_F32;
    uint32_t splits = 0;  // 0 = auto
    bool per_head = false, with_empty = false;
    float softcap = 0.0f;
    bool force_simt = false;  // fp32 FMAs for F16/BF16 queries too (else tensor cores)
};

const char *fmt_name(ikv_format f) {
    static const char *n[] = {"f16", "bf16", "fp8", "int8", "int4"};
    return unsigned(f) < 5 ? n[f] : "?";
}

double out_tolerance(ikv_dtype dt) { return dt == IKV_DTYPE_F32 ? 1e-4 : dt == IKV_DTYPE_F16 ? 2e-3 : 1e-2; }
// F16/BF16 queries run on tensor cores with operands in the query's type
// (K, V and P rounded to it), fp32 accumulation: the error class of 16-bit
// operands (rel. L2 ~5e-4 for f16, ~4e-3 for bf16 on these inputs).
double operand_tolerance(ikv_dtype q_dtype) { return q_dtype == IKV_DTYPE_F32 ? 0.0 : q_dtype == IKV_DTYPE_F16 ? 2e-3 : 1e-2; }
double decode_tolerance(ikv_dtype q_dtype, ikv_dtype out_dtype) {
    return std::max(out_tolerance(out_dtype), operand_tolerance(q_dtype));
}
// lse: absolute error relative to 1 + |lse|; 16-bit operands move the logits by their rounding.
double lse_tolerance(ikv_dtype q_dtype) { return q_dtype == IKV_DTYPE_BF16 ? 1e-2 : 1e-3; }

// Runs the kernel on lists and compares with the float64 reference. Returns ok.
bool run_decode_and_compare(const PageShape &s, uint32_t layer, const std::vector<HostSeq> &seqs,
                            const std::vector<HostList> &lists, uint32_t list_heads, uint32_t T, uint32_t Hq,
                            ikv_dtype q_dtype, ikv_dtype out_dtype, uint32_t splits, float softcap, int n_sms,
                            double *err_out, std::vector<void *> *allocs, const DevLists *dev_lists_override,
                            bool force_simt = false) {
    const uint32_t B = uint32_t(seqs.size()), D = s.head_dim;
    Rng rng(1234 + D + Hq + T);
    std::vector<float> q(size_t(B) * T * Hq * D), qr;
    for (float &x : q) x = rng.normal();
    void *dq = upload_q(q, q_dtype, &qr, allocs);

    DevLists dl{};
    uint32_t max_pages = 0;
    if (dev_lists_override) {
        dl = *dev_lists_override;
        max_pages = dl.stride;
    } else {
        for (const HostList &L : lists) max_pages = std::max<uint32_t>(max_pages, uint32_t(L.pages.size()));
        const uint32_t stride = std::max<uint32_t>(max_pages, 1);
        std::vector<DevPage> flat(size_t(lists.size()) * stride);
        std::vector<uint32_t> counts(lists.size());
        for (size_t i = 0; i < lists.size(); ++i) {
            std::copy(lists[i].pages.begin(), lists[i].pages.end(), flat.begin() + i * stride);
            counts[i] = uint32_t(lists[i].pages.size());
        }
        dl.pages = to_device(flat, allocs);
        dl.counts = to_device(counts, allocs);
        dl.stride = stride;
        dl.list_heads = list_heads;
    }
    std::vector<uint32_t> lens(B);
    for (uint32_t b = 0; b < B; ++b) lens[b] = seqs[b].length;

    ikv::cuda::DecodeParams p{};
    p.shape = s;
    p.layer = layer;
    p.n_seqs = B;
    p.n_query_tokens = T;
    p.n_q_heads = Hq;
    p.lists = dl;
    p.seq_len = to_device(lens, allocs);
    p.q = dq;
    p.q_dtype = q_dtype;
    p.out_dtype = out_dtype;
    p.scale = 1.0f / sqrtf(float(D));
    p.softcap = softcap;
    p.max_pages = max_pages;
    p.compute = force_simt ? ikv::cuda::kComputeSimt : ikv::cuda::kComputeTensorCores;
    p.n_splits = splits ? splits : ikv::cuda::decode_choose_splits(p, n_sms);
    const size_t n_out = size_t(B) * T * Hq * D, n_lse = size_t(B) * T * Hq;
    const size_t esz = out_dtype == IKV_DTYPE_F32 ? 4 : 2;
    void *dout = nullptr;
    CK(cudaMalloc(&dout, n_out * esz));
    allocs->push_back(dout);
    CK(cudaMemset(dout, 0xFF, n_out * esz));  // NaN-fill: every element must be written
    float *dlse = nullptr;
    CK(cudaMalloc(&dlse, n_lse * 4));
    allocs->push_back(dlse);
    p.out = dout;
    p.lse = dlse;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ikv::cuda::decode_workspace_bytes(p, p.n_splits)));
    allocs->push_back(ws);
    p.workspace = ws;
    CK(ikv::cuda::launch_decode(p, 0));
    CK(cudaDeviceSynchronize());

    std::vector<float> got(n_out), got_lse(n_lse);
    if (out_dtype == IKV_DTYPE_F32) {
        CK(cudaMemcpy(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<uint16_t> b(n_out);
        CK(cudaMemcpy(b.data(), dout, n_out * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n_out; ++i) got[i] = from_bits(b[i], out_dtype);
    }
    CK(cudaMemcpy(got_lse.data(), dlse, n_lse * 4, cudaMemcpyDeviceToHost));

    std::vector<double> ref, ref_lse;
    reference(s, layer, seqs, lists, list_heads, T, Hq, qr, p.scale, softcap, &ref, &ref_lse);
    double num = 0.0, den = 0.0;
    bool ok = true;
    for (size_t i = 0; i < n_out; ++i) {
        if (!std::isfinite(got[i])) ok = false;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    for (size_t i = 0; i < n_lse; ++i) {
        if (std::isinf(ref_lse[i])) {
            if (!(std::isinf(got_lse[i]) && got_lse[i] < 0)) ok = false;
        } else if (!(fabs(got_lse[i] - ref_lse[i]) <= lse_tolerance(q_dtype) * (1.0 + fabs(ref_lse[i])))) {
            ok = false;
        }
    }
    *err_out = rel;
    return ok && rel <= decode_tolerance(force_simt ? IKV_DTYPE_F32 : q_dtype, out_dtype);
}

bool decode_case(const DecodeCase &c, int n_sms, uint64_t seed) {
    std::vector<void *> allocs;
    const PageShape s{2, 2, c.D, c.P};
    const uint32_t Hq = s.n_kv_heads * c.G;
    Rng rng(seed);
    std::vector<HostSeq> seqs;
    std::vector<HostList> lists;
    random_case(s, {c.P * 9 + 7, c.P * 4, c.P * 13 + 1}, c.fmts, c.per_head, c.with_empty, rng, &seqs, &lists,
                &allocs);
    const uint32_t list_heads = c.per_head ? s.n_kv_heads : 1;
    double err = 0;
    const bool ok = run_decode_and_compare(s, 1, seqs, lists, list_heads, c.T, Hq, c.q_dtype, c.out_dtype, c.splits,
                                           c.softcap, n_sms, &err, &allocs, nullptr, c.force_simt);
    char what[256];
    std::string fm;
    for (ikv_format f : c.fmts) fm += std::string(fm.empty() ? "" : "+") + fmt_name(f);
    snprintf(what, sizeof what,
             "decode D=%u G=%u P=%u T=%u fmt=%s q=%d out=%d splits=%u%s%s%s %s rel_l2=%.2e (tol %.0e)", c.D, c.G,
             c.P, c.T, fm.c_str(), int(c.q_dtype), int(c.out_dtype), c.splits, c.per_head ? " per-head-lists" : "",
             c.with_empty ? " empty-seq" : "", c.softcap > 0 ? " softcap" : "",
             c.force_simt || c.q_dtype == IKV_DTYPE_F32 ? "simt" : "tensor-cores", err,
             decode_tolerance(c.force_simt ? IKV_DTYPE_F32 : c.q_dtype, c.out_dtype));
    report(ok, what);
    free_all(&allocs);
    return ok;
}

void check_decode(bool quick, int n_sms) {
    const std::vector<std::vector<ikv_format>> fmt_sets = {
        {IKV_FMT_F16}, {IKV_FMT_BF16}, {IKV_FMT_FP8_E4M3}, {IKV_FMT_INT8}, {IKV_FMT_INT4},
        {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4, IKV_FMT_FP8_E4M3, IKV_FMT_BF16}};
    // D = 32 last, so the other head dims keep the cases (and seeds) they had before it.
    const uint32_t Ds[] = {64, 128, 256, 32}, Gs[] = {1, 4, 8}, Ps[] = {16, 64}, splits[] = {0, 1, 3};
    uint64_t seed = 1;
    int k = 0;
    for (uint32_t D : Ds)
        for (const auto &fm : fmt_sets)
            for (uint32_t G : Gs)
                for (uint32_t P : Ps) {
                    if (quick && (D != 128 || G != 4 || P != 16)) continue;
                    DecodeCase c{D, G, P, 1, fm};
                    c.splits = splits[k % 3];
                    c.T = (k % 4 == 1) ? 4 : 1;  // causal multi-token steps
                    c.per_head = k % 5 == 2;
                    c.with_empty = k % 7 == 3;
                    ++k;
                    // Every case on each path: F32 queries (fp32 FMAs), F16 and BF16 (tensor cores).
                    for (ikv_dtype qd : {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16}) {
                        c.q_dtype = qd;
                        decode_case(c, n_sms, seed++);
                    }
                }
    // Query/output dtypes, softcap, 16 query tokens (row chunks), T x G over 16 rows.
    DecodeCase a{128, 4, 16, 1, {IKV_FMT_F16}};
    a.q_dtype = IKV_DTYPE_F16, a.out_dtype = IKV_DTYPE_F16;
    decode_case(a, n_sms, seed++);
    a.q_dtype = IKV_DTYPE_BF16, a.out_dtype = IKV_DTYPE_BF16;
    decode_case(a, n_sms, seed++);
    a.q_dtype = IKV_DTYPE_F16, a.out_dtype = IKV_DTYPE_F32, a.force_simt = true;  // the fp32 path for F16 queries
    decode_case(a, n_sms, seed++);
    DecodeCase b{128, 4, 16, 1, {IKV_FMT_INT8}};
    b.softcap = 5.0f;
    for (ikv_dtype qd : {IKV_DTYPE_F32, IKV_DTYPE_F16}) {
        b.q_dtype = qd;
        decode_case(b, n_sms, seed++);
    }
    DecodeCase m{64, 8, 16, 16, {IKV_FMT_F16, IKV_FMT_INT4}};  // 128 rows: 8 (16 on tensor cores) per CTA
    m.splits = 2;
    for (ikv_dtype qd : {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16}) {
        m.q_dtype = qd;
        decode_case(m, n_sms, seed++);
    }
    // head_dim 32: softcap, F16/BF16 out, and 128 rows in row chunks (4 lanes per SIMT row).
    DecodeCase s32{32, 8, 16, 16, {IKV_FMT_INT4, IKV_FMT_F16, IKV_FMT_INT8}};
    s32.softcap = 5.0f, s32.splits = 3;
    for (ikv_dtype qd : {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16}) {
        s32.q_dtype = s32.out_dtype = qd;
        decode_case(s32, n_sms, seed++);
    }
    if (!quick) {
        DecodeCase w{256, 8, 64, 3, {IKV_FMT_BF16, IKV_FMT_FP8_E4M3}};
        DecodeCase e{128, 1, 16, 16, {IKV_FMT_INT4}};
        e.splits = 5;
        for (ikv_dtype qd : {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16}) {
            w.q_dtype = e.q_dtype = qd;
            decode_case(w, n_sms, seed++);
            decode_case(e, n_sms, seed++);
        }
    }
}

void check_quantize(bool quick) {
    const uint32_t Ds[] = {32, 64, 128, 256}, Ps[] = {16, 64};
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    Rng rng(77);
    int ok_n = 0, all_n = 0;
    for (uint32_t D : Ds)
        for (uint32_t P : Ps)
            for (ikv_format f : fmts) {
                if (quick && D != 128) continue;
                const PageShape s{2, 3, D, P};
                const uint32_t nv[] = {P, P / 2 + 1, 1};
                for (uint32_t n_valid : nv) {
                    std::vector<float> k(size_t(s.n_kv_heads) * P * D), v(k.size());
                    for (size_t i = 0; i < k.size(); ++i) {
                        k[i] = (i % 7 == 0 ? 30.0f : 1.0f) * rng.normal() + 0.25f;
                        v[i] = rng.normal();
                    }
                    if (f == IKV_FMT_F16) k[5] = 1e6f, v[9] = -7e4f;  // saturation
                    const size_t bytes = ikv::page_bytes(s, f);
                    std::vector<uint8_t> host(bytes, 0), dev(bytes, 0);
                    for (uint32_t h = 0; h < s.n_kv_heads; ++h)
                        ikv::write_subpage(f, P, D, k.data() + size_t(h) * P * D, v.data() + size_t(h) * P * D, D,
                                           n_valid, host.data() + ikv::subpage_offset(s, f, 1, h));
                    host_summaries(s, f, host.data(), 1, n_valid);
                    std::vector<void *> allocs;
                    uint8_t *dpage = nullptr;
                    CK(cudaMalloc(&dpage, bytes));
                    allocs.push_back(dpage);
                    CK(cudaMemset(dpage, 0, bytes));
                    const float *dk = to_device(k, &allocs), *dv = to_device(v, &allocs);
                    CK(ikv::cuda::launch_quantize_layer(s, f, dpage, 1, dk, dv, n_valid, nullptr, 0));
                    CK(cudaMemcpy(dev.data(), dpage, bytes, cudaMemcpyDeviceToHost));
                    free_all(&allocs);
                    ++all_n;
                    if (memcmp(host.data(), dev.data(), bytes) == 0) {
                        ++ok_n;
                    } else {
                        size_t i = 0;
                        while (host[i] == dev[i]) ++i;
                        printf("  quantize mismatch D=%u P=%u fmt=%s n_valid=%u first byte %zu: host %02x dev %02x\n",
                               D, P, fmt_name(f), n_valid, i, host[i], dev[i]);
                    }
                }
            }
    char what[128];
    snprintf(what, sizeof what, "quantize-on-write bytes == write_subpage (+ summaries): %d/%d pages", ok_n, all_n);
    report(ok_n == all_n, what);
}

// Host mirror of the selection rule (kernels/select_pages.cu) from given bounds.
std::vector<uint32_t> host_select(const std::vector<DevPage> &cand, const float *scores, uint32_t budget) {
    std::vector<uint32_t> order(cand.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    auto rank = [&](uint32_t i) {
        return cand[i].flags & IKV_PAGE_MANDATORY ? 0 : 1;
    };
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        if (rank(a) != rank(b)) return rank(a) < rank(b);
        if (rank(a) == 0) return a < b;
        if (scores[a] != scores[b]) return scores[a] > scores[b];
        return a < b;
    });
    std::vector<uint8_t> keep(cand.size(), 0);
    uint64_t run = 0;
    for (uint32_t i : order) {
        run += cand[i].end - cand[i].begin;
        if ((cand[i].flags & IKV_PAGE_MANDATORY) || run <= budget) keep[i] = 1;
    }
    std::vector<uint32_t> sel;
    for (uint32_t i = 0; i < cand.size(); ++i)
        if (keep[i]) sel.push_back(i);
    return sel;
}

// One head_dim and group size: the score kernel's geometry depends on D
// (D/32 lanes per page), its q+/q- staging and loop on G.
void check_topk_case(bool quick, int n_sms, uint32_t D, uint32_t G, uint32_t Hkv) {
    std::vector<void *> allocs;
    const PageShape s{1, Hkv, D, 16};
    const uint32_t Hq = s.n_kv_heads * G, T = 2;
    const std::vector<uint32_t> lens = quick ? std::vector<uint32_t>{16 * 300 + 5, 16 * 37}
                                             : std::vector<uint32_t>{16 * 5000 + 5, 16 * 37, 16 * 1200};
    const uint32_t B = uint32_t(lens.size());
    Rng rng(99);
    std::vector<HostSeq> seqs(B);
    std::vector<HostList> cands(B);
    uint32_t max_c = 0;
    for (uint32_t b = 0; b < B; ++b) {
        build_seq(s, lens[b], {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_F16, IKV_FMT_INT4}, rng, &seqs[b]);
        // Exact ties: full pages 4..7 of every 8 repeat the 4 before them (same
        // format, same keys, so the same bound), so budgets end inside runs of equal keys.
        for (size_t pg = 8; pg + 1 < seqs[b].pages.size(); ++pg)
            if (pg % 8 >= 4) seqs[b].pages[pg] = seqs[b].pages[pg - 4];
        upload_seq(&seqs[b], &allocs);
        HostList all = random_list(s, seqs[b], rng, 1.0, false);
        for (size_t i = 0; i < all.pages.size(); ++i)
            if (i < 2 || i + 4 >= all.pages.size()) all.pages[i].flags |= IKV_PAGE_MANDATORY;
        cands[b] = all;
        max_c = std::max<uint32_t>(max_c, uint32_t(all.pages.size()));
    }
    std::vector<DevPage> flat(size_t(B) * max_c);
    std::vector<uint32_t> counts(B);
    for (uint32_t b = 0; b < B; ++b) {
        std::copy(cands[b].pages.begin(), cands[b].pages.end(), flat.begin() + size_t(b) * max_c);
        counts[b] = uint32_t(cands[b].pages.size());
    }
    std::vector<float> q(size_t(B) * T * Hq * s.head_dim);
    for (float &x : q) x = rng.normal();
    ikv::cuda::TopkParams p{};
    p.shape = s;
    p.layer = 0;
    p.n_seqs = B;
    p.n_q_heads = Hq;
    p.n_query_tokens = T;
    p.q = to_device(q, &allocs);
    p.q_dtype = IKV_DTYPE_F32;
    p.candidates = DevLists{to_device(flat, &allocs), to_device(counts, &allocs), max_c, 1};
    p.max_candidates = max_c;
    p.token_budget = 16 * 40 + 3;
    std::vector<float> zero_scores(size_t(B) * s.n_kv_heads * max_c, 0.0f);
    p.scores = to_device(zero_scores, &allocs);
    std::vector<DevPage> out_init(size_t(B) * s.n_kv_heads * max_c);
    p.out_pages = to_device(out_init, &allocs);
    std::vector<uint32_t> oc(size_t(B) * s.n_kv_heads);
    p.out_counts = to_device(oc, &allocs);
    CK(ikv::cuda::launch_score_topk(p, nullptr, 0));
    CK(cudaDeviceSynchronize());
    std::vector<float> dscores(zero_scores.size());
    std::vector<DevPage> dout(out_init.size());
    CK(cudaMemcpy(dscores.data(), p.scores, dscores.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dout.data(), p.out_pages, dout.size() * sizeof(DevPage), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(oc.data(), p.out_counts, oc.size() * 4, cudaMemcpyDeviceToHost));

    bool scores_ok = true, sel_ok = true;
    double worst = 0;
    std::vector<HostList> sel_lists;
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
            const float *ds = dscores.data() + (size_t(b) * s.n_kv_heads + h) * max_c;
            for (uint32_t c = 0; c < counts[b]; ++c) {
                const DevPage &pg = cands[b].pages[c];
                const uint16_t *rec16 = reinterpret_cast<const uint16_t *>(
                    seqs[b].pages[cands[b].page_idx[c]].data() + ikv::summary_offset(s, ikv_format(pg.format), 0, h));
                std::vector<float> rec(3 * s.head_dim);
                ikv::decode_summary(rec16, s.head_dim, rec.data());
                double best = -INFINITY, mag = 0;
                for (uint32_t g = 0; g < G; ++g) {
                    double a = 0, m = 0;
                    for (uint32_t d = 0; d < s.head_dim; ++d) {
                        const double qd = q[(size_t(b) * T * Hq + h * G + g) * s.head_dim + d];
                        a += std::max(qd * rec[d], qd * rec[s.head_dim + d]);
                        m += fabs(qd) * std::max(fabs(rec[d]), fabs(rec[s.head_dim + d]));
                    }
                    best = std::max(best, a);
                    mag = std::max(mag, m);
                }
                const double e = fabs(ds[c] - best) / (1.0 + mag);
                worst = std::max(worst, e);
                if (!(e <= 1e-5)) scores_ok = false;
            }
            const std::vector<uint32_t> want = host_select(cands[b].pages, ds, p.token_budget);
            const DevPage *got = dout.data() + (size_t(b) * s.n_kv_heads + h) * max_c;
            const uint32_t n = oc[size_t(b) * s.n_kv_heads + h];
            if (n != want.size()) sel_ok = false;
            HostList hl;
            for (uint32_t i = 0; i < std::min<uint32_t>(n, uint32_t(want.size())); ++i) {
                const DevPage &w = cands[b].pages[want[i]];
                if (memcmp(&w, &got[i], sizeof(DevPage)) != 0) sel_ok = false;
                hl.pages.push_back(w);
                hl.page_idx.push_back(cands[b].page_idx[want[i]]);
            }
            sel_lists.push_back(hl);
        }
    char what[200];
    snprintf(what, sizeof what, "top-k Quest bounds vs float64, D=%u G=%u (worst scaled err %.1e, max candidates %u)",
             D, G, worst, max_c);
    report(scores_ok, what);
    snprintf(what, sizeof what, "top-k selection == host rule, D=%u G=%u (mandatory + budget prefix, %u seqs x %u heads)",
             D, G, B, s.n_kv_heads);
    report(sel_ok, what);
    // Decode straight from the device-produced per-head lists.
    DevLists dl{p.out_pages, p.out_counts, max_c, s.n_kv_heads};
    double err = 0;
    const bool ok = run_decode_and_compare(s, 0, seqs, sel_lists, s.n_kv_heads, T, Hq, IKV_DTYPE_F32, IKV_DTYPE_F32,
                                           0, 0.0f, n_sms, &err, &allocs, &dl);
    snprintf(what, sizeof what, "decode over device top-k lists, D=%u G=%u rel_l2=%.2e", D, G, err);
    report(ok, what);
    free_all(&allocs);
}

// {D, G, kv-heads}. Both score kernels walk several page groups per block
// once there are more groups than their grid target gives each (sequence,
// kv-head) (kernels/score_pages.cu): the SIMT kernel (IKV_CUDA_SCORE=simt)
// aims at ~1024 blocks of 64 pages at D = 128 (256 at D = 32), so the
// {64, 2, 32} case (96 lists of up to 40 groups) has blocks walk ~4 groups
// and {32, 1, 40} (120 lists of up to 20 groups) a few; the tensor-core
// kernel aims at ~132 blocks of 128 pages, so in the full run every case
// walks (22 blocks for 40 groups at 2 kv-heads, 2 at 32 and 40), with
// --quick only {32, 1, 40} does.
void check_topk(bool quick, int n_sms) {
    const uint32_t cases[][3] = {{128, 4, 2}, {64, 1, 2}, {256, 8, 2}, {128, 6, 2},
                                 {64, 2, 32},  {32, 4, 2}, {32, 1, 40}};
    for (const auto &c : cases) check_topk_case(quick, n_sms, c[0], c[1], c[2]);
}

// Score + top-k + decode captured in a CUDA graph on a non-default stream:
// the replay must write exactly what the eager launches wrote.
void check_graph(int n_sms) {
    std::vector<void *> allocs;
    const PageShape s{1, 4, 128, 16};
    const uint32_t G = 4, Hq = s.n_kv_heads * G, B = 2;
    Rng rng(2024);
    std::vector<HostSeq> seqs(B);
    std::vector<DevPage> flat;
    std::vector<uint32_t> counts(B), lens(B);
    uint32_t max_c = 0;
    for (uint32_t b = 0; b < B; ++b) {
        build_seq(s, 16 * (60 + 25 * b) + 3, {IKV_FMT_F16, IKV_FMT_INT8}, rng, &seqs[b]);
        upload_seq(&seqs[b], &allocs);
        max_c = std::max<uint32_t>(max_c, uint32_t(seqs[b].pages.size()));
        lens[b] = seqs[b].length;
    }
    flat.resize(size_t(B) * max_c);
    for (uint32_t b = 0; b < B; ++b) {
        HostList all = random_list(s, seqs[b], rng, 1.0, false);
        all.pages.back().flags |= IKV_PAGE_MANDATORY;
        std::copy(all.pages.begin(), all.pages.end(), flat.begin() + size_t(b) * max_c);
        counts[b] = uint32_t(all.pages.size());
    }
    std::vector<float> q(size_t(B) * Hq * s.head_dim);
    for (float &x : q) x = rng.normal();
    ikv::cuda::TopkParams t{};
    t.shape = s;
    t.n_seqs = B;
    t.n_q_heads = Hq;
    t.n_query_tokens = 1;
    std::vector<float> q_rounded;
    t.q = upload_q(q, IKV_DTYPE_F16, &q_rounded, &allocs);  // F16 queries: the tensor-core decode
    t.q_dtype = IKV_DTYPE_F16;
    t.candidates = DevLists{to_device(flat, &allocs), to_device(counts, &allocs), max_c, 1};
    t.max_candidates = max_c;
    t.token_budget = 16 * 20;
    std::vector<float> sc(size_t(B) * s.n_kv_heads * max_c);
    std::vector<DevPage> sel(sc.size());
    std::vector<uint32_t> oc(size_t(B) * s.n_kv_heads);
    t.scores = to_device(sc, &allocs);
    t.out_pages = to_device(sel, &allocs);
    t.out_counts = to_device(oc, &allocs);
    ikv::cuda::DecodeParams p{};
    p.shape = s;
    p.n_seqs = B;
    p.n_query_tokens = 1;
    p.n_q_heads = Hq;
    p.lists = DevLists{t.out_pages, t.out_counts, max_c, s.n_kv_heads};
    p.seq_len = to_device(lens, &allocs);
    p.q = t.q;
    p.q_dtype = t.q_dtype;
    p.compute = ikv::cuda::kComputeTensorCores;
    p.out_dtype = IKV_DTYPE_F32;
    p.scale = 1.0f / sqrtf(128.0f);
    p.max_pages = max_c;
    p.n_splits = ikv::cuda::decode_choose_splits(p, n_sms);
    std::vector<float> zeros(size_t(B) * Hq * s.head_dim, 0.0f), lz(size_t(B) * Hq, 0.0f);
    float *out = to_device(zeros, &allocs), *lse = to_device(lz, &allocs);
    p.out = out;
    p.lse = lse;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ikv::cuda::decode_workspace_bytes(p, p.n_splits)));
    allocs.push_back(ws);
    p.workspace = ws;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(ikv::cuda::launch_score_topk(t, nullptr, st));
    CK(ikv::cuda::launch_decode(p, st));
    CK(cudaStreamSynchronize(st));
    std::vector<float> eager(zeros.size()), replay(zeros.size());
    CK(cudaMemcpy(eager.data(), out, eager.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemset(out, 0, eager.size() * 4));
    CK(cudaMemset(t.out_counts, 0, oc.size() * 4));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const cudaError_t e1 = ikv::cuda::launch_score_topk(t, nullptr, st);
    const cudaError_t e2 = ikv::cuda::launch_decode(p, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(e1);
    CK(e2);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaGraphLaunch(exec, st));  // replays are repeatable
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(replay.data(), out, replay.size() * 4, cudaMemcpyDeviceToHost));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    free_all(&allocs);
    report(memcmp(eager.data(), replay.data(), eager.size() * 4) == 0,
           "CUDA graph capture of score + top-k + decode replays bit-identically");
}

}  // namespace

int main(int argc, char **argv) {
    CheckArgs args;
    if (!parse_check_args(argc, argv, &args)) return 2;
    const bool check = args.check, bench = args.bench, quick = args.quick;
    const char *out_dir = args.out_dir;
    cudaDeviceProp prop{};
    if (!first_device(&prop)) return 77;
    if (check) {
        check_quantize(quick);
        check_topk(quick, prop.multiProcessorCount);
        check_decode(quick, prop.multiProcessorCount);
        check_graph(prop.multiProcessorCount);
        printf("%s: %d of %d checks passed\n", g_failures ? "FAIL" : "PASS", g_cases - g_failures, g_cases);
    }
    if (bench) run_bench(prop, quick, out_dir);
    return g_failures ? 1 : 0;
}
