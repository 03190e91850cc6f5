// Host page storage: pages come from ~1 MiB slabs (SlabAllocator) allocated
// with the library's host allocator (common/host_memory.hpp: mimalloc, so
// the host program's malloc is not touched), 64-byte aligned. Quantize-on-write
// and reads run on the CPU (host_codec.hpp).
#include <cstring>
#include <new>
#include <vector>

#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "common/quant.hpp"
#include "pool/host_codec.hpp"
#include "pool/page_store.hpp"
#include "pool/slab_allocator.hpp"
#include "pool/tail_append.hpp"

namespace ikv {
namespace {

constexpr std::size_t kSlabAlign = 64;
constexpr uint64_t kSlabTargetBytes = 1ull << 20;

// Slab memory from the library's host allocator (mimalloc's own API).
class HostSlabMemory final : public SlabMemory {
public:
    ikv_status allocate(uint64_t bytes, uint8_t **out) override {
        *out = static_cast<uint8_t *>(host_malloc_aligned(bytes, kSlabAlign));
        if (*out == nullptr)
            return fail(IKV_E_NOMEM, "%s: host allocation of a %llu-byte page slab failed", current_call(),
                        (unsigned long long)bytes);
        return IKV_OK;
    }
    void deallocate(uint8_t *base) override { host_free(base); }
};

class HostPageStore final : public PageStore {
public:
    explicit HostPageStore(const ikv_pool_config &c)
        : shape_{c.n_layers, c.n_kv_heads, c.head_dim, c.page_size},
          slabs_(shape_, c.capacity_bytes, kSlabAlign, kSlabTargetBytes, memory_),
          stage_bytes_(2ull * c.n_kv_heads * c.page_size * c.head_dim * sizeof(float)),
          stats_bytes_(c.n_kv_heads * TailStats::bytes(c.head_dim)) {}

    ikv_status alloc(ikv_format f, uint8_t **page) override { return slabs_.alloc(f, page); }
    void release(ikv_format f, uint8_t *page) override { slabs_.release(f, page); }

    ikv_status init(ikv_format f, uint8_t *page) override {
        const SubpageLayout sl = subpage_layout(f, shape_.page_size, shape_.head_dim);
        for (uint32_t l = 0; l < shape_.n_layers; ++l)
            for (uint32_t h = 0; h < shape_.n_kv_heads; ++h)
                write_subpage(f, shape_.page_size, shape_.head_dim, nullptr, nullptr, shape_.head_dim, 0,
                              page + subpage_offset(shape_, f, l, h));
        (void)sl;
        const uint64_t sum_off = summary_offset(shape_, f, 0, 0);
        std::memset(page + sum_off, 0, page_bytes(shape_, f) - sum_off);
        return IKV_OK;
    }

    // k is the start of a staging buffer of this store (write_layer's
    // contract) and v its second half; the running statistics of the tail
    // page live after the staging floats (stage_alloc), so a full write
    // leaves them describing what it stored.
    ikv_status write_layer(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                           uint32_t n_valid) override {
        return write_layer_tail(f, page, layer, k, v, n_valid, 0);
    }

    // Rows [0, unchanged) as the previous write stored them: where the
    // running statistics describe exactly those rows, only the new rows are
    // encoded and folded in (tail_append.hpp); otherwise the whole layer is
    // rewritten and the statistics rebuilt. Same bytes either way.
    ikv_status write_layer_tail(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                                uint32_t n_valid, uint32_t unchanged) override {
        const uint32_t P = shape_.page_size, D = shape_.head_dim;
        for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
            uint8_t *sub = page + subpage_offset(shape_, f, layer, h);
            uint16_t *rec = reinterpret_cast<uint16_t *>(page + summary_offset(shape_, f, layer, h));
            const uint64_t head_off = uint64_t(h) * P * D;
            const TailStats stats = stats_of(const_cast<float *>(k), h);  // our writable staging allocation
            if (unchanged >= 1 && unchanged <= n_valid && stats.describes(f, unchanged))
                tail_write_append(f, P, D, k + head_off, v + head_off, unchanged, n_valid, sub, rec, stats);
            else
                tail_write_full(f, P, D, k + head_off, v + head_off, n_valid, sub, rec, &stats);
        }
        return IKV_OK;
    }

    ikv_status read_rows(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head, uint32_t t0, uint32_t n,
                         float *k_out, float *v_out, uint64_t out_stride) const override {
        const uint8_t *sub = page + subpage_offset(shape_, f, layer, head);
        if (k_out) dequant_rows(f, shape_.page_size, shape_.head_dim, sub, 0, t0, n, k_out, out_stride);
        if (v_out) dequant_rows(f, shape_.page_size, shape_.head_dim, sub, 1, t0, n, v_out, out_stride);
        return IKV_OK;
    }

    ikv_status read_summary(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head,
                            uint16_t *out) const override {
        std::memcpy(out, page + summary_offset(shape_, f, layer, head), summary_record_bytes(shape_));
        return IKV_OK;
    }

    ikv_status copy(ikv_format f, uint8_t *dst, const uint8_t *src) override {
        std::memcpy(dst, src, page_bytes(shape_, f));
        return IKV_OK;
    }

    ikv_status stage_alloc(float **stage) override {
        const uint64_t bytes = stage_bytes_ + stats_bytes_;
        *stage = static_cast<float *>(host_malloc_aligned(bytes, kSlabAlign));
        if (*stage == nullptr)
            return fail(IKV_E_NOMEM, "%s: out of host memory for a %llu-byte staging buffer", current_call(),
                        (unsigned long long)bytes);
        invalidate_stats(*stage);
        return IKV_OK;
    }
    void stage_free(float *stage) override { host_free(stage); }
    ikv_status stage_copy(float *dst, const float *src) override {
        std::memcpy(dst, src, stage_bytes_ + stats_bytes_);  // the child's tail page starts as the parent's
        return IKV_OK;
    }
    ikv_status stage_from_page(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t n_valid,
                               float *stage) override {
        const uint64_t head_floats = uint64_t(shape_.page_size) * shape_.head_dim;
        float *k = stage, *v = stage + head_floats * shape_.n_kv_heads;
        for (uint32_t h = 0; h < shape_.n_kv_heads; ++h)
            read_rows(f, page, layer, h, 0, n_valid, k + h * head_floats, v + h * head_floats, shape_.head_dim);
        invalidate_stats(stage);  // the staging now holds values the page was not written from
        return IKV_OK;
    }

    ikv_status find_nonfinite(const AppendSource &src, uint32_t l0, uint32_t l1, NonFinite *out) override {
        if (src.on_device)
            return fail(IKV_E_UNSUPPORTED, "%s: %s->src_on_device is set but this pool's storage is host memory",
                        src.fn, current_args());
        find_nonfinite_host(src, shape_, l0, l1, out);
        return IKV_OK;
    }

    ikv_status write_append(const AppendSource &src, const AppendWrite *writes, size_t n_writes) override {
        const uint64_t half = uint64_t(shape_.n_kv_heads) * shape_.page_size * shape_.head_dim;
        for (size_t i = 0; i < n_writes; ++i) {
            const AppendWrite &w = writes[i];
            stage_rows_host(src, shape_, w);
            write_layer_tail(w.format, w.page, w.layer, w.stage, w.stage + half, w.row0 + w.rows, w.row0);
        }
        return IKV_OK;
    }

    uint64_t reserved_bytes() const override { return slabs_.reserved_bytes(); }

private:
    // The running statistics of kv-head h's tail page, after the staging floats.
    TailStats stats_of(float *stage, uint32_t h) const {
        return TailStats(reinterpret_cast<uint8_t *>(stage) + stage_bytes_ + h * TailStats::bytes(shape_.head_dim),
                         shape_.head_dim);
    }
    void invalidate_stats(float *stage) const {
        for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) stats_of(stage, h).rows() = TailStats::kInvalid;
    }

    PageShape shape_;
    HostSlabMemory memory_;  // declared before slabs_: outlives it
    SlabAllocator slabs_;
    uint64_t stage_bytes_;  // the fp32 staging floats (what ikv_pool_stats counts)
    uint64_t stats_bytes_;  // the tail pages' running statistics after them
};

}  // namespace

ikv_status make_host_store(const ikv_pool_config &config, std::unique_ptr<PageStore> *out) {
    try {
        out->reset(new HostPageStore(config));
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "ikv_pool_create: out of host memory");
    }
    return IKV_OK;
}

}  // namespace ikv
