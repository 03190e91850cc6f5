// Host helpers shared by the GPU check and benchmark: random pages built with
// the reference writer (common/quant.hpp), device buffers, error checks.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

// Summaries as the host store computes them (src/pool/host_page_store.cpp).
inline void host_summaries(const PageShape &s, ikv_format f, uint8_t *page, uint32_t layer, uint32_t n_valid) {
    const uint32_t P = s.page_size, D = s.head_dim;
    std::vector<float> row(D);
    for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
        const uint8_t *sub = page + ikv::subpage_offset(s, f, layer, h);
        float *rec = reinterpret_cast<float *>(page + ikv::summary_offset(s, f, layer, h));
        float *mn = rec, *mx = rec + D, *mean = rec + 2 * D;
        std::vector<double> sum(D, 0.0);
        for (uint32_t d = 0; d < D; ++d) mn[d] = INFINITY, mx[d] = -INFINITY;
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
            mean[d] = n_valid == 0 ? 0.0f : float(sum[d] / n_valid);
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

}  // namespace gpucheck
