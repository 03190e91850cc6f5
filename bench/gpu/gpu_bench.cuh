// GPU decode benchmark (issue "CUDA backend", item 7), run by
// gpu_decode_check --bench.
//
// Shapes: B in {1, 8, 32}, context {8K, 32K, 128K}, 32 q-heads, 8 kv-heads,
// head_dim 128, page 16, one query token. Cases: dense F16/INT8/FP8/INT4, 25%
// of pages selected (F16, INT8; a fixed pseudo-random quarter), and 25% chosen
// on the device by score + top-k within a ctx/4 token budget (F16).
// Timing: CUDA events around batches of kBatch steps queued behind a spin
// kernel (so host enqueue time never shows), each step on another copy of the
// pages so the working set exceeds L2 (>= 3x L2 across the copies); median of
// the batch means. Bytes read = K/V rows + scales of every selected sub-page
// (page_format.hpp subpage_read_bytes), summaries for the top-k case.
// Bandwidth share: bytes read per second over the device-to-device copy rate
// (read + write bytes) measured in the same run. For F16 the `stream` and
// `stream25` rows (`-bulk`: the bulk-copy engine) time the same lists on the
// same grid with the copies only (page_stream.cuh): the floor the decode's
// compute would reach if it were hidden completely.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_check_common.cuh"
#include "page_stream.cuh"

namespace gpucheck {

__global__ void spin_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    // Median over reps of the mean time (ms) of one step in a batch of `batch` steps.
    // IKV_BENCH_ONCE=1: run the step once and report 0 (for a profiler: one launch per kernel).
    template <typename F>
    double median_ms(F &&step, int reps, int batch) {
        static const bool once = getenv("IKV_BENCH_ONCE") != nullptr;
        if (once) {
            step(0);
            CK(cudaDeviceSynchronize());
            return 0.0;
        }
        for (int i = 0; i < 3; ++i) step(i);
        CK(cudaDeviceSynchronize());
        std::vector<double> t;
        int k = 0;
        for (int r = 0; r < reps; ++r) {
            spin_kernel<<<1, 1>>>(200000);
            CK(cudaEventRecord(a));
            for (int i = 0; i < batch; ++i) step(k++);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            t.push_back(double(ms) / batch);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

struct BenchRow {
    std::string name;
    uint32_t B, ctx;
    std::string fmt;
    double ms, bytes, gbps, share, topk_ms;
};

inline double copy_bandwidth(size_t bytes) {
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    Timer tm;
    const double ms = tm.median_ms([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 15, 4);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes / (ms * 1e-3) / 1e9;  // read + write
}

// One contiguous buffer read with 16-byte loads (nothing written): the read
// ceiling next to the copy rate, for the stream rows.
__global__ void read_kernel(const uint4 *p, size_t n, uint32_t *sink) {
    uint32_t x = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9E3779B9u) *sink = x;  // never in practice; keeps the reads
}
inline double read_bandwidth(size_t bytes) {
    void *a = nullptr, *sink = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(a, 1, bytes));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Timer tm;
    const double ms = tm.median_ms(
        [&](int) {
            read_kernel<<<8 * sms, 512>>>(static_cast<const uint4 *>(a), bytes / 16, static_cast<uint32_t *>(sink));
            CK(cudaGetLastError());
        },
        15, 4);
    cudaFree(a);
    cudaFree(sink);
    return bytes / (ms * 1e-3) / 1e9;
}

inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Pseudo-random page bytes, finite whatever format reads them. Each 16-bit
// word is hash & 0xBB3F: as F16 a value of magnitude < 1, as BF16 a finite
// one, each byte a finite FP8 E4M3 value (never 0x7F / 0xFF), INT8/INT4 codes
// anything. Key summaries are such bytes too, so query-aware scoring ranks
// distinct bounds as on real data (until 2026-11-24 the bench filled every
// byte with 0x11: all bounds equal, top-k a tie-broken prefix of the pages).
__global__ void fill_random_kernel(uint16_t *w, size_t n_words, uint32_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_words; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t x = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) ^ seed;
        x ^= x >> 16;
        x *= 0x7feb352dU;
        x ^= x >> 15;
        x *= 0x846ca68bU;
        x ^= x >> 16;
        w[i] = uint16_t(x & 0xBB3Fu);
    }
}

inline void run_bench(const cudaDeviceProp &prop, bool quick, const char *out_dir) {
    using ikv::cuda::DevLists;
    using ikv::cuda::DevPage;
    const double copy_gbps = copy_bandwidth(size_t(1) << 30);
    const double read_gbps = read_bandwidth(size_t(1) << 30);
    printf("device-to-device copy: %.0f GB/s (read + write); contiguous read: %.0f GB/s\n", copy_gbps, read_gbps);
    const PageShape s{1, 8, 128, 16};
    const uint32_t Hq = 32, D = 128, P = 16;
    const std::vector<uint32_t> Bs = quick ? std::vector<uint32_t>{1, 8} : std::vector<uint32_t>{1, 8, 32};
    const std::vector<uint32_t> ctxs =
        quick ? std::vector<uint32_t>{8192, 32768} : std::vector<uint32_t>{8192, 32768, 131072};
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_FP8_E4M3, IKV_FMT_INT4};
    const char *fnames[] = {"f16", "bf16", "fp8", "int8", "int4"};
    const int reps = quick ? 7 : 15, batch = 8;
    std::vector<BenchRow> rows;
    Timer tm;
    uint32_t *sink = nullptr;  // the stream rows' never-written output
    CK(cudaMalloc(&sink, 4));
    // IKV_BENCH_B / IKV_BENCH_CTX (optional) restrict the run to one batch size / context (profiling).
    // IKV_BENCH_FMT (f16, fp8, int8, int4) restricts the formats the same way.
    const char *only_b = getenv("IKV_BENCH_B"), *only_ctx = getenv("IKV_BENCH_CTX"), *only_f = getenv("IKV_BENCH_FMT");
    // IKV_BENCH_SWEEP=1 also times each case at a range of split counts (B = 1: 8..128; else 1..24).
    const bool sweep = getenv("IKV_BENCH_SWEEP") != nullptr;
    for (uint32_t B : Bs)
        for (uint32_t ctx : ctxs)
            for (ikv_format f : fmts) {
                if ((only_b && uint32_t(atoi(only_b)) != B) || (only_ctx && uint32_t(atoi(only_ctx)) != ctx) ||
                    (only_f && strcmp(only_f, fnames[f]) != 0))
                    continue;
                const uint32_t n_pages = ctx / P;
                const uint64_t pb = ikv::page_bytes(s, f);
                const uint64_t one = uint64_t(B) * n_pages * pb;
                const uint64_t l2 = uint64_t(prop.l2CacheSize);
                // Rotation copies so that the SMALLEST read set cycled (sel25: a quarter of the
                // pages) spans at least 3x L2: no case is served from L2. (Until 2026-11-23 this was
                // sized on the dense bytes, so sel25 at B = 1, 8K and 32K re-read an L2-resident
                // quarter: bench/RESULTS.md section 1e.)
                const uint64_t smallest_read = std::max<uint64_t>(1, one / 4);
                const uint32_t nrot = uint32_t(std::max<uint64_t>(1, (3 * l2 + smallest_read - 1) / smallest_read));
                std::vector<void *> allocs;
                uint8_t *pool = nullptr;
                if (cudaMalloc(&pool, one * nrot) != cudaSuccess) {
                    cudaGetLastError();
                    printf("skip B=%u ctx=%u %s: %.1f GB does not fit\n", B, ctx, fnames[f], one * nrot / 1e9);
                    continue;
                }
                allocs.push_back(pool);
                fill_random_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t *>(pool), one * nrot / 2, 0x5EEDu);
                CK(cudaGetLastError());
                // Lists: dense and a fixed pseudo-random quarter, per rotation copy.
                // *max_count: the longest list (sizes the split count, as the library's plan staging does).
                auto make_lists = [&](bool quarter, uint64_t *bytes, uint32_t *max_count = nullptr) {
                    std::vector<DevPage> flat(size_t(nrot) * B * n_pages);
                    std::vector<uint32_t> counts(size_t(nrot) * B);
                    *bytes = 0;
                    for (uint32_t r = 0; r < nrot; ++r)
                        for (uint32_t b = 0; b < B; ++b) {
                            uint32_t n = 0;
                            DevPage *L = flat.data() + (size_t(r) * B + b) * n_pages;
                            for (uint32_t i = 0; i < n_pages; ++i) {
                                // The newest page is always read (the query's own token).
                                if (quarter && i + 1 < n_pages && hash32(b * 1000003u + i) % 4 != 0) continue;
                                DevPage d{};
                                d.base = pool + r * one + (uint64_t(b) * n_pages + i) * pb;
                                d.pos0 = i * P;
                                d.begin = 0;
                                d.end = uint8_t(P);
                                d.format = uint8_t(f);
                                L[n++] = d;
                                if (r == 0) *bytes += s.n_kv_heads * ikv::subpage_read_bytes(f, P, D, P);
                            }
                            counts[size_t(r) * B + b] = n;
                        }
                    if (max_count) *max_count = *std::max_element(counts.begin(), counts.end());
                    return std::make_pair(to_device(flat, &allocs), to_device(counts, &allocs));
                };
                std::vector<uint32_t> lens(B, ctx);
                std::vector<uint16_t> qh(size_t(B) * Hq * D);
                for (size_t i = 0; i < qh.size(); ++i) qh[i] = ikv::f32_to_f16(float(int(i % 13) - 6) * 0.05f);
                ikv::cuda::DecodeParams p{};
                p.shape = s;
                p.layer = 0;
                p.n_seqs = B;
                p.n_query_tokens = 1;
                p.n_q_heads = Hq;
                p.seq_len = to_device(lens, &allocs);
                p.q = to_device(qh, &allocs);
                p.q_dtype = IKV_DTYPE_F16;
                p.out_dtype = IKV_DTYPE_F16;
                p.scale = 1.0f / sqrtf(float(D));
                p.max_pages = n_pages;
                p.formats = 1u << f;
                // Workspace for the larger split count of the two compute paths timed below.
                uint64_t ws_bytes = 0;
                for (uint32_t c : {ikv::cuda::kComputeSimt, ikv::cuda::kComputeTensorCores}) {
                    ikv::cuda::DecodeParams q = p;
                    q.compute = c;
                    const uint32_t sp = std::max(sweep ? 128u : 0u, ikv::cuda::decode_choose_splits(q, prop.multiProcessorCount));
                    ws_bytes = std::max(ws_bytes, ikv::cuda::decode_workspace_bytes(q, sp));
                }
                p.n_splits = ikv::cuda::decode_choose_splits(p, prop.multiProcessorCount);
                void *ws = nullptr, *out = nullptr;
                CK(cudaMalloc(&ws, ws_bytes));
                CK(cudaMalloc(&out, size_t(B) * Hq * D * 2));
                allocs.push_back(ws);
                allocs.push_back(out);
                p.workspace = ws;
                p.out = out;

                const bool quarter_too = f == IKV_FMT_F16 || f == IKV_FMT_INT8;
                auto add_row = [&](const std::string &name, double ms, uint64_t bytes) {
                    BenchRow row{name, B, ctx, fnames[f], ms, double(bytes), 0, 0, 0};
                    row.gbps = bytes / (ms * 1e-3) / 1e9;
                    row.share = row.gbps / copy_gbps;
                    rows.push_back(row);
                    printf("%-6s B=%-3u ctx=%-6u %-5s %9.4f ms %9.1f MB %7.0f GB/s %5.1f%% of copy\n", row.name.c_str(),
                           B, ctx, row.fmt.c_str(), ms, bytes / 1e6, row.gbps, 100 * row.share);
                    fflush(stdout);
                };
                // Variants: dense and (F16, INT8) a 25% selection, on the compute the library
                // picks by default (decode_resolve_compute: tensor cores for INT8/FP8/INT4 pages
                // with enough chunks per CTA, else SIMT), then on the other one (-tc / -simt)
                // to show what the choice is worth.
                for (int variant = 0; variant < 4; ++variant) {
                    const bool quarter = variant % 2 == 1, other = variant >= 2;
                    if (quarter && !quarter_too) continue;
                    uint64_t bytes = 0;
                    uint32_t longest = 0;
                    auto lists = make_lists(quarter, &bytes, &longest);
                    const uint32_t stride = n_pages;
                    ikv::cuda::DecodeParams v = p;
                    v.max_pages = longest;  // the library sizes splits and picks the compute on this
                    const uint32_t chosen =
                        ikv::cuda::decode_resolve_compute(v, quarter ? ctx / 4 : ctx, prop.multiProcessorCount,
                                                          [] { int d = 0; cudaGetDevice(&d); return ikv::cuda::device_memory_gbps_per_sm(d); }());
                    v.compute = !other ? chosen
                                : chosen == ikv::cuda::kComputeTensorCores ? ikv::cuda::kComputeSimt
                                                                            : ikv::cuda::kComputeTensorCores;
                    v.n_splits = ikv::cuda::decode_choose_splits(v, prop.multiProcessorCount);
                    const std::string name = std::string(quarter ? "sel25" : "dense") +
                                             (!other ? "" : v.compute == ikv::cuda::kComputeTensorCores ? "-tc" : "-simt");
                    // One step on the rotation's k-th copy of the lists, with parameters w.
                    auto step_of = [&](const ikv::cuda::DecodeParams &w) {
                        return [&, w](int k) {
                            ikv::cuda::DecodeParams q = w;
                            const uint32_t r = uint32_t(k) % nrot;
                            q.lists =
                                DevLists{lists.first + size_t(r) * B * stride, lists.second + size_t(r) * B, stride, 1};
                            CK(ikv::cuda::launch_decode(q, 0));
                        };
                    };
                    const double ms = tm.median_ms(step_of(v), reps, batch);
                    if (sweep && !other) {
                        // IKV_BENCH_SWEEP=1: the same step at other split counts (tunes decode_choose_splits).
                        printf("sweep %s B=%u ctx=%u %s (chosen %u splits):", name.c_str(), B, ctx, fnames[f], v.n_splits);
                        const std::vector<uint32_t> counts = B == 1 ? std::vector<uint32_t>{8, 16, 24, 32, 48, 64, 96, 128}
                                                                    : std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24};
                        for (uint32_t sp : counts) {
                            ikv::cuda::DecodeParams w = v;
                            w.n_splits = sp;
                            if (ikv::cuda::decode_workspace_bytes(w, sp) > ws_bytes) continue;
                            printf(" %u:%.4f", sp, tm.median_ms(step_of(w), reps, batch));
                        }
                        printf(" ms\n");
                    }
                    add_row(name, ms, bytes);
                    if (f == IKV_FMT_F16 && !other) {
                        // The same lists and grid with the copies only (page_stream.cuh): the decode's floor.
                        for (int copy : {kCpAsync, kBulk}) {
                            if (copy == kBulk && prop.major < 9) continue;  // the bulk-copy engine is sm_90+
                            auto stream_step = [&](int k) {
                                const uint32_t r = uint32_t(k) % nrot;
                                const DevLists l{lists.first + size_t(r) * B * stride, lists.second + size_t(r) * B, stride, 1};
                                CK(launch_stream_pages(copy, s, l, B, v.n_splits, sink, 0));
                            };
                            add_row(std::string(quarter ? "stream25" : "stream") + (copy == kBulk ? "-bulk" : ""),
                                    tm.median_ms(stream_step, reps, batch), bytes);
                        }
                    }
                }
                if (f == IKV_FMT_F16) {
                    // Device selection: candidates = every page, budget = a quarter of the context.
                    uint64_t dense_bytes = 0;
                    auto cand = make_lists(false, &dense_bytes);
                    ikv::cuda::TopkParams t{};
                    t.shape = s;
                    t.layer = 0;
                    t.n_seqs = B;
                    t.n_q_heads = Hq;
                    t.n_query_tokens = 1;
                    t.q = p.q;
                    t.q_dtype = p.q_dtype;
                    t.max_candidates = n_pages;
                    t.token_budget = ctx / 4;
                    if (n_pages <= ikv::cuda::kMaxTopkCandidates) {
                        float *scores = nullptr;
                        DevPage *sel = nullptr;
                        uint32_t *cnt = nullptr;
                        CK(cudaMalloc(&scores, size_t(B) * s.n_kv_heads * n_pages * 4));
                        CK(cudaMalloc(&sel, size_t(B) * s.n_kv_heads * n_pages * sizeof(DevPage)));
                        CK(cudaMalloc(&cnt, size_t(B) * s.n_kv_heads * 4));
                        allocs.push_back(scores);
                        allocs.push_back(sel);
                        allocs.push_back(cnt);
                        t.scores = scores;
                        t.out_pages = sel;
                        t.out_counts = cnt;
                        auto topk_only = [&](int k) {
                            ikv::cuda::TopkParams u = t;
                            const uint32_t r = uint32_t(k) % nrot;
                            u.candidates = DevLists{cand.first + size_t(r) * B * n_pages, cand.second + size_t(r) * B,
                                                    n_pages, 1};
                            CK(ikv::cuda::launch_score_topk(u, nullptr, 0));
                        };
                        // Split count sized on the budget's pages, as the library does after top-k.
                        ikv::cuda::DecodeParams tp = p;
                        tp.max_pages = std::min<uint32_t>(n_pages, (ctx / 4 + P - 1) / P + 1);
                        tp.n_splits = ikv::cuda::decode_choose_splits(tp, prop.multiProcessorCount);
                        auto full = [&](int k) {
                            topk_only(k);
                            ikv::cuda::DecodeParams q = tp;
                            q.lists = DevLists{sel, cnt, n_pages, s.n_kv_heads};
                            CK(ikv::cuda::launch_decode(q, 0));
                        };
                        const double tk = tm.median_ms(topk_only, reps, batch);
                        const double ms = tm.median_ms(full, reps, batch);
                        // Selected bytes ~ budget share of the dense bytes, plus k_min/k_max of every page and head.
                        const double sel_bytes = double(dense_bytes) * (ctx / 4) / double(ctx) +
                                                 double(B) * n_pages * s.n_kv_heads * ikv::summary_bound_bytes(D);
                        BenchRow row{"topk25", B, ctx, "f16", ms, sel_bytes, 0, 0, tk};
                        row.gbps = sel_bytes / (ms * 1e-3) / 1e9;
                        row.share = row.gbps / copy_gbps;
                        rows.push_back(row);
                        printf("topk25 B=%-3u ctx=%-6u f16   %9.4f ms (score+topk %.4f ms) %7.0f GB/s\n", B, ctx, ms, tk,
                               row.gbps);
                        fflush(stdout);
                    }
                }
                CK(cudaDeviceSynchronize());
                free_all(&allocs);
            }
    cudaFree(sink);
    // Reports.
    std::string md = "# intentkv CUDA decode benchmark\n\ndevice: " + std::string(prop.name) +
                     "; device-to-device copy " + std::to_string(int(copy_gbps)) +
                     " GB/s (read+write); contiguous read " + std::to_string(int(read_gbps)) +
                     " GB/s\n\n| case | B | ctx | format | ms/step | MB read | GB/s | % of copy | score+topk ms |\n"
                     "|---|---|---|---|---|---|---|---|---|\n";
    std::string csv = "case,B,ctx,format,ms,bytes,gbps,share_of_copy,topk_ms,copy_gbps\n";
    char line[512];
    for (const BenchRow &r : rows) {
        snprintf(line, sizeof line, "| %s | %u | %u | %s | %.4f | %.1f | %.0f | %.1f | %s |\n", r.name.c_str(), r.B,
                 r.ctx, r.fmt.c_str(), r.ms, r.bytes / 1e6, r.gbps, 100 * r.share,
                 r.topk_ms > 0 ? std::to_string(r.topk_ms).c_str() : "");
        md += line;
        snprintf(line, sizeof line, "%s,%u,%u,%s,%.6f,%.0f,%.1f,%.4f,%.6f,%.1f\n", r.name.c_str(), r.B, r.ctx,
                 r.fmt.c_str(), r.ms, r.bytes, r.gbps, r.share, r.topk_ms, copy_gbps);
        csv += line;
    }
    printf("\n%s", md.c_str());
    if (out_dir && *out_dir) {
        const std::string d(out_dir);
        if (FILE *fp = fopen((d + "/gpu_bench.md").c_str(), "w")) fputs(md.c_str(), fp), fclose(fp);
        if (FILE *fp = fopen((d + "/gpu_bench.csv").c_str(), "w")) fputs(csv.c_str(), fp), fclose(fp);
    }
}

}  // namespace gpucheck
