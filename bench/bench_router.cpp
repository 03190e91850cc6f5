// Time to route a synthetic agentic layout (system prompt, memory, documents,
// tool outputs, turns) of 8K / 32K / 128K tokens into a plan, the host-side
// work an engine pays once per decode step. Counters report the plan's share
// of tokens read and the modelled bytes (Llama-3-8B-like shape).
#include <benchmark/benchmark.h>

#include "intentkv.h"

namespace {

void BM_RouteSynthetic(benchmark::State &state) {
    ikv_synth_config sc = ikv_synth_default_config();
    sc.seq_len = static_cast<uint32_t>(state.range(0));
    sc.n_documents = static_cast<uint32_t>(state.range(1));
    sc.n_tool_outputs = sc.n_documents / 2;
    sc.n_turns = 8;
    ikv_layout *layout = nullptr;
    ikv_router *router = nullptr;
    ikv_router_config rc = ikv_router_default_config();
    rc.token_budget = sc.seq_len / 4;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    rc.memory_pressure = 0.6f;
    if (ikv_synth_layout(&sc, &layout) != IKV_OK || ikv_router_create(&rc, &router) != IKV_OK) {
        state.SkipWithError(ikv_last_error());
        return;
    }
    ikv_plan_summary summary{};
    ikv_plan_cost cost{};
    for (auto _ : state) {
        ikv_plan *plan = nullptr;
        if (ikv_router_route(router, layout, sc.seq_len, &plan) != IKV_OK) {
            state.SkipWithError(ikv_last_error());
            break;
        }
        benchmark::DoNotOptimize(plan);
        ikv_plan_get_summary(plan, &summary);
        ikv_plan_destroy(plan);
    }
    ikv_plan *plan = nullptr;
    if (ikv_router_route(router, layout, sc.seq_len, &plan) == IKV_OK) {
        const ikv_model_shape shape = ikv_model_shape_default();
        ikv_plan_get_cost(plan, &shape, &cost);
        ikv_plan_destroy(plan);
    }
    state.counters["blocks"] = static_cast<double>(ikv_layout_count(layout));
    state.counters["read_share"] = static_cast<double>(summary.tokens_selected) / sc.seq_len;
    state.counters["bytes_share"] =
        cost.bytes_dense_f16 ? static_cast<double>(cost.bytes_total) / static_cast<double>(cost.bytes_dense_f16) : 0;
    state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(sc.seq_len));
    ikv_router_destroy(router);
    ikv_layout_destroy(layout);
}

}  // namespace

BENCHMARK(BM_RouteSynthetic)
    ->ArgNames({"seq_len", "docs"})
    ->Args({8192, 8})
    ->Args({32768, 8})
    ->Args({131072, 8})
    ->Args({131072, 256})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
