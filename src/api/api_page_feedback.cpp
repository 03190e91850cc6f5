// extern "C" boundary of attention feedback: argument checks and error
// sentences; the averages live in src/feedback/, the shares are measured by
// the decode (src/decode/cpu_decode.cpp).
#include <algorithm>
#include <vector>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "common/host_memory.hpp"
#include "feedback/page_feedback.hpp"
#include "layout/layout.hpp"
#include "pool/pool_view.hpp"

extern "C" {

IKV_API ikv_page_feedback_config ikv_page_feedback_default_config(void) {
    ikv_page_feedback_config c{};
    c.struct_size = sizeof c;
    c.rate = 0.25f;
    return c;
}

IKV_API ikv_status ikv_page_feedback_create(const ikv_pool *pool, const ikv_page_feedback_config *config,
                                            ikv_page_feedback **out) {
    const char *fn = "ikv_page_feedback_create";
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(config, sizeof(ikv_page_feedback_config), fn);
    const ikv_page_feedback_config c = ikv::read_config(*config, ikv_page_feedback_default_config());
    if (!(c.rate > 0.0f && c.rate <= 1.0f))
        return ikv::fail(IKV_E_INVALID, "%s: config->rate %.9g is outside (0, 1]", fn, (double)c.rate);
    ikv_page_feedback *f = ikv::new_handle<ikv_page_feedback>();
    if (f == nullptr) return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    f->pool = pool;
    f->n_layers = ikv::pool_shape(pool).n_layers;
    f->n_kv_heads = ikv::pool_shape(pool).n_kv_heads;
    f->rate = c.rate;
    *out = f;
    return IKV_OK;
}

IKV_API void ikv_page_feedback_destroy(ikv_page_feedback *feedback) { ikv::delete_handle(feedback); }

IKV_API ikv_status ikv_page_feedback_get(const ikv_page_feedback *feedback, ikv_seq_id seq, uint32_t layer,
                                         uint32_t kv_head, float *mass, uint32_t capacity, uint32_t *n_pages_out) {
    const char *fn = "ikv_page_feedback_get";
    IKV_CHECK_NULL(feedback, fn);
    IKV_CHECK_NULL(n_pages_out, fn);
    if (capacity > 0) IKV_CHECK_NULL(mass, fn);
    if (layer >= feedback->n_layers)
        return ikv::fail(IKV_E_RANGE, "%s: layer %u is out of range, the pool has %u layers", fn, layer,
                         feedback->n_layers);
    if (kv_head >= feedback->n_kv_heads)
        return ikv::fail(IKV_E_RANGE, "%s: kv_head %u is out of range, the pool has %u kv-heads", fn, kv_head,
                         feedback->n_kv_heads);
    const ikv::CallName call(fn);  // a CUDA decode's shares still in flight join first
    const ikv_status st = feedback->settle();
    if (st != IKV_OK) return st;
    const ikv::PageAverages *a = feedback->averages(seq, layer, kv_head);
    const uint32_t n = a ? a->n_fed : 0;
    for (uint32_t p = 0; p < capacity; ++p) mass[p] = p < n ? a->avg[p] : 0.0f;
    *n_pages_out = n;
    return IKV_OK;
}

IKV_API ikv_status ikv_page_feedback_block_scores(const ikv_page_feedback *feedback, ikv_seq_id seq,
                                                  ikv_layout *layout) {
    const char *fn = "ikv_page_feedback_block_scores";
    IKV_CHECK_NULL(feedback, fn);
    IKV_CHECK_NULL(layout, fn);
    return ikv::api_call(fn, [&] {
        const ikv_status st = feedback->settle();  // a CUDA decode's shares still in flight join first
        if (st != IKV_OK) return st;
        const uint32_t P = ikv::pool_shape(feedback->pool).page_size;
        const uint32_t LH = feedback->n_layers * feedback->n_kv_heads;
        std::vector<double> block_mass(layout->blocks.size(), 0.0);
        std::vector<uint8_t> seen(layout->blocks.size(), 0);
        for (uint32_t l = 0; l < feedback->n_layers; ++l)
            for (uint32_t h = 0; h < feedback->n_kv_heads; ++h) {
                const ikv::PageAverages *pa = feedback->averages(seq, l, h);
                if (pa == nullptr) continue;
                for (size_t b = 0; b < layout->blocks.size(); ++b) {
                    const ikv_block_info &blk = layout->blocks[b];
                    if (blk.policy != IKV_POLICY_ATTEND) continue;
                    const uint64_t p1 = std::min<uint64_t>((uint64_t(blk.end) + P - 1) / P, pa->fed.size());
                    for (uint64_t p = blk.start / P; p < p1; ++p)  // a page read with share 0 counts as fed back
                        if (pa->fed[p]) block_mass[b] += pa->avg[p], seen[b] = 1;
                }
            }
        double top = 0.0;
        for (size_t b = 0; b < block_mass.size(); ++b) top = std::max(top, block_mass[b] / LH);
        // Every fed-back block divided by the largest (0 where all fed-back mass is 0: they were read and
        // received none). No allocation below: nothing can fail half-way.
        for (size_t b = 0; b < block_mass.size(); ++b)
            if (seen[b]) layout->blocks[b].score = top > 0.0 ? float(std::min(1.0, block_mass[b] / LH / top)) : 0.0f;
        return IKV_OK;
    });
}

// forget and reset settle first: a CUDA decode's shares in flight were measured
// before the call, so they are forgotten with the rest (and a failed copy is
// reported with nothing forgotten).
IKV_API ikv_status ikv_page_feedback_forget(ikv_page_feedback *feedback, ikv_seq_id seq) {
    const char *fn = "ikv_page_feedback_forget";
    IKV_CHECK_NULL(feedback, fn);
    const ikv::CallName call(fn);
    const ikv_status st = feedback->settle();
    if (st != IKV_OK) return st;
    feedback->seqs.erase(seq);
    return IKV_OK;
}

IKV_API ikv_status ikv_page_feedback_reset(ikv_page_feedback *feedback) {
    const char *fn = "ikv_page_feedback_reset";
    IKV_CHECK_NULL(feedback, fn);
    const ikv::CallName call(fn);
    const ikv_status st = feedback->settle();
    if (st != IKV_OK) return st;
    feedback->seqs.clear();
    return IKV_OK;
}

}  // extern "C"
