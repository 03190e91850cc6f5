// The tensor-core page scores of kernels/score_mma.cuh (the score kernel's
// warp tile on sm_80+), run on the CPU by the warp emulation
// (warp_emulation.hpp) and checked against float64.
//
// What it checks without a GPU: the split of each query value into three bf16
// parts (their sum exactly x, no overflow, NaN/inf kept in hi), the
// staged B columns (parts in record order, one column per split part and row,
// zero rows past R), which lane loads which record channels (the permuted
// channel order shared by A and B), the parts' sum across lanes or n-tiles, the rows and
// pages each lane ends with, and absent pages (a zero record). For every
// head_dim (32, 64, 128, 256), Quest and hybrid records, 4 and 8 staged rows
// with 1..RW of them used. Reference: sum_d min(q_d,0) kmin_d + max(q_d,0)
// kmax_d (+ q_d kmean_d) in double over the stored bf16 records; tolerance
// 1e-6 x (1 + the sum of the products' magnitudes): the emulation sums in
// double and rounds once per mma, ~2e-7; dropping the lo part (2^-16 of each
// query value) gives ~2e-6 and fails. The staging buffer starts as 0xFF
// bytes, as unzeroed shared memory would. What it cannot check: the
// hardware's mma (emulated from the PTX ISA layout) and the kernel around the
// tile (bench/gpu runs it on a device). Exit 0 if every case passes.
#define IKV_WARP_EMULATION 1
#include "warp_emulation.hpp"
// warp_emulation.hpp first: the kernels' intrinsics resolve to the emulation.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/quant.hpp"
#include "score_mma.cuh"

namespace {

using namespace ikv;
namespace st = ikv::cuda::score_tc;

bool check_split(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(-140, 127);
    double worst = 0;
    bool ok = true;
    for (int i = 0; i < 200000; ++i) {
        float x = std::ldexp(mant(rng), ex(rng)) * (i % 2 ? -1.0f : 1.0f);
        if (i == 0) x = 3.4028235e38f;  // FLT_MAX: the nearest bf16 would be inf
        if (i == 1) x = -3.4028235e38f;
        if (!std::isfinite(x)) continue;
        uint16_t sp[3];
        st::split_bf16(x, sp);
        const double sum = double(bf16_to_f32(sp[0])) + double(bf16_to_f32(sp[1])) + double(bf16_to_f32(sp[2]));
        if (!std::isfinite(sum)) ok = false;
        const double e = std::fabs(sum - double(x)) / std::fabs(double(x));
        if (std::fabs(double(x)) > 1e-30) worst = std::max(worst, e);  // subnormal parts lose bits: not the bound
    }
    uint16_t sp[3];
    st::split_bf16(INFINITY, sp);
    ok = ok && sp[0] == 0x7F80u && sp[1] == 0 && sp[2] == 0;
    st::split_bf16(NAN, sp);
    ok = ok && std::isnan(bf16_to_f32(sp[0])) && sp[1] == 0 && sp[2] == 0;
    ok = ok && worst == 0.0;
    std::printf("%s split_bf16: worst |hi + mid + lo - x| / |x| = %.2e (exact expected), NaN/inf kept in hi\n",
                ok ? "PASS" : "FAIL", worst);
    return ok;
}

template <int D, bool kHybrid, int RW>
bool run_case(uint32_t R, uint32_t seed) {
    using T = st::TileGeom<D, kHybrid, RW>;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // 16 records of 3 D bf16 (kmin, kmax, kmean), pages 5 and 12 absent.
    std::vector<uint4> recs(16 * 3 * D / 8);
    std::vector<float> kv(16 * 3 * D);
    for (int pg = 0; pg < 16; ++pg) {
        const float scale = std::ldexp(1.0f, int(rng() % 9) - 4);  // records of different magnitudes
        uint16_t *rec = reinterpret_cast<uint16_t *>(recs.data() + pg * 3 * D / 8);
        for (int d = 0; d < D; ++d) {
            const float a = nd(rng) * scale, b = nd(rng) * scale;
            encode_summary(rec, D, uint32_t(d), std::min(a, b), std::max(a, b), 0.5f * (a + b));
        }
        for (int k = 0; k < 3 * D; ++k) kv[pg * 3 * D + k] = bf16_to_f32(rec[k]);
    }
    auto absent = [](int pg) { return pg == 5 || pg == 12; };
    std::vector<float> q(RW * D);
    for (float &x : q) x = nd(rng) * 3.0f;
    for (int d = 0; d < D; d += 7) q[d] = 0.0f;  // zeros: both parts zero
    std::vector<uint8_t> qsm(T::kSmemBytes + 16, 0xFF);  // not zero: stage_rows writes every column read
    uint8_t *smem = qsm.data() + (16 - reinterpret_cast<uintptr_t>(qsm.data()) % 16) % 16;
    std::vector<float> got(16 * RW, NAN);
    std::vector<int> writes(16 * RW, 0);
    emu::run_warp([&](int lane) {
        st::stage_rows<D, kHybrid, RW>(smem, R, [&](uint32_t r, uint32_t d) { return q[r * D + d]; }, lane, 32);
        __syncwarp();
        const int g = lane / 4;
        const uint4 *r0 = absent(g) ? nullptr : recs.data() + g * 3 * D / 8;
        const uint4 *r1 = absent(g + 8) ? nullptr : recs.data() + (g + 8) * 3 * D / 8;
        float s[4];
        st::tile_scores<D, kHybrid, RW>(smem, r0, r1, lane, s);
        const int row0 = st::tile_row0<RW>(lane);
        __syncwarp();
        // One writer per (page, row) (checked by the write count): with RW = 4 lanes t < 2 of the
        // pair t, t^2 that hold the same rows.
        if (RW == 8 || (lane & 3) < 2)
            for (int e = 0; e < 4; ++e) {
                const int pg = g + (e >= 2 ? 8 : 0), r = row0 + (e & 1);
                got[pg * RW + r] = s[e];
                ++writes[pg * RW + r];
            }
        __syncwarp();
    });
    bool ok = true;
    double worst = 0;
    for (int pg = 0; pg < 16; ++pg)
        for (uint32_t r = 0; r < uint32_t(RW); ++r) {
            double ref = 0, mag = 0;
            for (int k = 0; k < T::kK && r < R && !absent(pg); ++k) {
                const int part = k / D, d = k % D;
                const double x = q[r * D + d], kx = kv[pg * 3 * D + k];
                const double v = part == 0 ? std::min(x, 0.0) : part == 1 ? std::max(x, 0.0) : x;
                ref += v * kx;
                mag += std::fabs(v * kx);
            }
            if (writes[pg * RW + r] != 1) ok = false;
            const double e = std::fabs(double(got[pg * RW + r]) - ref) / (1.0 + mag);
            worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
        }
    ok = ok && worst <= 1e-6;
    std::printf("%s D=%d %s RW=%d rows=%u: worst |score - float64| / (1 + mag) = %.2e (tol 1e-6)\n",
                ok ? "PASS" : "FAIL", D, kHybrid ? "hybrid" : "quest", RW, R, worst);
    return ok;
}

template <int D>
int run_all(uint32_t *seed) {
    int fails = 0;
    for (uint32_t R : {1u, 3u, 4u}) {
        fails += !run_case<D, false, 4>(R, (*seed)++);
        fails += !run_case<D, true, 4>(R, (*seed)++);
    }
    for (uint32_t R : {5u, 8u}) {
        fails += !run_case<D, false, 8>(R, (*seed)++);
        fails += !run_case<D, true, 8>(R, (*seed)++);
    }
    return fails;
}

}  // namespace

int main() {
    uint32_t seed = 11;
    int fails = !check_split(seed++);
    fails += run_all<32>(&seed) + run_all<64>(&seed) + run_all<128>(&seed) + run_all<256>(&seed);
    std::printf("%s: %d failed\n", fails ? "FAILED" : "all passed", fails);
    return fails ? 1 : 0;
}
