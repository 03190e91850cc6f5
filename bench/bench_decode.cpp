// CPU decode throughput: one decode step (one query token, one layer) of a
// Llama-3-8B-like shape (32 q-heads, 8 kv-heads, head_dim 128, page 16) over
// 8K, 32K and 128K tokens, dense and with 25% of the pages selected, in F16,
// INT8, INT4 and FP8 pages; and (F16) query-aware top-k to a 25% token budget
// over every page (Quest bounds from the pages' key summaries, then decode).
//
// Counters:
//   read_GBps     K/V bytes read (ikv_decoder_last_bytes_read) per second
//   bw_share      read_GBps / the machine's read bandwidth measured by
//                 BM_ReadBandwidth in the same run (same thread count)
//   vs_dense      time of the dense case of the same format and context / this time
//   vs_f16        time of the F16 case of the same context and selection / this time
//   vs_sel        (top-k) time of the random 25% selection of the same context / this time
//
// Every benchmark uses all hardware threads (decoder n_threads = 0).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "intentkv.h"

namespace {

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16;

double g_read_bw = 0.0;  // bytes/s, from BM_ReadBandwidth
std::map<std::tuple<int, uint32_t, int>, double> g_seconds;  // (format, context, percent) -> s per step

unsigned n_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? n : 1;
}

// ---- read bandwidth: sum a 1 GiB float array with AVX2, all threads ----
__attribute__((target("avx2,fma"))) float sum_avx2(const float *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    float t = 0;
    for (float v : lanes) t += v;
    for (; i < n; ++i) t += x[i];
    return t;
}

void BM_ReadBandwidth(benchmark::State &state) {
    const size_t n = (size_t(1) << 30) / sizeof(float);  // 1 GiB, far beyond any last-level cache
    std::vector<float> x(n, 1.0f);
    const unsigned T = n_threads();
    double seconds = 0;
    for (auto _ : state) {
        std::vector<float> part(T);
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> th;
        for (unsigned t = 0; t < T; ++t)
            th.emplace_back([&, t] { part[t] = sum_avx2(x.data() + n / T * t, n / T); });
        for (auto &t : th) t.join();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        benchmark::DoNotOptimize(part.data());
    }
    g_read_bw = double(n * sizeof(float)) * double(state.iterations()) / seconds;
    state.counters["read_GBps"] = g_read_bw / 1e9;
    state.counters["threads"] = T;
}

// ---- one pool at a time (the largest is ~0.5 GiB) ----
struct Fixture {
    int fmt = -1;
    uint32_t ctx = 0;
    ikv_pool *pool = nullptr;
    ikv_seq_id seq = 0;
    ~Fixture() { ikv_pool_destroy(pool); }
};
std::unique_ptr<Fixture> g_fix;

Fixture &fixture(ikv_format fmt, uint32_t ctx) {
    if (g_fix && g_fix->fmt == fmt && g_fix->ctx == ctx) return *g_fix;
    g_fix.reset();
    auto f = std::make_unique<Fixture>();
    ikv_pool_config c = ikv_pool_default_config();
    c.n_layers = 1;
    c.n_kv_heads = kKvHeads;
    c.head_dim = kHeadDim;
    c.page_size = kPage;
    c.default_format = fmt;
    c.kv_dtype = IKV_DTYPE_F32;
    c.capacity_bytes = 1ull << 30;
    if (ikv_pool_create(&c, &f->pool) != IKV_OK || ikv_seq_create(f->pool, &f->seq) != IKV_OK) {
        std::fprintf(stderr, "pool: %s\n", ikv_last_error());
        std::abort();
    }
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd;
    const uint32_t chunk = 4096;
    std::vector<float> k(size_t(chunk) * kKvHeads * kHeadDim), v(k.size());
    for (uint32_t done = 0; done < ctx; done += chunk) {
        for (auto &x : k) x = nd(rng);
        for (auto &x : v) x = nd(rng);
        ikv_append a = ikv_append_default(f->pool, chunk);
        a.k = k.data();
        a.v = v.data();
        if (ikv_pool_append(f->pool, f->seq, &a) != IKV_OK) {
            std::fprintf(stderr, "append: %s\n", ikv_last_error());
            std::abort();
        }
    }
    f->fmt = fmt;
    f->ctx = ctx;
    g_fix = std::move(f);
    return *g_fix;
}

// A plan over a random (seeded) `percent`% of the pages.
ikv_plan *random_plan(uint32_t ctx, int percent) {
    const uint32_t pages = ctx / kPage;
    std::vector<uint32_t> ids(pages);
    for (uint32_t i = 0; i < pages; ++i) ids[i] = i;
    std::mt19937 rng(99);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(size_t(pages) * percent / 100);
    std::sort(ids.begin(), ids.end());
    std::vector<ikv_token_range> r;
    for (uint32_t p : ids) r.push_back({p * kPage, (p + 1) * kPage});
    ikv_plan *plan = nullptr;
    if (ikv_plan_from_ranges(r.data(), r.size(), ctx, kPage, IKV_FMT_F16, &plan) != IKV_OK) {
        std::fprintf(stderr, "plan: %s\n", ikv_last_error());
        std::abort();
    }
    return plan;
}

void BM_Decode(benchmark::State &state) {
    const auto fmt = ikv_format(state.range(0));
    const auto ctx = uint32_t(state.range(1));
    const int percent = int(state.range(2));  // negative: top-k to -percent% of the tokens
    const bool topk = percent < 0;
    Fixture &f = fixture(fmt, ctx);
    ikv_plan *plan = percent > 0 && percent < 100 ? random_plan(ctx, percent) : nullptr;
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = 0;  // all hardware threads
    ikv_decoder *dec = nullptr;
    ikv_decoder_create(&dc, &dec);
    std::vector<float> q(kQHeads * kHeadDim), out(q.size());
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    for (auto &x : q) x = nd(rng);
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &f.seq;
    const ikv_plan *plans[1] = {plan};
    a.plans = plan ? plans : nullptr;
    a.n_q_heads = kQHeads;
    a.q = q.data();
    a.out = out.data();
    if (topk) a.topk_token_budget = uint32_t(uint64_t(ctx) * uint32_t(-percent) / 100);
    double seconds = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        if (ikv_decode(dec, f.pool, &a) != IKV_OK) {
            state.SkipWithError(ikv_last_error());
            break;
        }
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        benchmark::DoNotOptimize(out.data());
    }
    uint64_t bytes = 0;
    ikv_decoder_last_bytes_read(dec, &bytes);
    const double per = seconds / double(state.iterations());
    g_seconds[{int(fmt), ctx, percent}] = per;
    state.counters["read_GBps"] = double(bytes) / per / 1e9;
    state.counters["MB_step"] = double(bytes) / 1e6;
    if (g_read_bw > 0) state.counters["bw_share"] = double(bytes) / per / g_read_bw;
    auto dense = g_seconds.find({int(fmt), ctx, 100});
    if (percent < 100 && dense != g_seconds.end()) state.counters["vs_dense"] = dense->second / per;
    auto sel = g_seconds.find({int(fmt), ctx, -percent});
    if (topk && sel != g_seconds.end()) state.counters["vs_sel"] = sel->second / per;  // random selection / top-k
    auto f16 = g_seconds.find({int(IKV_FMT_F16), ctx, percent});
    if (fmt != IKV_FMT_F16 && f16 != g_seconds.end()) state.counters["vs_f16"] = f16->second / per;
    state.SetLabel(std::string(ikv_format_name(fmt)) + (topk ? " top-k 25%" : percent < 100 ? " 25%" : " dense"));
    ikv_decoder_destroy(dec);
    ikv_plan_destroy(plan);
}

void register_all() {
    benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4, IKV_FMT_FP8_E4M3};
    for (uint32_t ctx : {8192u, 32768u, 131072u})
        for (ikv_format f : fmts)
            for (int pct : {100, 25, -25}) {
                if (pct < 0 && f != IKV_FMT_F16) continue;  // top-k: F16 pages only
                benchmark::RegisterBenchmark("BM_Decode", BM_Decode)
                    ->Args({f, ctx, pct})
                    ->Unit(benchmark::kMicrosecond)
                    ->UseRealTime()
                    ->MinTime(0.3);
            }
}

}  // namespace

int main(int argc, char **argv) {
    register_all();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
