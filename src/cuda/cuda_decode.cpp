// ikv_decode on a CUDA pool (called by src/api/api_decode.cpp after the
// arguments were checked against the pool).
//
// One step, all enqueued on args->stream, no host synchronization:
//   1. host: per sequence, the entries it reads (plan entries or every live
//      page, clipped, evicted pages dropped: decode/selection.hpp's
//      collect_entries, the same rule as the CPU path) become DevPage records
//      with the pages' device addresses from the pool snapshot; they go into a
//      pinned staging buffer with the sequence lengths and list counts;
//   2. one cudaMemcpyAsync of that buffer to the decoder's device buffer;
//   3. with topk_token_budget > 0: score + top-k kernels turn the per-sequence
//      candidate lists into per-(sequence, kv-head) lists on the device;
//   4. the fused decode kernel (+ split-K merge) reads the lists directly, or,
//      for steps with many query rows, the multi-token path
//      (cuda_multi_token.hpp: dequantized key tiles + cuBLASLt GEMMs) does.
//      IKV_CUDA_MULTI_TOKEN=fused|gemm|auto (read once, default auto) forces
//      either path so tests run both.
// Device buffers grow with cudaMallocAsync/cudaFreeAsync on the stream. The
// pinned staging buffer is double-buffered; before refilling one half the
// host waits for the copy that last read it (issued two steps earlier, long
// finished in a steady loop), never for the kernels.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/error.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_multi_token.hpp"
#include "cuda/cuda_util.hpp"
#include "decode/selection.hpp"
#include "ikv_kernels.h"
#include "pool/pool_view.hpp"

namespace ikv {

struct CudaDecoderState {
    int device = -1;
    int n_sms = 0;
    // Pinned staging, two halves used alternately.
    uint8_t *pinned[2] = {nullptr, nullptr};
    uint64_t pinned_bytes[2] = {0, 0};
    cudaEvent_t copied[2] = {nullptr, nullptr};  // the copy that last read pinned[i]
    bool copied_valid[2] = {false, false};
    int next = 0;
    // Device buffer: staged lists + top-k output + workspace.
    uint8_t *dev = nullptr;
    uint64_t dev_bytes = 0;
    dvec<Entry> entries;  // every sequence's entries of the current call, one after another
    cuda::MultiTokenGemm *gemm = nullptr;  // cuBLASLt state of the multi-token path, created on first use
};

void cuda_decoder_state_destroy(CudaDecoderState *s) {
    if (s == nullptr) return;
    if (s->device >= 0) {
        DeviceGuard g(s->device);
        for (int i = 0; i < 2; ++i) {
            if (s->copied[i]) {
                if (s->copied_valid[i]) cudaEventSynchronize(s->copied[i]);
                cudaEventDestroy(s->copied[i]);
            }
            if (s->pinned[i]) cudaFreeHost(s->pinned[i]);
        }
        if (s->dev) {
            cudaDeviceSynchronize();  // the decoder's last steps may still read it
            cudaFree(s->dev);
        }
        cuda::multi_token_destroy(s->gemm);
    }
    delete s;
}

namespace {

constexpr const char *kFn = "ikv_decode";

uint64_t align256(uint64_t n) { return (n + 255) / 256 * 256; }

// Index of the environment variable's value in choices (n of them; an unset
// or empty variable means choices[0]); another value logs a warning and
// means choices[0]. Read by callers once per process (like IKV_CPU_ISA).
int env_choice(const char *name, const char *const *choices, int n) {
    const char *env = std::getenv(name);
    if (env == nullptr || env[0] == '\0') return 0;
    for (int i = 0; i < n; ++i)
        if (std::strcmp(env, choices[i]) == 0) return i;
    log(IKV_LOG_WARN, "%s=%s is not a known value; using %s", name, env, choices[0]);
    return 0;
}

enum class MultiTokenMode { Auto, Fused, Gemm };

// IKV_CUDA_MULTI_TOKEN: auto, fused or gemm.
MultiTokenMode multi_token_mode() {
    static const char *const kNames[] = {"auto", "fused", "gemm"};
    static const MultiTokenMode mode = MultiTokenMode(env_choice("IKV_CUDA_MULTI_TOKEN", kNames, 3));
    return mode;
}

// IKV_CUDA_DECODE_COMPUTE: how the fused decode computes for F16/BF16
// queries: auto (tensor cores when the step reads INT8/FP8/INT4 pages and
// enough of them per CTA: cuda::decode_resolve_compute), simt (fp32 FMAs) or
// tensor-cores (kernels/decode_mma.cuh).
uint32_t decode_compute() {
    static const char *const kNames[] = {"auto", "simt", "tensor-cores"};
    static const uint32_t kModes[] = {cuda::kComputeDefault, cuda::kComputeSimt, cuda::kComputeTensorCores};
    static const uint32_t c = kModes[env_choice("IKV_CUDA_DECODE_COMPUTE", kNames, 3)];
    return c;
}

bool use_gemm(uint32_t query_rows) {
    switch (multi_token_mode()) {
        case MultiTokenMode::Fused: return false;
        case MultiTokenMode::Gemm: return true;
        default: return query_rows >= cuda::kMultiTokenGemmMinRows;
    }
}

ikv_status ensure_state(CudaDecoderState **state, int device) {
    if (*state && (*state)->device == device) return IKV_OK;
    if (*state) {  // the decoder moved to a pool on another device
        cuda_decoder_state_destroy(*state);
        *state = nullptr;
    }
    CudaDecoderState *s = new (std::nothrow) CudaDecoderState;
    if (s == nullptr) return fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
    s->device = device;
    cudaError_t err = cudaDeviceGetAttribute(&s->n_sms, cudaDevAttrMultiProcessorCount, device);
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) err = cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming);
    if (err != cudaSuccess) {
        cuda_decoder_state_destroy(s);
        return cuda_fail(err, kFn, "creating the decoder's CUDA state");
    }
    *state = s;
    return IKV_OK;
}

}  // namespace

ikv_status cuda_decode(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args,
                       const std::vector<SeqSnapshot> &snaps, uint64_t *bytes_read) {
    const ikv_decode_args &a = *args;
    const PageShape &shape = pool_shape(pool);
    const uint32_t P = shape.page_size, D = shape.head_dim, Hkv = shape.n_kv_heads, B = a.n_seqs;
    if (!cuda::head_dim_supported(D))
        return fail(IKV_E_UNSUPPORTED, "%s: head_dim %u is not built into the CUDA kernels (64, 128, 256)", kFn, D);
    const int device = pool_device(pool);
    DeviceGuard guard(device);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), kFn, "cudaSetDevice");
    ikv_status st = ensure_state(state, device);
    if (st != IKV_OK) return st;
    CudaDecoderState &s = **state;
    cudaStream_t stream = static_cast<cudaStream_t>(a.stream);

    // 1. The entries every sequence reads, on the host (one flat list).
    std::vector<uint32_t> counts(B), lens(B);
    std::vector<uint64_t> first(B + 1, 0);  // sequence b's entries: [first[b], first[b + 1])
    uint32_t max_count = 0;
    uint32_t max_tokens = 0;  // rows of the longest list a kernel reads (after top-k: a bound)
    s.entries.clear();
    for (uint32_t b = 0; b < B; ++b) {
        collect_entries(snaps[b], a.plans ? a.plans[b] : nullptr, P, s.entries);
        first[b + 1] = s.entries.size();
        lens[b] = snaps[b].length;
        counts[b] = uint32_t(first[b + 1] - first[b]);
        max_count = std::max(max_count, counts[b]);
        uint64_t tokens = 0, mandatory = 0;
        for (uint64_t i = first[b]; i < first[b + 1]; ++i) {
            const Entry &e = s.entries[i];
            tokens += e.end - e.begin;
            if (e.mandatory) mandatory += e.end - e.begin;
        }
        // Top-k keeps the mandatory rows and others only while within the budget.
        if (a.topk_token_budget > 0) tokens = std::min<uint64_t>(tokens, std::max<uint64_t>(mandatory, a.topk_token_budget));
        max_tokens = std::max(max_tokens, uint32_t(tokens));
    }
    const bool topk = a.topk_token_budget > 0;
    if (topk && max_count > cuda::kMaxTopkCandidates)
        return fail(IKV_E_UNSUPPORTED,
                    "%s: args->topk_token_budget on a CUDA pool handles at most %u candidate pages per sequence, "
                    "a sequence has %u",
                    kFn, cuda::kMaxTopkCandidates, max_count);
    const uint32_t stride = std::max<uint32_t>(max_count, 1);

    // 2. The pinned staging half: counts[B] | lens[B] | pages[B][stride], the
    // same layout as on the device. The DevPage records are written straight
    // into it (bench/RESULTS.md section 1g: this host part was most of an
    // ikv_decode call, ~25 ns per page with a host vector and a second copy).
    const uint64_t off_lens = align256(4ull * B);
    const uint64_t off_pages = off_lens + align256(4ull * B);
    const uint64_t staged = off_pages + align256(uint64_t(B) * stride * sizeof(cuda::DevPage));
    const int half = s.next;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(stream, &cap);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaStreamIsCapturing");
    const bool capturing = cap != cudaStreamCaptureStatusNone;
    if (s.copied_valid[half] && !capturing) {
        err = cudaEventSynchronize(s.copied[half]);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "waiting for an earlier staging copy");
    }
    if (s.pinned_bytes[half] < staged) {
        if (s.pinned[half]) cudaFreeHost(s.pinned[half]);
        s.pinned[half] = nullptr;
        s.pinned_bytes[half] = 0;
        err = cudaHostAlloc(reinterpret_cast<void **>(&s.pinned[half]), staged * 2, cudaHostAllocDefault);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaHostAlloc of the plan staging buffer");
        s.pinned_bytes[half] = staged * 2;
    }
    s.next ^= 1;
    uint8_t *h = s.pinned[half];
    std::memcpy(h, counts.data(), 4ull * B);
    std::memcpy(h + off_lens, lens.data(), 4ull * B);
    uint64_t full_bytes[IKV_FMT_COUNT];  // bytes a whole page's K/V rows and scales cost, all kv-heads
    for (int f = 0; f < IKV_FMT_COUNT; ++f) full_bytes[f] = uint64_t(Hkv) * subpage_read_bytes(ikv_format(f), P, D, P);
    uint64_t bytes = 0, all_tokens = 0;
    uint32_t formats = 0;  // bit per page format read (picks the decode's compute)
    for (uint32_t b = 0; b < B; ++b) {
        const SeqSnapshot &snap = snaps[b];
        cuda::DevPage *out = reinterpret_cast<cuda::DevPage *>(h + off_pages) + uint64_t(b) * stride;
        for (uint64_t i = first[b]; i < first[b + 1]; ++i) {
            const Entry &e = s.entries[i];
            const PageRef &ref = snap.pages[e.page];
            const uint32_t n = e.end - e.begin;
            cuda::DevPage &d = *out++;  // fields stored one by one (no temporary: see collect_entries)
            d.base = ref.base;
            d.pos0 = e.page * P;
            d.begin = uint8_t(e.begin - d.pos0);
            d.end = uint8_t(e.end - d.pos0);
            d.format = uint8_t(ref.format);
            d.flags = uint8_t((e.mandatory ? IKV_PAGE_MANDATORY : 0u) | (n < P ? IKV_PAGE_PARTIAL : 0u));
            formats |= 1u << ref.format;
            bytes += n == P ? full_bytes[ref.format] : uint64_t(Hkv) * subpage_read_bytes(ref.format, P, D, n);
            all_tokens += n;
        }
    }

    // Decode parameters (the workspace size depends on the split count).
    cuda::DecodeParams p{};
    p.shape = shape;
    p.layer = a.layer;
    p.n_seqs = B;
    p.n_query_tokens = a.n_query_tokens;
    p.n_q_heads = a.n_q_heads;
    p.q = a.q;
    p.q_dtype = a.q_dtype;
    p.out = a.out;
    p.out_dtype = a.out_dtype;
    p.lse = a.lse;
    p.scale = a.scale > 0.0f ? a.scale : 1.0f / std::sqrt(float(D));
    p.softcap = a.softcap;
    // Split count sizing: after top-k a list holds about the budget's pages, not every candidate.
    p.max_pages = topk ? std::min<uint32_t>(stride, (max_tokens + P - 1) / P + 1) : stride;
    p.formats = formats;
    p.compute = decode_compute();  // auto is settled from the formats and the list lengths
    p.compute = cuda::decode_resolve_compute(p, max_tokens, s.n_sms);
    const bool gemm = use_gemm(a.n_query_tokens * (a.n_q_heads / Hkv));
    p.n_splits = gemm ? 1 : cuda::decode_choose_splits(p, s.n_sms);
    if (gemm && s.gemm == nullptr) {
        cudaError_t e = cuda::multi_token_create(&s.gemm);
        if (e == cudaErrorUnknown)
            return fail(IKV_E_DEVICE, "%s: creating the cuBLASLt handle failed: %s", kFn, cuda::multi_token_error(s.gemm));
        if (e != cudaSuccess) return cuda_fail(e, kFn, "creating the multi-token path's cuBLASLt state");
    }

    // Device only: top-k scores, per-head lists and counts, then the decode workspace.
    const uint64_t off_scores = staged;
    const uint64_t off_sel = off_scores + (topk ? align256(4ull * B * Hkv * stride) : 0);
    const uint64_t off_selc = off_sel + (topk ? align256(uint64_t(B) * Hkv * stride * sizeof(cuda::DevPage)) : 0);
    const uint64_t off_ws = off_selc + (topk ? align256(4ull * B * Hkv) : 0);
    const uint64_t total = off_ws + align256(gemm ? cuda::multi_token_workspace_bytes(p, max_tokens)
                                                  : cuda::decode_workspace_bytes(p, p.n_splits));

    // Device buffer (stream-ordered growth: no host synchronization).
    if (s.dev_bytes < total) {
        if (s.dev) cudaFreeAsync(s.dev, stream);
        s.dev = nullptr;
        s.dev_bytes = 0;
        const uint64_t want = std::max<uint64_t>(total, total + total / 2);
        err = cudaMallocAsync(reinterpret_cast<void **>(&s.dev), want, stream);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaMallocAsync of the decoder's device buffer");
        s.dev_bytes = want;
    }
    err = cudaMemcpyAsync(s.dev, h, staged, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) err = cudaEventRecord(s.copied[half], stream);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaMemcpyAsync of the plan to the device");
    // An event recorded in a capture belongs to the graph: waiting on it
    // outside the capture fails (cudaErrorCapturedEvent), and the graph
    // orders its own copy. So only eager copies are waited for later.
    s.copied_valid[half] = !capturing;

    const uint32_t *d_counts = reinterpret_cast<const uint32_t *>(s.dev);
    p.seq_len = reinterpret_cast<const uint32_t *>(s.dev + off_lens);
    const cuda::DevPage *d_pages = reinterpret_cast<const cuda::DevPage *>(s.dev + off_pages);
    p.workspace = s.dev + off_ws;
    p.lists = cuda::DevLists{d_pages, d_counts, stride, 1};

    // 3. Query-aware selection on the device.
    if (topk) {
        cuda::TopkParams t{};
        t.shape = shape;
        t.layer = a.layer;
        t.n_seqs = B;
        t.n_q_heads = a.n_q_heads;
        t.n_query_tokens = a.n_query_tokens;
        t.q = a.q;
        t.q_dtype = a.q_dtype;
        t.candidates = p.lists;
        t.max_candidates = stride;
        t.token_budget = a.topk_token_budget;
        t.scores = reinterpret_cast<float *>(s.dev + off_scores);
        t.out_pages = reinterpret_cast<cuda::DevPage *>(s.dev + off_sel);
        t.out_counts = reinterpret_cast<uint32_t *>(s.dev + off_selc);
        err = cuda::launch_score_topk(t, stream);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the page scoring / top-k kernels");
        p.lists = cuda::DevLists{t.out_pages, t.out_counts, stride, Hkv};
        // The exact selection stays on the device; bytes_read counts the summaries
        // scored plus the budget's worth of rows at the candidates' mean row cost.
        const uint64_t per_token = all_tokens ? bytes / all_tokens : 0;
        bytes = std::min<uint64_t>(all_tokens, uint64_t(a.topk_token_budget) * B) * per_token +
                uint64_t(s.entries.size()) * Hkv * summary_bound_bytes(D);
    }

    // 4. Fused decode + split-K merge, or the multi-token GEMM path.
    if (gemm) {
        err = cuda::multi_token_run(s.gemm, p, max_tokens, stream);
        if (err == cudaErrorUnknown && cuda::multi_token_error(s.gemm)[0] != '\0')
            return fail(IKV_E_DEVICE, "%s: the multi-token path's %s", kFn, cuda::multi_token_error(s.gemm));
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the multi-token attention kernels");
    } else {
        err = cuda::launch_decode(p, stream);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the decode kernels");
    }
    *bytes_read = bytes;
    return IKV_OK;
}

}  // namespace ikv
