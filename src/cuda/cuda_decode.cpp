// ikv_decode on a CUDA pool (called by src/api/api_decode.cpp after the
// arguments were checked against the pool).
//
// One step, all enqueued on args->stream, no host synchronization:
//   0. when the decoder's page lists are still exact for this call
//      (decode/step_lists.hpp: same sequences, lengths, block tables and
//      plans as the last call, as for every layer of one engine step), steps
//      1-2 are skipped and the lists already on the device are read again;
//   1. host: per sequence, the entries it reads (plan entries or every live
//      page, clipped, evicted pages dropped: decode/selection.hpp's
//      collect_entries, the same rule as the CPU path) become DevPage records
//      with the pages' device addresses from the pool snapshot; they go into a
//      pinned staging buffer with the sequence lengths and list counts;
//   2. one cudaMemcpyAsync of that buffer to the decoder's device buffer;
//   3. with query-aware selection (topk_token_budget > 0 or IKV_TOPK_MASS): score (+ the
//      hybrid shift, + the mass budget) and top-k kernels turn the per-sequence
//      candidate lists into per-(sequence, kv-head) lists on the device;
//   4. the fused decode kernel (+ split-K merge) reads the lists directly, or,
//      for steps with many query rows, the multi-token path
//      (cuda_multi_token.hpp: dequantized key tiles + cuBLASLt GEMMs) does.
//      IKV_CUDA_MULTI_TOKEN=fused|gemm|auto (read once, default auto) forces
//      either path so tests run both.
// Device buffers (the lists; the workspace) grow with cudaMallocAsync/
// cudaFreeAsync on the stream. The pinned staging buffer is double-buffered; before refilling one half the
// host waits for the copy that last read it (issued two steps earlier, long
// finished in a steady loop), never for the kernels.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common/error.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_feedback.hpp"
#include "cuda/cuda_multi_token.hpp"
#include "cuda/cuda_util.hpp"
#include "decode/selection.hpp"
#include "ikv_kernels.h"
#include "pool/pool_view.hpp"
#include "pool/room_append.hpp"
#include "feedback/page_feedback.hpp"
#include "query_memory/query_memory.hpp"

namespace ikv {

// What building a call's page lists taught the host; kept beside the device
// lists so that a call reusing them (decode/step_lists.hpp) knows it too.
struct ListSummary {
    uint32_t n_seqs = 0;
    uint32_t stride = 1;     // capacity of one sequence's list (entries): the longest list
    uint32_t max_count = 0;  // entries of the longest list
    dvec<uint32_t> tokens, mandatory;  // per sequence: rows listed, and those of mandatory entries
    uint64_t n_entries = 0, all_tokens = 0;
    uint64_t bytes = 0;      // K/V bytes of every listed row, all kv-heads
    uint32_t formats = 0;    // bit per page format listed
    uint64_t host_pages = 0; // distinct (sequence, page) pairs listed that are in the host tier
    uint64_t off_lens = 0, off_pages = 0, staged = 0;  // layout of the staged lists (bytes)
    // Sequences with room (ikv_pool_reserve): their RoomTail records and the
    // full copies of the entries the clip kernel rewrites (kernels/room_clip.cu).
    uint32_t n_room = 0;
    uint64_t off_tails = 0, off_full = 0;
    // Every room's entries read each position from the host's length to the
    // room's end (a decode that appends can write its token where one reads it).
    bool rooms_covered = false;
    // And one entry per page from the room's first (RoomTail::page0): a decode
    // that appends finds its token's entry from the length.
    bool rooms_paged = false;
};

// Where the decoder's device lists hold every room's entries in full, as a
// decode that appends reads them (FusedAppend): after an upload or a restore
// (launch_room_clip(restore)) in the same context (eager calls, or one
// capture: its id) and no clip since. A graph that clips (captured clip
// kernel) may run between any two eager calls, so eager calls restore
// whenever one was captured.
constexpr unsigned long long kEagerContext = 0, kNoContext = ~0ull;

constexpr int kCaptureStaging = 2;  // CudaDecoderState::pinned's buffer for captured calls
constexpr int kCaptureSlots = 8;    // captured calls with lists of their own, per capture and decoder

struct CudaDecoderState {
    int device = -1;
    int n_sms = 0;
    int max_smem_optin = 0;  // shared memory a block may opt in to (read once, not per step)
    double mem_gbps_per_sm = 0.0;  // the device's memory bandwidth per SM (picks the compute: decode_resolve_compute)
    // Pinned staging: two halves eager calls use alternately, and a third that
    // captured calls write (kCaptureStaging): a capture cannot wait for the
    // copy an eager call two calls earlier enqueued from a half, and a graph
    // reads its staging at every replay. The third holds kCaptureSlots slots
    // of pinned_bytes[kCaptureStaging] each, one per captured call whose lists
    // differ from the slot before (a graph's copy nodes read them all).
    uint8_t *pinned[3] = {nullptr, nullptr, nullptr};
    uint64_t pinned_bytes[3] = {0, 0, 0};  // [kCaptureStaging]: per slot
    unsigned long long capture_context = 0;  // the capture whose calls hold the slots
    int capture_next = 0;                    // its next free slot
    uint64_t capture_staged = 0;             // bytes the last captured call staged
    cudaEvent_t copied[2] = {nullptr, nullptr};  // the copy that last read pinned[i]
    bool copied_valid[2] = {false, false};
    int next = 0;
    // The device page lists (counts | lens | pages) and what they hold.
    uint8_t *lists = nullptr;
    uint64_t lists_bytes = 0;
    int lists_half = -1;                // staging half whose copy filled them; -1: none
    unsigned long long rooms_whole_in = kNoContext;  // the context where the rooms' entries are whole (above)
    bool clip_captured = false;                       // a capture of this decoder clips rooms' entries
    cudaStream_t lists_stream = nullptr;  // the stream of that copy
    ListSummary sum;
    // Device workspace: top-k scores and lists, then the decode's split partials.
    uint8_t *dev = nullptr;
    uint64_t dev_bytes = 0;
    dvec<Entry> entries;  // every sequence's entries of the current call, one after another
    dvec<uint64_t> entry_first;  // sequence b's entries: [entry_first[b], entry_first[b + 1])
    dvec<uint32_t> room_first;   // sequences with room: the first entry the device clips
    dvec<cuda::RoomTail> room_tails_host;  // their tail records as uploaded (the first few go in kernel parameters)
    std::vector<float> prior_host;        // the feedback prior's host side (upload_prior)
    std::vector<uint32_t> prior_on_host;
    // Where the last call's selection lives (ikv_decoder_last_selection):
    // with top-k the per-(sequence, kv-head) lists in `dev`, else `entries`.
    const cuda::DevPage *sel_pages = nullptr;
    const uint32_t *sel_counts = nullptr;
    uint32_t sel_stride = 0, sel_heads = 0;
    cudaStream_t sel_stream = nullptr;
    cuda::MultiTokenGemm *gemm = nullptr;  // cuBLASLt state of the multi-token path, created on first use
};

void cuda_decoder_state_destroy(CudaDecoderState *s) {
    if (s == nullptr) return;
    if (s->device >= 0) {
        DeviceGuard g(s->device);
        for (int i = 0; i < 3; ++i) {
            if (i < 2 && s->copied[i]) {
                if (s->copied_valid[i]) cudaEventSynchronize(s->copied[i]);
                cudaEventDestroy(s->copied[i]);
            }
            if (s->pinned[i]) cudaFreeHost(s->pinned[i]);
        }
        if (s->dev || s->lists) {
            cudaDeviceSynchronize();  // the decoder's last steps may still read them
            if (s->dev) cudaFree(s->dev);
            if (s->lists) cudaFree(s->lists);
        }
        cuda::multi_token_destroy(s->gemm);
    }
    delete s;
}

namespace {

constexpr const char *kFn = "ikv_decode";

// IKV_FUSED_APPEND=0 in the environment (read once) makes a decode that
// appends enqueue the append as ikv_pool_append_batch does, for side-by-side
// timing of the fused path (run tests/bench_gpu_step with it).
bool fused_append_enabled() {
    static const bool on = [] {
        const char *e = std::getenv("IKV_FUSED_APPEND");
        return !(e != nullptr && std::strcmp(e, "0") == 0);
    }();
    return on;
}

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
// queries: auto (tensor cores for more than 4 query rows per kv-head, and
// when the step reads INT8/FP8/INT4 pages and enough of them per CTA, and
// for F16/BF16 pages too on devices with fast memory:
// cuda::decode_resolve_compute), simt (fp32 FMAs) or tensor-cores
// (kernels/decode_mma.cuh).
uint32_t decode_compute() {
    static const char *const kNames[] = {"auto", "simt", "tensor-cores"};
    static const uint32_t kModes[] = {cuda::kComputeDefault, cuda::kComputeSimt, cuda::kComputeTensorCores};
    static const uint32_t c = kModes[env_choice("IKV_CUDA_DECODE_COMPUTE", kNames, 3)];
    return c;
}

// Whether a step of query_rows rows per kv-head runs as GEMMs: where they
// start to win depends on the compute the fused kernel would run (tensor
// cores for F16/BF16 queries when p.compute says so; F32 queries always SIMT).
// Under auto a step the fused kernel cannot launch (grid) or whose split
// partials would pass the GEMM path's tile budget takes GEMMs too.
bool use_gemm(uint32_t query_rows, const cuda::DecodeParams &p, uint32_t fused_splits) {
    switch (multi_token_mode()) {
        case MultiTokenMode::Fused: return false;
        case MultiTokenMode::Gemm: return true;
        default: break;
    }
    const bool tc = p.q_dtype != IKV_DTYPE_F32 && p.compute == cuda::kComputeTensorCores;
    if (query_rows >= (tc ? cuda::kMultiTokenGemmMinRowsTc : cuda::kMultiTokenGemmMinRows)) return true;
    if (query_rows < cuda::kMultiTokenGemmMinRows) return false;  // as before the tensor-core rule: always fused
    return !cuda::decode_grid_fits(p) ||
           cuda::decode_workspace_bytes(p, fused_splits) > cuda::kMultiTokenTileBytes;
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
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&s->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) err = cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming);
    if (err == cudaSuccess) s->mem_gbps_per_sm = cuda::device_memory_gbps_per_sm(device);
    if (err != cudaSuccess) {
        cuda_decoder_state_destroy(s);
        return cuda_fail(err, kFn, "creating the decoder's CUDA state");
    }
    *state = s;
    return IKV_OK;
}

// A call on a capturing stream that would have to grow one of the decoder's
// buffers: a graph must not own (or free) them, so the capture is refused and
// the engine runs the same call eagerly first (the header's recipe).
ikv_status refuse_growth_in_capture(const char *what, uint64_t need) {
    return fail(IKV_E_STATE,
                "%s: the stream is capturing a CUDA graph and this call needs %llu bytes of %s, more than the "
                "decoder holds; run the same call once eagerly before capturing it (a capture cannot allocate)",
                kFn, (unsigned long long)need, what);
}

// Grow a stream-ordered device buffer to at least `need` bytes (half again
// as much, so slowly growing steps do not reallocate every time).
cudaError_t grow_device(uint8_t **buf, uint64_t *bytes, uint64_t need, cudaStream_t stream) {
    if (*bytes >= need) return cudaSuccess;
    if (*buf) cudaFreeAsync(*buf, stream);
    *buf = nullptr;
    *bytes = 0;
    const uint64_t want = need + need / 2;
    const cudaError_t err = cudaMallocAsync(reinterpret_cast<void **>(buf), want, stream);
    if (err == cudaSuccess) *bytes = want;
    return err;
}

// Steps 1-2 of the header comment: take the snapshots, collect every
// sequence's entries, write the DevPage records into a pinned staging half
// and copy it to s.lists on the stream; s.sum describes the result.
ikv_status build_lists(CudaDecoderState &s, ikv_pool *pool, const ikv_decode_args &a, const StepLists &lists,
                       cudaStream_t stream, unsigned long long context) {
    const bool capturing = context != kEagerContext;
    const PageShape &shape = pool_shape(pool);
    const uint32_t P = shape.page_size, D = shape.head_dim, Hkv = shape.n_kv_heads, B = a.n_seqs;
    s.lists_half = -1;  // whatever happens below, the old lists are gone
    ikv_status st = lists.take_snapshots();
    if (st != IKV_OK) return st;
    const std::vector<SeqSnapshot> &snaps = *lists.snaps;
    ListSummary &sum = s.sum;
    sum.n_seqs = B;
    sum.tokens.resize(B);
    sum.mandatory.resize(B);
    std::vector<uint32_t> counts(B), lens(B);
    dvec<uint64_t> &first = s.entry_first;  // sequence b's entries: [first[b], first[b + 1])
    first.assign(B + 1, 0);
    sum.max_count = 0;
    s.entries.clear();
    for (uint32_t b = 0; b < B; ++b) {
        collect_entries(snaps[b], a.plans ? a.plans[b] : nullptr, P, s.entries);
        first[b + 1] = s.entries.size();
        lens[b] = snaps[b].length;
        counts[b] = uint32_t(first[b + 1] - first[b]);
        sum.max_count = std::max(sum.max_count, counts[b]);
        uint64_t tokens = 0, mandatory = 0;
        for (uint64_t i = first[b]; i < first[b + 1]; ++i) {
            const Entry &e = s.entries[i];
            tokens += e.end - e.begin;
            if (e.mandatory) mandatory += e.end - e.begin;
        }
        sum.tokens[b] = uint32_t(tokens);
        sum.mandatory[b] = uint32_t(mandatory);
    }
    sum.n_entries = s.entries.size();
    sum.stride = std::max<uint32_t>(sum.max_count, 1);
    // Sequences with room: the entries from the first one past the host's
    // length on are clipped on the device at every call (room_clip.cu).
    dvec<uint32_t> &room_first = s.room_first;  // per sequence: list index of that entry (count: no room)
    room_first.assign(B, 0);
    sum.n_room = 0;
    uint64_t n_full = 0;
    sum.rooms_covered = true;
    for (uint32_t b = 0; b < B; ++b) {
        room_first[b] = counts[b];
        if (snaps[b].room == nullptr) continue;
        uint32_t i = 0;
        while (i < counts[b] && s.entries[first[b] + i].end <= snaps[b].host_length) ++i;
        room_first[b] = i;
        n_full += counts[b] - i;
        ++sum.n_room;
        uint32_t at = snaps[b].host_length;  // the first position not yet seen read
        for (uint32_t j = i; j < counts[b]; ++j) {
            const Entry &e = s.entries[first[b] + j];
            if (e.begin > at) break;
            at = std::max(at, e.end);
        }
        sum.rooms_covered = sum.rooms_covered && at >= snaps[b].length;
    }

    // The pinned staging half: counts[B] | lens[B] | pages[B][stride], the
    // same layout as on the device. The DevPage records are written straight
    // into it (bench/RESULTS.md section 1g: this host part was most of an
    // ikv_decode call, ~25 ns per page with a host vector and a second copy).
    sum.off_lens = align256(4ull * B);
    sum.off_pages = sum.off_lens + align256(4ull * B);
    sum.off_tails = sum.off_pages + align256(uint64_t(B) * sum.stride * sizeof(cuda::DevPage));
    sum.off_full = sum.off_tails + align256(uint64_t(sum.n_room) * sizeof(cuda::RoomTail));
    sum.staged = sum.off_full + align256(n_full * sizeof(cuda::DevPage));
    const int half = capturing ? kCaptureStaging : s.next;
    cudaError_t err = cudaSuccess;
    if (!capturing && s.copied_valid[half]) {
        err = cudaEventSynchronize(s.copied[half]);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "waiting for an earlier staging copy");
    }
    if (capturing && s.capture_context != context) s.capture_context = context, s.capture_next = 0;
    if (capturing && s.capture_next >= kCaptureSlots)
        return fail(IKV_E_STATE,
                    "%s: this capture already holds %d calls of this decoder whose page lists differ from the call "
                    "before; a decoder captures at most %d such calls per graph (use another decoder for more)",
                    kFn, kCaptureSlots, kCaptureSlots);
    if (s.pinned_bytes[half] < sum.staged || (!capturing && s.pinned_bytes[kCaptureStaging] < sum.staged)) {
        if (capturing) return refuse_growth_in_capture("page-list staging", sum.staged);
        // All three grow together, so that after one eager call a captured call
        // (which takes the third) never allocates: pinned allocation is not
        // capturable, in any capture mode.
        for (int i = 0; i < 3; ++i) {
            if (s.pinned_bytes[i] >= sum.staged) continue;
            if (i < 2 && s.copied_valid[i]) {  // the copy that last read it is done before it goes
                err = cudaEventSynchronize(s.copied[i]);
                if (err != cudaSuccess) return cuda_fail(err, kFn, "waiting for an earlier staging copy");
                s.copied_valid[i] = false;
            }
            if (s.pinned[i]) cudaFreeHost(s.pinned[i]);
            s.pinned[i] = nullptr;
            s.pinned_bytes[i] = 0;
            const uint64_t slots = i == kCaptureStaging ? kCaptureSlots : 1;
            err = cudaHostAlloc(reinterpret_cast<void **>(&s.pinned[i]), slots * sum.staged * 2, cudaHostAllocDefault);
            if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaHostAlloc of the plan staging buffer");
            s.pinned_bytes[i] = sum.staged * 2;
        }
    }
    if (!capturing) s.next ^= 1;
    uint8_t *h = s.pinned[half] + (capturing ? uint64_t(s.capture_next) * s.pinned_bytes[half] : 0);
    std::memcpy(h, counts.data(), 4ull * B);
    std::memcpy(h + sum.off_lens, lens.data(), 4ull * B);
    uint64_t full_bytes[IKV_FMT_COUNT];  // bytes a whole page's K/V rows and scales cost, all kv-heads
    for (int f = 0; f < IKV_FMT_COUNT; ++f) full_bytes[f] = uint64_t(Hkv) * subpage_read_bytes(ikv_format(f), P, D, P);
    sum.bytes = 0;
    sum.all_tokens = 0;
    sum.formats = 0;
    sum.host_pages = 0;
    for (uint32_t b = 0; b < B; ++b) {
        const SeqSnapshot &snap = snaps[b];
        cuda::DevPage *out = reinterpret_cast<cuda::DevPage *>(h + sum.off_pages) + uint64_t(b) * sum.stride;
        for (uint64_t i = first[b]; i < first[b + 1]; ++i) {
            const Entry &e = s.entries[i];
            const PageRef &ref = snap.pages[e.page];
            // entries are sorted by page: a page split into several counts once
            if (ref.on_host && (i == first[b] || s.entries[i - 1].page != e.page)) ++sum.host_pages;
            const uint32_t n = e.end - e.begin;
            cuda::DevPage &d = *out++;  // fields stored one by one (no temporary: see collect_entries)
            d.base = ref.base;
            d.pos0 = e.page * P;
            d.begin = uint8_t(e.begin - d.pos0);
            d.end = uint8_t(e.end - d.pos0);
            d.format = uint8_t(ref.format);
            d.flags = uint8_t((e.mandatory ? IKV_PAGE_MANDATORY : 0u) | (n < P ? IKV_PAGE_PARTIAL : 0u));
            sum.formats |= 1u << ref.format;
            sum.bytes += n == P ? full_bytes[ref.format] : uint64_t(Hkv) * subpage_read_bytes(ref.format, P, D, n);
            sum.all_tokens += n;
        }
    }
    cuda::RoomTail *tail = reinterpret_cast<cuda::RoomTail *>(h + sum.off_tails);
    s.room_tails_host.clear();
    cuda::DevPage *full = reinterpret_cast<cuda::DevPage *>(h + sum.off_full);
    uint32_t offset = 0;
    sum.rooms_paged = true;
    for (uint32_t b = 0; b < B; ++b) {
        if (snaps[b].room == nullptr) continue;
        const uint32_t n = counts[b] - room_first[b];
        const cuda::DevPage *listed = reinterpret_cast<const cuda::DevPage *>(h + sum.off_pages) + uint64_t(b) * sum.stride;
        std::memcpy(full + offset, listed + room_first[b], n * sizeof(cuda::DevPage));
        const uint32_t page0 = n > 0 ? full[offset].pos0 / P : 0;
        for (uint32_t j = 0; j < n && sum.rooms_paged; ++j) sum.rooms_paged = full[offset + j].pos0 == (page0 + j) * P;
        *tail = cuda::RoomTail{static_cast<cuda::RoomRecord *>(snaps[b].room), b, room_first[b], n, offset,
                               snaps[b].length, snaps[b].room_generation, page0};
        s.room_tails_host.push_back(*tail++);
        offset += n;
    }
    if (capturing && s.lists_bytes < sum.staged) return refuse_growth_in_capture("device page lists", sum.staged);
    err = grow_device(&s.lists, &s.lists_bytes, sum.staged, stream);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaMallocAsync of the decoder's device page lists");
    if (capturing) {  // a slot of its own, unless the lists equal the previous captured call's (its slot serves)
        const uint8_t *prev = h - s.pinned_bytes[half];
        if (s.capture_next > 0 && s.capture_staged == sum.staged && std::memcmp(prev, h, sum.staged) == 0)
            h -= s.pinned_bytes[half];
        else
            ++s.capture_next;
        s.capture_staged = sum.staged;
    }
    err = cudaMemcpyAsync(s.lists, h, sum.staged, cudaMemcpyHostToDevice, stream);
    // An event recorded in a capture belongs to the graph: waiting on it
    // outside the capture fails (cudaErrorCapturedEvent), and the graph
    // orders its own copy. So only eager copies are waited for later, and
    // only eager lists are kept: a captured copy runs at replay time.
    if (err == cudaSuccess && !capturing) err = cudaEventRecord(s.copied[half], stream);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaMemcpyAsync of the plan to the device");
    if (!capturing) s.copied_valid[half] = true;
    s.rooms_whole_in = context;  // the rooms' entries as listed, to their ends
    if (!capturing) {
        s.lists_half = half;
        s.lists_stream = stream;
    }
    return IKV_OK;
}

// The feedback prior of query-aware selection (topk_feedback_weight): for
// every candidate of every (sequence, kv-head), log(weight * ema) of its page
// computed on the host as the CPU computes it (decode/selection.cpp
// apply_feedback_prior; -inf for a page without feedback), divided by the
// logit scale (the device's scores are of the unscaled query), and whether the
// feedback has anything for that (sequence, layer, kv-head), copied to the
// device on the stream. The averages change every step, so this runs on every
// call (the averages are settled: cuda_decode).
ikv_status upload_prior(CudaDecoderState &s, const ikv_decode_args &a, uint32_t B, uint32_t Hkv, uint32_t stride,
                        float scale, uint8_t *prior_dev, uint8_t *on_dev, cudaStream_t stream) {
    try {
        s.prior_host.assign(uint64_t(B) * Hkv * stride, -INFINITY);
        s.prior_on_host.assign(uint64_t(B) * Hkv, 0u);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory for the feedback prior", kFn);
    }
    for (uint32_t b = 0; b < B; ++b)
        for (uint32_t h = 0; h < Hkv; ++h) {
            const PageAverages *avg = a.feedback->averages(a.seqs[b], a.layer, h);
            if (avg == nullptr) continue;
            const uint64_t bh = uint64_t(b) * Hkv + h;
            s.prior_on_host[bh] = 1;
            for (uint64_t i = s.entry_first[b]; i < s.entry_first[b + 1]; ++i) {
                const uint32_t page = s.entries[i].page;
                const float m = page < avg->n_fed ? avg->avg[page] : 0.0f;
                if (m > 0.0f)  // the device scores the unscaled query: the prior in its units
                    s.prior_host[bh * stride + (i - s.entry_first[b])] = std::log(a.topk_feedback_weight * m) / scale;
            }
        }
    // Pageable copies: each returns once its source is staged, so the vectors may change after.
    cudaError_t err = cudaMemcpyAsync(prior_dev, s.prior_host.data(), 4 * s.prior_host.size(), cudaMemcpyHostToDevice,
                                      stream);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(on_dev, s.prior_on_host.data(), 4 * s.prior_on_host.size(), cudaMemcpyHostToDevice,
                              stream);
    return err == cudaSuccess ? IKV_OK : cuda_fail(err, kFn, "copying the feedback prior to the device");
}

// Attention feedback (ikv_page_feedback) of the decode just enqueued: the
// device measures each read entry's share (kernels/attention_feedback.cu) and
// the shares are copied back behind it without a wait (cuda/cuda_feedback.cpp:
// the next call that uses the feedback adds them to the averages).
CudaPendingShares &pending_shares(ikv_page_feedback &fb) { return static_cast<CudaPendingShares &>(*fb.device_shares); }

// sums: the fused decode's per-chunk sums (its feedback variant), else
// nullptr (the multi-token GEMM path: the keys are read again).
ikv_status feed_back(CudaDecoderState &s, const ikv_decode_args &a, const cuda::DecodeParams &p, uint8_t *dev,
                     uint8_t *sums, cudaStream_t stream) {
    const uint32_t Hkv = p.shape.n_kv_heads, BH = a.n_seqs * Hkv, stride = p.lists.stride;
    const uint64_t n = uint64_t(BH) * stride;  // the workspace's shares | pages | counts (cuda_decode sizes it)
    cuda::FeedbackOut o{reinterpret_cast<float *>(dev), reinterpret_cast<uint32_t *>(dev + align256(4 * n)),
                        reinterpret_cast<uint32_t *>(dev + 2 * align256(4 * n)), stride};
    const cuda::ChunkSums c{reinterpret_cast<float *>(sums), stride * cuda::chunks_per_entry(p)};
    cudaError_t err = sums != nullptr ? cuda::launch_feedback_from_chunks(p, c, o, stream)
                                      : cuda::launch_attention_feedback(p, o, s.n_sms, stream);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "the attention feedback kernel");
    return pending_shares(*a.feedback).enqueue(o, a.seqs, a.n_seqs, Hkv, a.layer, stream, kFn);
}

// cuda_decode_check's work, with the pool's device already current (a
// caller's DeviceGuard: cuda_decode takes one for the whole call).
ikv_status check_limits(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args &a) {
    const PageShape &shape = pool_shape(pool);
    const uint32_t D = shape.head_dim, Hkv = shape.n_kv_heads, B = a.n_seqs;
    if (!cuda::head_dim_supported(D))
        return fail(IKV_E_UNSUPPORTED,
                    "%s: head_dim %u is not built into the CUDA kernels (32, 64, 128, 256); a CPU pool decodes it", kFn,
                    D);
    ikv_status st = ensure_state(state, pool_device(pool));
    if (st != IKV_OK) return st;
    const CudaDecoderState &s = **state;
    // A query memory joins query-aware selection only (as on the CPU).
    const ikv_query_memory *memory = topk_enabled(a) ? a.query_memory : nullptr;
    if (topk_enabled(a)) {  // what the scoring kernels can take (checked before any device work)
        const uint32_t G = a.n_q_heads / Hkv, parts = a.topk_score != IKV_TOPK_SCORE_QUEST ? 3 : 2;
        const uint32_t rows = memory ? 2 * G : G;  // a memory's recalled queries are scored as more rows
        if (a.topk_score == IKV_TOPK_SCORE_KEYS && rows > cuda::kMaxKeysRows)
            return fail(IKV_E_UNSUPPORTED, "%s: IKV_TOPK_SCORE_KEYS on a CUDA pool handles at most %u scored rows "
                        "per kv-head (query heads, twice with a query memory), the call has %u", kFn,
                        cuda::kMaxKeysRows, rows);
        const uint64_t qbytes = uint64_t(rows) * D * 4 * parts;
        if (parts == 3 && rows > cuda::kMaxHybridGroup)
            return fail(IKV_E_UNSUPPORTED, "%s: IKV_TOPK_SCORE_HYBRID on a CUDA pool handles at most %u scored rows "
                        "per kv-head (query heads, twice with a query memory), the call has %u", kFn,
                        cuda::kMaxHybridGroup, rows);
        if (qbytes > uint64_t(s.max_smem_optin))
            return fail(IKV_E_UNSUPPORTED, "%s: query-aware selection on a CUDA pool stages the kv-group's queries in "
                        "shared memory: %u rows per kv-head at head_dim %u need %llu bytes, the device has %d",
                        kFn, rows, D, (unsigned long long)qbytes, s.max_smem_optin);
        if (memory && B > cuda::kMaxMemorySeqs)
            return fail(IKV_E_UNSUPPORTED, "%s: a query memory on a CUDA pool serves at most %u sequences per call, "
                        "the call has %u", kFn, cuda::kMaxMemorySeqs, B);
    }
    if (a.feedback != nullptr) {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(a.stream), &cap);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaStreamIsCapturing");
        if (cap != cudaStreamCaptureStatusNone)
            return fail(IKV_E_INVALID, "%s: the stream is capturing a CUDA graph, and a decode with attention "
                        "feedback adds the pages' shares to averages kept on the host, which a graph's replays "
                        "would not reach; decode with feedback eagerly", kFn);
    }
    return IKV_OK;
}

}  // namespace

ikv_status cuda_decode_check(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args) {
    DeviceGuard guard(pool_device(pool));
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), kFn, "cudaSetDevice");
    return check_limits(state, pool, *args);
}

ikv_status cuda_decode(CudaDecoderState **state, ikv_pool *pool, const ikv_decode_args *args, StepLists &lists,
                       uint64_t *bytes_read) {
    const ikv_decode_args &a = *args;
    const PageShape &shape = pool_shape(pool);
    const uint32_t P = shape.page_size, D = shape.head_dim, Hkv = shape.n_kv_heads, B = a.n_seqs;
    DeviceGuard guard(pool_device(pool));  // one for the whole call
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), kFn, "cudaSetDevice");
    ikv_status st = check_limits(state, pool, a);
    if (st != IKV_OK) return st;
    CudaDecoderState &s = **state;
    const ikv_query_memory *memory = topk_enabled(a) ? a.query_memory : nullptr;
    cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    cudaError_t err = cudaStreamGetCaptureInfo(stream, &cap, &capture_id);
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaStreamGetCaptureInfo");
    const bool capturing = cap != cudaStreamCaptureStatusNone;
    const unsigned long long context = capturing ? capture_id + 1 : kEagerContext;  // where the rooms are whole

    // 1-2. The page lists on the device: the last call's when they are still
    // exact, else built now. A capture reuses them too when they came from an
    // eager call on this stream: the graph then reads the device lists as that
    // call did, with no upload node (replays cost what eager reusing calls do;
    // bench/RESULTS.md section 7). From another stream it builds its own (a
    // wait on an event recorded outside the capture is not capturable).
    const bool reuse = lists.reuse && s.lists_half >= 0 && s.sum.n_seqs == B && (!capturing || stream == s.lists_stream);
    if (reuse) {
        if (stream != s.lists_stream) {  // their copy ran on another stream: order after it on the device
            err = cudaStreamWaitEvent(stream, s.copied[s.lists_half], 0);
            if (err != cudaSuccess) return cuda_fail(err, kFn, "ordering the stream after the page lists' copy");
        }
    } else {
        st = build_lists(s, pool, a, lists, stream, context);
        if (st != IKV_OK) return st;
    }
    lists.reuse = reuse;
    lists.keep = s.lists_half >= 0;
    lists.captured = capturing;
    const ListSummary &sum = s.sum;
    const uint32_t stride = sum.stride;
    const bool topk = topk_enabled(a);
    const bool mass = a.topk_mode == IKV_TOPK_MASS;
    if (topk && sum.max_count > cuda::kMaxTopkCandidates)
        return fail(IKV_E_UNSUPPORTED,
                    "%s: query-aware selection on a CUDA pool handles at most %u candidate pages per sequence, "
                    "a sequence has %u",
                    kFn, cuda::kMaxTopkCandidates, sum.max_count);
    uint32_t max_tokens = 0;  // rows of the longest list a kernel reads (after top-k: a bound)
    for (uint32_t b = 0; b < B; ++b) {
        uint32_t tokens = sum.tokens[b];
        // Top-k keeps the mandatory rows and others only while within the budget.
        if (topk && a.topk_token_budget > 0) tokens = std::min(tokens, std::max(sum.mandatory[b], a.topk_token_budget));
        max_tokens = std::max(max_tokens, tokens);
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
    p.formats = sum.formats;
    p.compute = decode_compute();  // auto is settled from the formats and the list lengths
    p.compute = cuda::decode_resolve_compute(p, max_tokens, s.n_sms, s.mem_gbps_per_sm);
    const uint32_t fused_splits = cuda::decode_choose_splits(p, s.n_sms);
    const bool gemm = use_gemm(a.n_query_tokens * (a.n_q_heads / Hkv), p, fused_splits);
    p.n_splits = gemm ? 1 : fused_splits;
    if (gemm && s.gemm == nullptr) {
        cudaError_t e = cuda::multi_token_create(&s.gemm);
        if (e == cudaErrorUnknown)
            return fail(IKV_E_DEVICE, "%s: creating the cuBLASLt handle failed: %s", kFn, cuda::multi_token_error(s.gemm));
        if (e != cudaSuccess) return cuda_fail(e, kFn, "creating the multi-token path's cuBLASLt state");
    }

    // Device workspace: top-k scores, per-head lists and counts, then the decode's.
    const uint64_t off_scores = 0;
    const uint64_t off_sel = off_scores + (topk ? align256(4ull * B * Hkv * stride) : 0);
    const uint64_t off_selc = off_sel + (topk ? align256(uint64_t(B) * Hkv * stride * sizeof(cuda::DevPage)) : 0);
    const bool keys = topk && a.topk_score == IKV_TOPK_SCORE_KEYS;  // hybrid candidates, ranked again by their keys
    const bool hybrid = topk && (a.topk_score == IKV_TOPK_SCORE_HYBRID || keys);
    const uint32_t group = a.n_q_heads / Hkv;
    const uint64_t off_rows = off_selc + (topk ? align256(4ull * B * Hkv) : 0);
    const uint32_t score_rows = memory ? 2 * group : group;
    const uint64_t off_budgets = off_rows + (hybrid ? align256(4ull * B * Hkv * score_rows * stride) : 0);
    const uint64_t off_weights = off_budgets + (mass ? align256(4ull * B * Hkv) : 0);
    const uint64_t off_mem_rows = off_weights + (mass ? align256(8ull * B * Hkv * stride) : 0);
    const uint64_t off_mem_ok = off_mem_rows + (memory ? align256(4ull * B * Hkv * group * D) : 0);
    // Attention feedback: the rows' lse (when the caller passed none), each entry's share and page, counts.
    const bool feedback = a.feedback != nullptr;
    const uint64_t fb_entries = feedback ? uint64_t(B) * Hkv * stride : 0;
    const uint64_t off_lse = off_mem_ok + (memory ? align256(4ull * B * Hkv) : 0);
    const uint64_t off_fb = off_lse + (feedback && a.lse == nullptr ? align256(4ull * B * a.n_query_tokens * a.n_q_heads) : 0);
    const uint64_t off_prior = off_fb + (feedback ? 2 * align256(4 * fb_entries) + align256(4ull * B * Hkv) : 0);
    // The feedback prior of top-k: each candidate's log(weight * ema), then per (sequence, kv-head) whether fed back.
    const bool prior = topk && feedback && a.topk_feedback_weight > 0.0f;
    const uint64_t off_prior_on = off_prior + (prior ? align256(4ull * B * Hkv * stride) : 0);
    // IKV_TOPK_SCORE_KEYS: the first pass's lists and counts, each candidate's per-row lse.
    const uint64_t off_cand = off_prior_on + (prior ? align256(4ull * B * Hkv) : 0);
    const uint64_t off_candc = off_cand + (keys ? align256(uint64_t(B) * Hkv * stride * sizeof(cuda::DevPage)) : 0);
    const uint64_t off_keys_lse = off_candc + (keys ? align256(4ull * B * Hkv) : 0);
    const uint64_t off_fb_sums = off_keys_lse + (keys ? align256(4ull * B * Hkv * stride * score_rows) : 0);
    // Feedback on the fused kernel: its per-chunk softmax sums (no second read of the keys).
    const bool fb_sums = feedback && !gemm;
    const uint64_t off_ws = off_fb_sums + (fb_sums ? align256(cuda::chunk_sums_bytes(p, stride)) : 0);
    const uint64_t total = off_ws + align256(gemm ? cuda::multi_token_workspace_bytes(p, max_tokens)
                                                  : cuda::decode_workspace_bytes(p, p.n_splits));
    if (capturing && s.dev_bytes < total) return refuse_growth_in_capture("device workspace", total);
    err = grow_device(&s.dev, &s.dev_bytes, total, stream);  // stream-ordered: no host synchronization
    if (err != cudaSuccess) return cuda_fail(err, kFn, "cudaMallocAsync of the decoder's device buffer");

    const uint32_t *d_counts = reinterpret_cast<const uint32_t *>(s.lists);
    p.seq_len = reinterpret_cast<const uint32_t *>(s.lists + sum.off_lens);
    const cuda::DevPage *d_pages = reinterpret_cast<const cuda::DevPage *>(s.lists + sum.off_pages);
    p.workspace = s.dev + off_ws;
    p.lists = cuda::DevLists{d_pages, d_counts, stride, 1};
    if (sum.host_pages > 0) {  // host-tier pages: read after the copies that put them there (a tier step's offloads)
        const ikv_status ost = pool_order_after_moves(pool, stream, kFn);
        if (ost != IKV_OK) return ost;
    }
    // args->append to sequences with room: done by the decode's kernels where
    // they can (FusedAppend, ikv_decode_args.append lists when), else enqueued now.
    RoomAppendReady *ready = lists.append;
    const bool fuse = ready != nullptr && fused_append_enabled() && sum.n_room == B && sum.rooms_covered &&
                      sum.rooms_paged && ready->pages16 && ready->src.async && ready->src.seq_tokens == 1 &&
                      ready->l0 == a.layer && ready->l1 == a.layer + 1 && !topk && !feedback && !gemm &&
                      a.n_query_tokens * (a.n_q_heads / Hkv) <= cuda::kFusedAppendMaxRows;
    if (ready != nullptr && !fuse) {
        st = room_append_run(pool, *ready);
        if (st != IKV_OK) return st;
    }
    const auto room_clip = [&](bool restore) {
        return cuda::launch_room_clip(reinterpret_cast<const cuda::RoomTail *>(s.lists + sum.off_tails), sum.n_room,
                                      reinterpret_cast<const cuda::DevPage *>(s.lists + sum.off_full),
                                      reinterpret_cast<cuda::DevPage *>(s.lists + sum.off_pages), stride,
                                      reinterpret_cast<uint32_t *>(s.lists),
                                      reinterpret_cast<uint32_t *>(s.lists + sum.off_lens), a.layer, restore, stream);
    };
    cuda::RoomArgs room{};  // the fused variants' argument
    if (fuse) {
        st = pool_fused_append_begin(pool, *ready, &room.fused);  // (may order the stream after another: first)
        if (st != IKV_OK) return st;
        // The decode reads the rooms' entries whole (FusedAppend): put them
        // back where a clip may have cut them since they were (a harmless
        // rewrite of the same entries otherwise), right before the decode so
        // that programmatic dependent launch links the two. A graph's first
        // decode that appends does it; eagerly, every decode that appends
        // once a graph that clips was captured (its replays are not seen).
        // (A second copy of the lists that only these decodes read and no
        // clip writes would drop this bookkeeping for one more list upload
        // per build.)
        if (s.rooms_whole_in != context || (!capturing && s.clip_captured)) {
            err = room_clip(true);
            if (err != cudaSuccess) return cuda_fail(err, kFn, "restoring the page lists of sequences with room");
            s.rooms_whole_in = context;
        }
        room.tails = reinterpret_cast<const cuda::RoomTail *>(s.lists + sum.off_tails);
        for (uint32_t b = 0; b < B && b < cuda::kInlineRoomTails; ++b) room.inline_tails[b] = s.room_tails_host[b];
    } else if (sum.n_room > 0) {  // sequences with room: their lists and lengths at the device's length, now
        s.rooms_whole_in = kNoContext;  // (set before the launch: a failed one may have run in part)
        s.clip_captured = s.clip_captured || capturing;
        err = room_clip(false);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "clipping the page lists of sequences with room");
    }
    if (feedback) {
        if (p.lse == nullptr) p.lse = reinterpret_cast<float *>(s.dev + off_lse);
        // Everything feedback writes after the kernels is sized now (as on the CPU):
        // an allocation failure leaves nothing enqueued.
        try {
            if (a.feedback->device_shares == nullptr) a.feedback->device_shares = std::make_unique<CudaPendingShares>();
            for (uint32_t b = 0; b < B; ++b) {
                const uint32_t pages = ((*lists.snaps)[b].length + P - 1) / P;
                for (uint32_t h = 0; h < Hkv; ++h) a.feedback->reserve(a.seqs[b], a.layer, h, pages);
            }
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory for the attention feedback", kFn);
        }
        st = pending_shares(*a.feedback).reserve(*a.feedback, B, Hkv, stride, kFn);
        // The prior reads this layer's averages: every earlier decode's shares of the layer join first.
        if (st == IKV_OK && prior) st = pending_shares(*a.feedback).settle_layer(*a.feedback, a.layer);
        if (st != IKV_OK) return st;
    }
    uint64_t bytes = sum.bytes;

    s.sel_pages = nullptr;  // set below with top-k
    s.sel_counts = nullptr;
    s.sel_stride = stride;
    s.sel_heads = Hkv;
    s.sel_stream = stream;

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
        // (IKV_TOPK_SCORE_KEYS: the first pass writes candidates for twice the budget)
        t.out_pages = reinterpret_cast<cuda::DevPage *>(s.dev + (keys ? off_cand : off_sel));
        t.out_counts = reinterpret_cast<uint32_t *>(s.dev + (keys ? off_candc : off_selc));
        t.candidate_factor = keys ? uint32_t(kKeysCandidateFactor) : 0u;
        t.hybrid = hybrid;
        t.rows = hybrid ? reinterpret_cast<float *>(s.dev + off_rows) : nullptr;
        t.budgets = mass ? reinterpret_cast<uint32_t *>(s.dev + off_budgets) : nullptr;
        t.weights = mass ? reinterpret_cast<double *>(s.dev + off_weights) : nullptr;
        t.mass_share = a.topk_mass;
        t.min_tokens = a.topk_min_tokens;
        t.scale = p.scale;
        cuda::MemoryRecall recall;  // ~2 KB: filled only with a memory
        if (memory) {
            t.mem_rows = reinterpret_cast<float *>(s.dev + off_mem_rows);
            t.mem_ok = reinterpret_cast<uint32_t *>(s.dev + off_mem_ok);
            t.mem_offset = std::log(memory->decay) / p.scale;  // scores are of the unscaled query
            recall.n_layers = memory->n_layers;
            recall.slots = memory->slots();
            for (uint32_t b = 0; b < B; ++b) {
                const auto it = memory->seqs.find(a.seqs[b]);
                recall.blocks[b] = static_cast<const uint8_t *>(it == memory->seqs.end() ? nullptr : it->second.device);
            }
        }
        if (prior) {
            st = upload_prior(s, a, B, Hkv, stride, p.scale, s.dev + off_prior, s.dev + off_prior_on, stream);
            if (st != IKV_OK) return st;
            t.prior = reinterpret_cast<const float *>(s.dev + off_prior);
            t.prior_on = reinterpret_cast<const uint32_t *>(s.dev + off_prior_on);
        }
        err = cuda::launch_score_topk(t, memory ? &recall : nullptr, stream);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the page scoring / top-k kernels");
        if (keys) {  // the second pass: the candidates' keys, then the budget among them
            cuda::KeysRerankParams k{};
            k.shape = shape;
            k.layer = a.layer;
            k.n_seqs = B;
            k.n_q_heads = a.n_q_heads;
            k.n_query_tokens = a.n_query_tokens;
            k.q = a.q;
            k.q_dtype = a.q_dtype;
            k.scale = p.scale;
            k.softcap = a.softcap;
            k.candidates = cuda::DevLists{t.out_pages, t.out_counts, stride, Hkv};
            k.mem_rows = t.mem_rows;
            k.mem_ok = t.mem_ok;
            k.mem_log_weight = memory ? std::log(memory->decay) : 0.0f;
            k.lse = reinterpret_cast<float *>(s.dev + off_keys_lse);
            k.lse_rows = score_rows;
            k.scores = t.scores;
            k.n_sms = s.n_sms;
            err = cuda::launch_keys_rerank(k, stream);
            if (err != cudaSuccess) return cuda_fail(err, kFn, "the keys' rerank kernels");
            cuda::TopkParams second = t;
            second.candidates = k.candidates;
            second.hybrid = false;
            second.rows = nullptr;
            second.prior = nullptr;
            second.prior_on = nullptr;
            second.candidate_factor = 0;
            second.out_pages = reinterpret_cast<cuda::DevPage *>(s.dev + off_sel);
            second.out_counts = reinterpret_cast<uint32_t *>(s.dev + off_selc);
            err = cuda::launch_topk_select(second, stream);
            if (err != cudaSuccess) return cuda_fail(err, kFn, "the keys' select kernel");
            t.out_pages = second.out_pages;
            t.out_counts = second.out_counts;
        }
        p.lists = cuda::DevLists{t.out_pages, t.out_counts, stride, Hkv};
        s.sel_pages = t.out_pages;
        s.sel_counts = t.out_counts;
        // The exact selection stays on the device; bytes_read counts the summaries
        // scored plus the budget's worth of rows at the candidates' mean row cost
        // (IKV_TOPK_MASS: its cap, or every candidate without one: an upper estimate).
        const uint64_t per_token = sum.all_tokens ? sum.bytes / sum.all_tokens : 0;
        const uint64_t cap = a.topk_token_budget > 0 ? uint64_t(a.topk_token_budget) * B : sum.all_tokens;
        bytes = std::min<uint64_t>(sum.all_tokens, cap) * per_token +
                sum.n_entries * Hkv * (hybrid ? summary_hybrid_bytes(D) : summary_bound_bytes(D));
        // IKV_TOPK_SCORE_KEYS: the candidates' keys, about half of their rows' cost (twice the cap's tokens).
        if (keys) bytes += std::min<uint64_t>(sum.all_tokens, kKeysCandidateFactor * cap) * (per_token / 2);
    }

    // 4. Fused decode + split-K merge, or the multi-token GEMM path.
    if (gemm) {
        err = cuda::multi_token_run(s.gemm, p, max_tokens, stream);
        if (err == cudaErrorUnknown && cuda::multi_token_error(s.gemm)[0] != '\0')
            return fail(IKV_E_DEVICE, "%s: the multi-token path's %s", kFn, cuda::multi_token_error(s.gemm));
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the multi-token attention kernels");
    } else {
        const cuda::ChunkSums sums{reinterpret_cast<float *>(s.dev + off_fb_sums), stride * cuda::chunks_per_entry(p)};
        err = cuda::launch_decode(p, stream, fuse ? &room : nullptr, fb_sums ? &sums : nullptr);
        if (err != cudaSuccess) return cuda_fail(err, kFn, "the decode kernels");
        if (fuse) {
            st = pool_fused_append_end(pool, *ready);
            if (st != IKV_OK) return st;
            lists.append_fused = true;
        }
    }
    if (feedback) {
        st = feed_back(s, a, p, s.dev + off_fb, fb_sums ? s.dev + off_fb_sums : nullptr, stream);
        if (st != IKV_OK) return st;
    }
    if (sum.host_pages > 0) pool_count_host_reads(pool, sum.host_pages);
    *bytes_read = bytes;
    return IKV_OK;
}

ikv_status cuda_last_selection(const CudaDecoderState *state, uint32_t b, uint32_t h,
                               std::vector<ikv_token_range> &runs) {
    const char *fn = "ikv_decoder_last_selection";
    const CudaDecoderState &s = *state;
    runs.clear();
    const bool room = s.sum.n_room > 0;  // sequences with room: their lists and lengths are on the device
    if (s.sel_pages == nullptr && !room) {  // no top-k: every kv-head read the sequence's host entries
        for (uint64_t i = s.entry_first[b]; i < s.entry_first[b + 1]; ++i) add_run(runs, s.entries[i].begin, s.entries[i].end);
        return IKV_OK;
    }
    DeviceGuard guard(s.device);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), fn, "cudaSetDevice");
    const bool sel = s.sel_pages != nullptr;
    cudaError_t err = sel ? cudaStreamSynchronize(s.sel_stream) : cudaDeviceSynchronize();
    const uint64_t list = sel ? uint64_t(b) * s.sel_heads + h : b;
    const uint32_t *counts = sel ? s.sel_counts : reinterpret_cast<const uint32_t *>(s.lists);
    const cuda::DevPage *lists =
        sel ? s.sel_pages : reinterpret_cast<const cuda::DevPage *>(s.lists + s.sum.off_pages);
    const uint64_t stride = sel ? s.sel_stride : s.sum.stride;
    uint32_t count = 0, len = UINT32_MAX;
    if (err == cudaSuccess) err = cudaMemcpy(&count, counts + list, sizeof count, cudaMemcpyDeviceToHost);
    // Without top-k, rows read stop at the sequence's length (a decode that
    // appended read its room's entries whole, and left the length it read at).
    if (err == cudaSuccess && !sel)
        err = cudaMemcpy(&len, reinterpret_cast<const uint32_t *>(s.lists + s.sum.off_lens) + b, sizeof len,
                         cudaMemcpyDeviceToHost);
    std::vector<cuda::DevPage> pages(count);
    if (err == cudaSuccess && count > 0)
        err = cudaMemcpy(pages.data(), lists + list * stride, count * sizeof(cuda::DevPage), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return cuda_fail(err, fn, "copying the selection from the device");
    for (const cuda::DevPage &d : pages)
        if (d.pos0 + d.begin < len) add_run(runs, d.pos0 + d.begin, std::min<uint32_t>(d.pos0 + d.end, len));
    return IKV_OK;
}

}  // namespace ikv
