// Host helpers shared by the GPU check and benchmark: random pages built with
// the reference writer (common/quant.hpp), device buffers, error checks.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <random>
#include <vector>

#include "common/quant.hpp"
#include "ikv_kernels.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                    cudaGetErrorString(e_));                                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

namespace gpucheck {

using ikv::PageShape;
using ikv::cuda::DevPage;

// Summaries as the host store computes them (src/pool/host_page_store.cpp).
inline void host_summaries(const PageShape &s, ikv_format f, uint8_t *page, uint32_t layer, uint32_t n_valid) {
    const uint32_t P = s.page_size, D = s.head_dim;
    std::vector<float> row(D);
    for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
        const uint8_t *sub = page + ikv::subpage_offset(s, f, layer, h);
        uint16_t *rec = reinterpret_cast<uint16_t *>(page + ikv::summary_offset(s, f, layer, h));
        std::vector<float> mn(D, INFINITY), mx(D, -INFINITY);
        std::vector<double> sum(D, 0.0);
        for (uint32_t t = 0; t < n_valid; ++t) {
            ikv::read_subpage_row(f, P, D, sub, 0, t, row.data());
            for (uint32_t d = 0; d < D; ++d) {
                mn[d] = fminf(mn[d], row[d]);
                mx[d] = fmaxf(mx[d], row[d]);
                sum[d] += row[d];
            }
        }
        for (uint32_t d = 0; d < D; ++d) {
            if (n_valid == 0) mn[d] = mx[d] = 0.0f;
            ikv::encode_summary(rec, D, d, mn[d], mx[d], n_valid == 0 ? 0.0 : sum[d] / n_valid);
        }
    }
}

// Random K/V rows: per-channel offsets and scales so quantization groups differ.
struct Rng {
    std::mt19937_64 g;
    explicit Rng(uint64_t seed) : g(seed) {}
    float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(g); }
    float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(g); }
    uint32_t below(uint32_t n) { return uint32_t(g() % n); }
};

// A sequence of pages in host memory (bytes as the pool writes them) and its
// device copy; rows for one layer/head are reconstructed with read_subpage_row.
struct HostSeq {
    uint32_t length = 0;
    std::vector<ikv_format> formats;     // per page
    std::vector<std::vector<uint8_t>> pages;
    std::vector<uint8_t *> dev;          // device base per page
};

inline void build_seq(const PageShape &s, uint32_t length, const std::vector<ikv_format> &fmts, Rng &rng,
                      HostSeq *out) {
    const uint32_t P = s.page_size, D = s.head_dim, H = s.n_kv_heads;
    const uint32_t n_pages = (length + P - 1) / P;
    out->length = length;
    out->formats.assign(n_pages, IKV_FMT_F16);
    out->pages.assign(n_pages, {});
    std::vector<float> ch_off(D), ch_scale(D);
    for (uint32_t d = 0; d < D; ++d) ch_off[d] = 0.5f * rng.normal(), ch_scale[d] = rng.uniform(0.3f, 2.0f);
    std::vector<float> k(size_t(H) * P * D), v(size_t(H) * P * D);
    for (uint32_t pg = 0; pg < n_pages; ++pg) {
        const ikv_format f = fmts[pg % fmts.size()];
        out->formats[pg] = f;
        out->pages[pg].assign(ikv::page_bytes(s, f), 0);
        const uint32_t n_valid = (pg + 1) * P <= length ? P : length - pg * P;
        for (uint32_t l = 0; l < s.n_layers; ++l) {
            for (size_t i = 0; i < k.size(); ++i) {
                const uint32_t d = uint32_t(i % D);
                k[i] = ch_off[d] + ch_scale[d] * rng.normal();
                v[i] = rng.normal();
            }
            for (uint32_t h = 0; h < H; ++h)
                ikv::write_subpage(f, P, D, k.data() + size_t(h) * P * D, v.data() + size_t(h) * P * D, D, n_valid,
                                   out->pages[pg].data() + ikv::subpage_offset(s, f, l, h));
            host_summaries(s, f, out->pages[pg].data(), l, n_valid);
        }
    }
}

inline void upload_seq(HostSeq *hs, std::vector<void *> *allocs) {
    hs->dev.resize(hs->pages.size());
    for (size_t i = 0; i < hs->pages.size(); ++i) {
        void *d = nullptr;
        CK(cudaMalloc(&d, hs->pages[i].size()));
        CK(cudaMemcpy(d, hs->pages[i].data(), hs->pages[i].size(), cudaMemcpyHostToDevice));
        hs->dev[i] = static_cast<uint8_t *>(d);
        allocs->push_back(d);
    }
}

template <typename T>
T *to_device(const std::vector<T> &v, std::vector<void *> *allocs) {
    void *d = nullptr;
    CK(cudaMalloc(&d, v.empty() ? 16 : v.size() * sizeof(T)));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    allocs->push_back(d);
    return static_cast<T *>(d);
}

inline void free_all(std::vector<void *> *allocs) {
    for (void *p : *allocs) cudaFree(p);
    allocs->clear();
}

// Check outcomes: one PASS/FAIL line each; the counts make the exit status.
inline int g_failures = 0, g_cases = 0;
inline void report(bool ok, const char *what) {
    ++g_cases;
    if (!ok) ++g_failures;
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    fflush(stdout);
}

// 16-bit dtype (F16 / BF16) bits of x, and back.
inline uint16_t to_half_bits(float x, ikv_dtype dt) { return dt == IKV_DTYPE_F16 ? ikv::f32_to_f16(x) : ikv::f32_to_bf16(x); }
inline float from_bits(uint16_t b, ikv_dtype dt) { return dt == IKV_DTYPE_F16 ? ikv::f16_to_f32(b) : ikv::bf16_to_f32(b); }

// A work list in host memory: the DevPage entries (base = device pointer) and
// the index of each entry's page in its HostSeq.
struct HostList {
    std::vector<DevPage> pages;
    std::vector<uint32_t> page_idx;
};

// Each page kept with probability keep (the last page always: the newest
// tokens), 30% of them with random partial bounds; empty: no pages.
inline HostList random_list(const PageShape &s, const HostSeq &hs, Rng &rng, double keep, bool empty) {
    HostList L;
    if (empty) return L;
    const uint32_t P = s.page_size;
    for (uint32_t pg = 0; pg < hs.pages.size(); ++pg) {
        const uint32_t n_valid = std::min(P, hs.length - pg * P);
        const bool last = pg + 1 == hs.pages.size();
        if (!last && rng.uniform(0, 1) > keep) continue;
        uint32_t b = 0, e = n_valid;
        if (rng.uniform(0, 1) < 0.3 && n_valid > 2) {
            b = rng.below(n_valid - 1);
            e = b + 1 + rng.below(n_valid - b);
        }
        DevPage d{};
        d.base = hs.dev[pg];
        d.pos0 = pg * P;
        d.begin = uint8_t(b);
        d.end = uint8_t(e);
        d.format = uint8_t(hs.formats[pg]);
        d.flags = (b > 0 || e < P) ? IKV_PAGE_PARTIAL : 0;
        L.pages.push_back(d);
        L.page_idx.push_back(pg);
    }
    return L;
}

// Sequences of the given lengths (page formats cycling through fmts), uploaded,
// and a random list (keep 60%) per sequence, or per (sequence, kv-head) when
// per_head; sequence 1's lists are empty when with_empty.
inline void random_case(const PageShape &s, const std::vector<uint32_t> &lens, const std::vector<ikv_format> &fmts,
                        bool per_head, bool with_empty, Rng &rng, std::vector<HostSeq> *seqs,
                        std::vector<HostList> *lists, std::vector<void *> *allocs) {
    seqs->assign(lens.size(), HostSeq{});
    for (size_t b = 0; b < lens.size(); ++b) {
        build_seq(s, lens[b], fmts, rng, &(*seqs)[b]);
        upload_seq(&(*seqs)[b], allocs);
    }
    const uint32_t list_heads = per_head ? s.n_kv_heads : 1;
    lists->clear();
    for (size_t b = 0; b < lens.size(); ++b)
        for (uint32_t h = 0; h < list_heads; ++h)
            lists->push_back(random_list(s, (*seqs)[b], rng, 0.6, with_empty && b == 1));
}

// Command line of the GPU check programs: [--check] [--bench] [--quick] [--out DIR]
// (--out defaults to $OUT; neither --check nor --bench means --check).
struct CheckArgs {
    bool check = false, bench = false, quick = false;
    const char *out_dir = nullptr;
};
// Returns false (after printing the usage) on an unknown argument.
inline bool parse_check_args(int argc, char **argv, CheckArgs *a) {
    a->out_dir = getenv("OUT");
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--check")) a->check = true;
        else if (!strcmp(argv[i], "--bench")) a->bench = true;
        else if (!strcmp(argv[i], "--quick")) a->quick = true;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) a->out_dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--check] [--bench] [--quick] [--out DIR]\n", argv[0]);
            return false;
        }
    }
    if (!a->check && !a->bench) a->check = true;
    return true;
}
// Device 0's properties, printed; false (after "SKIPPED: no CUDA device") without one.
inline bool first_device(cudaDeviceProp *prop) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIPPED: no CUDA device\n");
        return false;
    }
    CK(cudaGetDeviceProperties(prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop->name, prop->multiProcessorCount, prop->l2CacheSize >> 20);
    return true;
}

}  // namespace gpucheck
