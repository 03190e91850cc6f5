// The tensor-core decode chunk of kernels/decode_mma.cuh, run on the CPU by
// the warp emulation (warp_emulation.hpp) and checked against float64.
//
// What it checks without a GPU: the fragment bookkeeping of the device code
// itself (which lane loads which K/V rows and channels, the permuted channel
// order shared by Q and K, the score accumulators reused as the P operand,
// the output channels each lane ends with), the slot swizzle written by
// copy_chunk and read by the chunk compute, per-format dequantization with
// scales, partial chunk bounds, causal masks, padding rows, softcap, the
// online softmax across chunks and the finish layout the CTA merge reads. What
// it cannot check: the hardware's own mma layout (emulated from the PTX ISA
// description), timing, and the CUDA compiler; the GPU checks
// (bench/gpu/gpu_decode_check.cu) run the same code on a device.
//
// One warp processes a list of chunks (pages of 16 or 64 rows, one format
// each or mixed) for up to 16 query rows, for every head_dim (32, 64, 128, 256),
// row block (8, 16) and operand type (f16, bf16). The reference: float64
// attention over the stored (dequantized) keys and values of the rows each
// query may read, with the query values the kernel reads (rounded to the
// operand type). Tolerances are those of 16-bit operands (rel. L2 2e-3 f16,
// 1e-2 bf16; lse 1e-3 resp. 1e-2 x (1 + |lse|)). Exit 0 if every case passes.
#define IKV_WARP_EMULATION 1
#include "warp_emulation.hpp"
// warp_emulation.hpp first: the kernels' intrinsics resolve to the emulation.
#include <cmath>
#include <cstdio>
#include <random>

#include "common/quant.hpp"
#include "decode_mma.cuh"

namespace {

using namespace ikv;
using ikv::cuda::dec::kChunkRows;
namespace tc = ikv::cuda::tc;

constexpr double kLog2e = 1.4426950408889634;

struct Chunk {
    ikv_format f;
    uint32_t P, c0;        // page rows, first page row of the chunk
    int lo, hi;            // page rows read: [lo, hi)
    uint32_t pos0;         // position of page row 0
    std::vector<uint8_t> sub;  // the sub-page bytes
};

float round_op(float x, bool bf) { return bf ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x)); }

template <int D, int TR, bool BF, int F>
void run_chunk(const Chunk &c, uint8_t *slot, tc::State<D, TR> &w, int lane, float qs, float cap2, float inv) {
    cuda::dec::copy_chunk<D, F, true>(c.sub.data(), int(c.P), int(c.c0), c.lo, c.hi, slot, lane);
    __syncwarp();
    if (c.hi > c.lo)
        tc::compute_chunk<D, TR, BF, F>(slot, c.lo - int(c.c0), c.hi - int(c.c0), c.pos0 + c.c0, w, lane, qs, cap2, inv);
    __syncwarp();  // the slot is rewritten by the next chunk
}

template <int D, int TR, bool BF>
bool run_case(const std::vector<ikv_format> &fmts, bool softcap, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_int_distribution<int> U(0, 1 << 30);
    const float scale = 1.0f / std::sqrt(float(D)), cap = softcap ? 4.0f : 0.0f;

    // Chunks: 6 chunks at consecutive positions, pages of 16 or 64 rows, random bounds.
    std::vector<Chunk> chunks;
    uint32_t pos = 0;
    for (int i = 0; i < 6; ++i) {
        Chunk c;
        c.f = fmts[i % fmts.size()];
        c.P = (U(rng) % 3 == 0) ? 64 : 16;
        c.c0 = c.P == 64 ? 16u * uint32_t(U(rng) % 4) : 0u;
        c.pos0 = pos;
        pos += c.P;
        const int kind = U(rng) % 4;  // full, partial, a few rows, nothing
        c.lo = int(c.c0) + (kind == 1 ? U(rng) % 8 : kind == 2 ? 5 : 0);
        c.hi = int(c.c0) + (kind == 1 ? 8 + U(rng) % 9 : kind == 2 ? 7 : kind == 3 ? 0 : 16);
        if (kind == 3) c.lo = c.hi = int(c.c0);
        std::vector<float> k(size_t(c.P) * D), v(k.size());
        for (float &x : k) x = N(rng);
        for (float &x : v) x = N(rng);
        c.sub.assign(subpage_layout(c.f, c.P, D).bytes, 0);
        write_subpage(c.f, c.P, D, k.data(), v.data(), D, c.P, c.sub.data());
        chunks.push_back(std::move(c));
    }
    // Query rows: nrows real rows (the rest padding), each with its own causal limit.
    const int nrows = TR == 16 ? 9 + U(rng) % 8 : 1 + U(rng) % 8;
    std::vector<float> Qs(static_cast<size_t>(TR) * D, 0.0f);
    std::vector<int> qpos(TR, -1);
    for (int r = 0; r < nrows; ++r) {
        for (int d = 0; d < D; ++d) Qs[size_t(r) * D + d] = round_op(N(rng), BF);
        qpos[r] = int(pos) - 1 - (r % 3) * 9;  // some rows stop before the last chunk's rows
    }

    // The warp: stage every chunk, compute, finish into red[TR][D] + m[TR] + l[TR].
    std::vector<float> red(static_cast<size_t>(TR) * D + 2 * TR, NAN);
    std::vector<uint8_t> slot(size_t(kChunkRows) * 2 * 2 * D + 64 * D, 0);  // >= any format's slot
    const float qs = float(scale * kLog2e), cap2 = cap > 0 ? float(cap * kLog2e) : 0.0f;
    const float inv = cap2 > 0 ? 1.0f / cap2 : 0.0f;
    emu::run_warp([&](int lane) {
        tc::State<D, TR> w;
        tc::init_state<D, TR, BF>(w, Qs.data(), lane, [&](int r) { return qpos[r]; });
        for (const Chunk &c : chunks) {
            switch (c.f) {
                case IKV_FMT_F16: run_chunk<D, TR, BF, IKV_FMT_F16>(c, slot.data(), w, lane, qs, cap2, inv); break;
                case IKV_FMT_BF16: run_chunk<D, TR, BF, IKV_FMT_BF16>(c, slot.data(), w, lane, qs, cap2, inv); break;
                case IKV_FMT_FP8_E4M3:
                    run_chunk<D, TR, BF, IKV_FMT_FP8_E4M3>(c, slot.data(), w, lane, qs, cap2, inv);
                    break;
                case IKV_FMT_INT8: run_chunk<D, TR, BF, IKV_FMT_INT8>(c, slot.data(), w, lane, qs, cap2, inv); break;
                default: run_chunk<D, TR, BF, IKV_FMT_INT4>(c, slot.data(), w, lane, qs, cap2, inv); break;
            }
        }
        tc::finish<D, TR>(w, red.data(), lane);
    });

    // float64 reference per real row.
    double num = 0, den = 0, lse_err = 0;
    bool ok = true;
    const double lse_tol = BF ? 1e-2 : 1e-3, tol = BF ? 1e-2 : 2e-3;
    for (int r = 0; r < nrows; ++r) {
        std::vector<double> logit, vals;
        std::vector<float> krow(D), vrow(D);
        for (const Chunk &c : chunks)
            for (int pr = c.lo; pr < c.hi; ++pr) {
                if (int(c.pos0) + pr > qpos[r]) continue;
                read_subpage_row(c.f, c.P, D, c.sub.data(), 0, uint32_t(pr), krow.data());
                read_subpage_row(c.f, c.P, D, c.sub.data(), 1, uint32_t(pr), vrow.data());
                double s = 0;
                for (int d = 0; d < D; ++d) s += double(Qs[size_t(r) * D + d]) * krow[d];
                s *= scale;
                if (cap > 0) s = cap * std::tanh(s / cap);
                logit.push_back(s);
                vals.insert(vals.end(), vrow.begin(), vrow.end());
            }
        const float m2 = red[size_t(TR) * D + r], l = red[size_t(TR) * D + TR + r];
        if (logit.empty()) {
            if (!(std::isinf(m2) && m2 < 0 && l == 0.0f)) ok = false;
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (double s : logit) mx = std::max(mx, s);
        std::vector<double> o(D, 0.0);
        for (size_t i = 0; i < logit.size(); ++i) {
            const double p = std::exp(logit[i] - mx);
            sum += p;
            for (int d = 0; d < D; ++d) o[d] += p * vals[i * D + d];
        }
        const double lse = mx + std::log(sum), got_lse = double(m2) / kLog2e + std::log(double(l));
        lse_err = std::max(lse_err, std::fabs(got_lse - lse) / (1 + std::fabs(lse)));
        for (int d = 0; d < D; ++d) {
            const double ref = o[d] / sum, got = double(red[size_t(r) * D + d]) / l;
            if (!std::isfinite(got)) ok = false;
            num += (got - ref) * (got - ref);
            den += ref * ref;
        }
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    ok = ok && rel <= tol && lse_err <= lse_tol;
    std::string fm;
    static const char *names[] = {"f16", "bf16", "fp8", "int8", "int4"};
    for (ikv_format f : fmts) fm += std::string(fm.empty() ? "" : "+") + names[f];
    std::printf("%s D=%d TR=%d op=%s fmt=%s rows=%d%s rel_l2=%.2e (tol %.0e) lse=%.2e (tol %.0e)\n",
                ok ? "PASS" : "FAIL", D, TR, BF ? "bf16" : "f16", fm.c_str(), nrows, softcap ? " softcap" : "", rel,
                tol, lse_err, lse_tol);
    return ok;
}

template <int D, int TR, bool BF>
int run_all(uint32_t *seed) {
    const std::vector<std::vector<ikv_format>> sets = {
        {IKV_FMT_F16}, {IKV_FMT_BF16}, {IKV_FMT_FP8_E4M3}, {IKV_FMT_INT8}, {IKV_FMT_INT4},
        {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4, IKV_FMT_FP8_E4M3, IKV_FMT_BF16}};
    int fails = 0;
    for (size_t i = 0; i < sets.size(); ++i) fails += !run_case<D, TR, BF>(sets[i], i == 3 || i == 5, (*seed)++);
    return fails;
}

}  // namespace

int main() {
    uint32_t seed = 7;
    int fails = 0;
    fails += run_all<64, 8, false>(&seed) + run_all<64, 16, true>(&seed);
    fails += run_all<128, 8, false>(&seed) + run_all<128, 16, false>(&seed) + run_all<128, 8, true>(&seed);
    fails += run_all<256, 8, true>(&seed) + run_all<256, 16, false>(&seed);
    // D = 32: 2 k-steps for S, 4 P V n-tiles read as one 4-channel V slice per row, rows of 64/32/16 bytes.
    fails += run_all<32, 8, false>(&seed) + run_all<32, 16, false>(&seed) + run_all<32, 8, true>(&seed) +
             run_all<32, 16, true>(&seed);
    std::printf("%s: %d failed\n", fails ? "FAILED" : "all passed", fails);
    return fails ? 1 : 0;
}
