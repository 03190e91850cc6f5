// KV page pool benchmarks (CPU backend), per page format:
//   BM_AppendBulk   prefill-like: 512 tokens into all layers at once (GB/s of K+V input)
//   BM_AppendToken  decode-like: one token into all layers (re-quantizes the partial tail page)
//   BM_FormatStats  no timing of interest: memory per token and quantization error as counters
// Shape: 4 layers, 8 kv-heads, head_dim 128, page_size 16, F16 engine K/V.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "intentkv.h"

namespace {

constexpr uint32_t kLayers = 4, kHeads = 8, kDim = 128, kPage = 16;

ikv_pool *make_pool(ikv_format f, ikv_dtype dt = IKV_DTYPE_F16, uint32_t page = kPage) {
    ikv_pool_config c = ikv_pool_default_config();
    c.n_layers = kLayers;
    c.n_kv_heads = kHeads;
    c.head_dim = kDim;
    c.page_size = page;
    c.capacity_bytes = 4ull << 30;
    c.default_format = f;
    c.kv_dtype = dt;
    ikv_pool *pool = nullptr;
    if (ikv_pool_create(&c, &pool) != IKV_OK) return nullptr;
    return pool;
}

std::vector<float> normal_data(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float &e : x) e = dist(gen);
    return x;
}

// fp32 -> F16, round to nearest even, for normal-range values (the engine's K/V here).
uint16_t to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax < 0x38800000u) return uint16_t(sign);  // tiny: flush (irrelevant for timing)
    ax += 0xC8000FFFu + ((ax >> 13) & 1u);
    return uint16_t(sign | (ax >> 13));
}

std::vector<uint16_t> f16_data(size_t n, uint32_t seed) {
    const std::vector<float> x = normal_data(n, seed);
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = to_f16(x[i]);
    return h;
}

void BM_AppendBulk(benchmark::State &state) {
    const ikv_format f = static_cast<ikv_format>(state.range(0));
    const uint32_t n = 512;
    ikv_pool *pool = make_pool(f);
    if (pool == nullptr) {
        state.SkipWithError(ikv_last_error());
        return;
    }
    const size_t elems = size_t(kLayers) * n * kHeads * kDim;
    const std::vector<uint16_t> k = f16_data(elems, 1), v = f16_data(elems, 2);
    ikv_append a = ikv_append_default(pool, n);
    a.layer = IKV_ALL_LAYERS;
    a.k = k.data();
    a.v = v.data();
    for (auto _ : state) {
        ikv_seq_id s;
        ikv_seq_create(pool, &s);
        if (ikv_pool_append(pool, s, &a) != IKV_OK) state.SkipWithError(ikv_last_error());
        ikv_seq_destroy(pool, s);
    }
    const double input_bytes = 2.0 * elems * sizeof(uint16_t);
    state.SetBytesProcessed(int64_t(state.iterations() * input_bytes));
    state.counters["GB/s_input"] =
        benchmark::Counter(input_bytes * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
    state.SetLabel(ikv_format_name(f));
    ikv_pool_destroy(pool);
}

void BM_AppendToken(benchmark::State &state) {
    const ikv_format f = static_cast<ikv_format>(state.range(0));
    ikv_pool *pool = make_pool(f);
    if (pool == nullptr) {
        state.SkipWithError(ikv_last_error());
        return;
    }
    const size_t elems = size_t(kLayers) * kHeads * kDim;
    const std::vector<uint16_t> k = f16_data(elems, 3), v = f16_data(elems, 4);
    ikv_append a = ikv_append_default(pool, 1);
    a.layer = IKV_ALL_LAYERS;
    a.k = k.data();
    a.v = v.data();
    ikv_seq_id s;
    ikv_seq_create(pool, &s);
    uint32_t len = 0;
    for (auto _ : state) {
        if (ikv_pool_append(pool, s, &a) != IKV_OK) state.SkipWithError(ikv_last_error());
        if (++len == 4096) {  // stay far from capacity
            state.PauseTiming();
            ikv_seq_truncate(pool, s, len);
            len = 0;
            state.ResumeTiming();
        }
    }
    const double input_bytes = 2.0 * elems * sizeof(uint16_t);
    state.SetBytesProcessed(int64_t(state.iterations() * input_bytes));
    state.counters["GB/s_input"] =
        benchmark::Counter(input_bytes * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
    state.counters["tokens/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
    state.SetLabel(ikv_format_name(f));
    ikv_pool_destroy(pool);
}

// Memory per token (per layer and kv-head, K+V, scales and summaries
// included) at page sizes 16 and 64, and the quantization error of N(0,1)
// data and of data with 1% outliers (x100) against the fp32 input.
void BM_FormatStats(benchmark::State &state) {
    const ikv_format f = static_cast<ikv_format>(state.range(0));
    double err[2] = {0, 0}, worst[2] = {0, 0};
    {
        ikv_pool *pool = make_pool(f, IKV_DTYPE_F32);
        const uint32_t n = 256;
        const size_t per_layer = size_t(n) * kHeads * kDim, elems = kLayers * per_layer;
        for (int kind = 0; kind < 2; ++kind) {
            std::vector<float> k = normal_data(elems, 10 + kind), v = normal_data(elems, 20 + kind);
            if (kind == 1)
                for (size_t i = 0; i < elems; i += 97) k[i] *= 100.0f, v[i] *= 100.0f;
            ikv_seq_id s;
            ikv_seq_create(pool, &s);
            ikv_append a = ikv_append_default(pool, n);
            a.layer = IKV_ALL_LAYERS;
            a.k = k.data();
            a.v = v.data();
            ikv_pool_append(pool, s, &a);
            std::vector<float> rk(per_layer), rv(per_layer);
            double num = 0, den = 0, amax = 0, emax = 0;
            for (uint32_t l = 0; l < kLayers; ++l) {
                ikv_seq_read(pool, s, l, 0, n, rk.data(), rv.data());
                for (size_t i = 0; i < per_layer; ++i)
                    for (int w = 0; w < 2; ++w) {
                        const double x = (w ? v : k)[l * per_layer + i], y = (w ? rv : rk)[i];
                        num += (y - x) * (y - x);
                        den += x * x;
                        amax = std::fmax(amax, std::fabs(x));
                        emax = std::fmax(emax, std::fabs(y - x));
                    }
            }
            err[kind] = std::sqrt(num / den);
            worst[kind] = emax / amax;
            ikv_seq_destroy(pool, s);
        }
        ikv_pool_destroy(pool);
    }
    double bpt[2];
    const uint32_t pages[2] = {16, 64};
    for (int i = 0; i < 2; ++i) {
        ikv_pool *pool = make_pool(f, IKV_DTYPE_F16, pages[i]);
        bpt[i] = double(ikv_pool_page_bytes(pool, f)) / (double(pages[i]) * kLayers * kHeads);
        ikv_pool_destroy(pool);
    }
    for (auto _ : state) benchmark::ClobberMemory();
    state.counters["bytes/token_P16"] = bpt[0];
    state.counters["bytes/token_P64"] = bpt[1];
    state.counters["relL2_normal"] = err[0];
    state.counters["relL2_outliers"] = err[1];
    state.counters["maxabs/absmax_normal"] = worst[0];
    state.counters["maxabs/absmax_outliers"] = worst[1];
    state.SetLabel(ikv_format_name(f));
}

void formats(benchmark::internal::Benchmark *b) {
    for (int f = 0; f < IKV_FMT_COUNT; ++f) b->Arg(f);
}

}  // namespace

BENCHMARK(BM_AppendBulk)->Apply(formats)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AppendToken)->Apply(formats)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FormatStats)->Apply(formats)->Iterations(1);

BENCHMARK_MAIN();
