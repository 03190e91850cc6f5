// The attention kernel, written once over a vector-ops type O and a page
// format, instantiated by each ISA file (attn_scalar.cpp, attn_avx2.cpp,
// attn_avx512.cpp, attn_neon.cpp). Include it INSIDE an anonymous namespace
// after defining O, so each ISA's instantiations stay private to its file.
//
// O provides: type V, lane count W (4, 8 or 16; divides 16), zero(), set1(),
// load(), store(), add(), mul(), fma(a, b, c) = a*b + c, hsum(), hmax()
// (largest lane), hsum4(a, out, stride) (out[j * stride] = hsum(a[j]) for
// j < 4, by one shuffle tree), min(), max(), round() (to nearest), pow2(n)
// (2^n for integral n in [-126, 127]), kValueChunks (D-chunks per pass of
// the value accumulation: 2 with 16 vector registers, 4 with 32),
// zero_below(x, lo, y) (y where x >= lo, else 0), prefetch(p), FlushDenormals
// (a guard type: subnormals flushed to zero for its lifetime), and the
// format loaders, each returning W floats from the row bytes at p:
//   f16(p), bf16(p), i8(p), u4(p) (W/2 packed bytes: channel 2j in the low
//   nibble of byte j), e4m3_div256(p) (the E4M3 value times 2^-8: the codes
//   are re-biased into IEEE half bits, which is exact, and the 2^8 is folded
//   into the page scale). NaN codes (0x7F/0xFF) are never written by the pool.
// kIntValues: whether O has the integer ops of INT8 values (VI, izero,
// i8_pairs, dot_pairs, add_pair_sums, to_i16; avx512_ops.hpp with VNNI);
// values_int8 below uses them, the other paths sum INT8 values in fp32.
//
// Per span (a run of tokens of one sub-page): every K and V row is
// dequantized ONCE into the span buffers (one page at most, L1/L2 resident)
// and used by all R query rows of the group. Logits are computed for blocks
// of 4 rows x 2 tokens in registers; each row gets one online-softmax update
// per span (vector exp); V is accumulated for blocks of 4 rows with the
// accumulators in registers across the span's tokens. Nothing larger than a
// page is ever expanded to fp32.

// Where one sub-page's K (IsK) or V rows and their scales are. Built once per
// span so the inner loops do address arithmetic only.
// Scales are folded out of the inner loops where the algebra allows: K's
// into the query once per span (INT8 and INT4 per channel, FP8 the page's;
// INT4's K minimum becomes one bias per query row, q.k_min), V's into the
// softmax weights (INT8 per token, FP8 per page); those rows are then read raw.
template <uint32_t F>
constexpr bool kFoldScales = F == IKV_FMT_INT8 || F == IKV_FMT_FP8_E4M3;
template <uint32_t F, bool IsK>
constexpr bool kRawRows = kFoldScales<F> || (IsK && F == IKV_FMT_INT4);

// INT4's group parameters are halves (page_format.hpp): K's are read as
// vectors (O::f16) where they are folded; V's per-token ones are converted
// once per span into vmeta (scales [P*G], then minimums [P*G], by token).
template <uint32_t F, bool IsK>
struct RowSource {
    const uint8_t *data;  // row 0
    const float *sc, *mn;  // FP8/INT8 scales; INT4 V: vmeta's scales and minimums (else unread)
    const uint8_t *sch, *mnh;  // INT4: the stored half scales and minimums
    size_t D, G, row_bytes;
    RowSource(const uint8_t *sub, const SubpageLayout &L, uint32_t D_, const float *vmeta = nullptr, uint32_t P = 0)
        : data(sub + (IsK ? L.k : L.v)),
          sc(reinterpret_cast<const float *>(sub + (IsK ? L.k_scale : L.v_scale))),
          mn(reinterpret_cast<const float *>(sub + (IsK ? L.k_min : L.v_min))),  // in the page: row() offsets it
          sch(sub + (IsK ? L.k_scale : L.v_scale)),
          mnh(sub + (IsK ? L.k_min : L.v_min)),
          D(D_),
          G((D_ + kInt4VGroup - 1) / kInt4VGroup),
          row_bytes(row_bytes_of(D_)) {
        if (vmeta) sc = vmeta, mn = vmeta + uint64_t(P) * G;
    }
    static size_t row_bytes_of(size_t D) {
        return F == IKV_FMT_F16 || F == IKV_FMT_BF16 ? 2 * D : F == IKV_FMT_INT4 ? D / 2 : D;
    }
    // One token row: the inner loops take W channels at a time from it.
    struct Row {
        const uint8_t *p;
        const float *gsc, *gmn;  // INT4 V: this token's group scales and minimums
        typename O::V at(size_t d) const {
            if (F == IKV_FMT_F16) return O::f16(p + 2 * d);
            if (F == IKV_FMT_BF16) return O::bf16(p + 2 * d);
            if (F == IKV_FMT_FP8_E4M3) return O::e4m3_div256(p + d);  // scale folded (kFoldScales)
            if (F == IKV_FMT_INT8) return O::i8(p + d);               // scale folded (kFoldScales)
            // INT4: K raw (scale and minimum folded, kRawRows); V per token in
            // groups of 32 channels (W divides 32: a chunk never straddles a group)
            const typename O::V q = O::u4(p + d / 2);
            if (IsK) return q;
            return O::fma(q, O::set1(gsc[d / kInt4VGroup]), O::set1(gmn[d / kInt4VGroup]));
        }
    };
    Row row(size_t t) const { return Row{data + t * row_bytes, sc + t * G, mn + t * G}; }
};

template <uint32_t F, bool IsK>
inline void dequant_row(const RowSource<F, IsK> &src, uint32_t t, uint32_t D, float *out) {
    const auto r = src.row(t);
    for (size_t d = 0; d < D; d += O::W) O::store(out + d, r.at(d));
}

// Two sources of the span's rows for the blocked loops below: straight from
// the page, dequantizing as it loads (used when all rows fit one register
// block, so every element is still dequantized once), or from the span
// buffer a page was dequantized into (more rows than one block).
template <uint32_t F, bool IsK>
struct PageRows {
    RowSource<F, IsK> src;
    size_t begin;
    typename RowSource<F, IsK>::Row row(size_t i) const { return src.row(begin + i); }
};
struct BufRows {
    const float *base;
    size_t D;
    struct Row {
        const float *p;
        typename O::V at(size_t d) const { return O::load(p + d); }
    };
    Row row(size_t i) const { return Row{base + i * D}; }
};

// Software prefetch of a later span's K and V rows (and scales), spread over
// the inner loops of the span being computed: the sub-pages of consecutive
// pages lie a whole page apart, so the hardware prefetcher alone restarts on
// every span, and a span's 128 lines (F16, D = 128) prefetched back to back
// stall the loads behind them until the misses drain (2-vCPU Zen 4, dense
// F16 from DRAM: 1.5x slower than the same lines issued a few per
// iteration). step() issues a few lines; drain() the rest, at the span's end.
struct SpanPrefetch {
    // One byte range, walked a 64-byte line at a time from its first line.
    struct Lines {
        const uint8_t *line = nullptr, *end = nullptr;
        void set(const uint8_t *p, uint64_t n) {
            end = p + n;
            line = n ? reinterpret_cast<const uint8_t *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63)) : end;
        }
        bool left() const { return line < end; }
        void issue() {
            if (line < end) {
                O::prefetch(line);
                line += 64;
            }
        }
    };
    Lines k, v, meta;  // the span's K rows, V rows, and the sub-page's scales and minimums

    void set(const ChunkTask &T, const SpanRef &s) {
        const SubpageLayout &L = T.layouts[s.fmt];
        const uint64_t rb = s.fmt == IKV_FMT_F16 || s.fmt == IKV_FMT_BF16 ? 2ull * T.D
                          : s.fmt == IKV_FMT_INT4                         ? T.D / 2ull
                                                                          : 1ull * T.D;
        const uint64_t n = (s.end - s.begin) * rb;
        k.set(s.sub + L.k + s.begin * rb, n);
        v.set(s.sub + L.v + s.begin * rb, n);
        meta.set(s.sub + 2 * L.v, L.bytes - 2 * L.v);  // metadata follows the rows (page_format.hpp): INT4 12 lines
    }
    void step() {
        meta.issue();
        for (int j = 0; j < kLinesPerStep; ++j) {
            k.issue();
            v.issue();
        }
    }
    void drain() {
        while (k.left() || v.left() || meta.left()) step();
    }
    static constexpr int kLinesPerStep = 2;  // of K and of V: an F16 span's rows within its ~40 AVX-512 loop iterations
};

// e^x lane-wise (Cephes expf: range reduction by ln 2 in two parts and a
// degree-5 polynomial; ~1 ulp), exactly 0 for x < -87 (-inf: masked tokens).
inline typename O::V vexp(typename O::V x) {
    using V = typename O::V;
    V t = O::min(O::max(x, O::set1(-87.0f)), O::set1(88.0f));
    const V n = O::round(O::mul(t, O::set1(1.44269504088896341f)));
    t = O::fma(n, O::set1(-0.693359375f), t);
    t = O::fma(n, O::set1(2.12194440e-4f), t);
    V y = O::set1(1.9875691500e-4f);
    y = O::fma(y, t, O::set1(1.3981999507e-3f));
    y = O::fma(y, t, O::set1(8.3334519073e-3f));
    y = O::fma(y, t, O::set1(4.1665795894e-2f));
    y = O::fma(y, t, O::set1(1.6666665459e-1f));
    y = O::fma(y, t, O::set1(5.0000001201e-1f));
    y = O::fma(y, O::mul(t, t), O::add(t, O::set1(1.0f)));
    return O::zero_below(x, -87.0f, O::mul(y, O::pow2(n)));
}

// acc[0..D) = acc * alpha (alpha < 1 rescale of an online-softmax row).
inline void scale_row(float *acc, float alpha, uint32_t D) {
    const typename O::V a = O::set1(alpha);
    for (uint32_t d = 0; d < D; d += O::W) O::store(acc + d, O::mul(O::load(acc + d), a));
}

// Logits of NR query rows (r0..) against the span's n K rows, two tokens at a
// time so each q chunk load feeds two FMAs. Pointers and size_t indices
// throughout: the inner loops are loads and FMAs, no index arithmetic.
template <uint32_t NR, class Rows>
inline void logits_block(const ChunkTask &T, const float *qbase, const Rows &rows, uint32_t n, uint32_t r0, float *S,
                         uint32_t SP, SpanPrefetch &pf) {
    using V = typename O::V;
    const size_t D = T.D;
    const float *q[NR];
    float *out[NR];
    for (uint32_t j = 0; j < NR; ++j) {
        q[j] = qbase + (r0 + j) * D;
        out[j] = S + size_t(r0 + j) * SP;
    }
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        pf.step();
        const auto k0 = rows.row(i), k1 = rows.row(i + 1);
        V a[NR], b[NR];
        for (uint32_t j = 0; j < NR; ++j) a[j] = b[j] = O::zero();
        for (size_t d = 0; d < D; d += O::W) {
            const V x0 = k0.at(d), x1 = k1.at(d);
            for (uint32_t j = 0; j < NR; ++j) {
                const V qj = O::load(q[j] + d);
                a[j] = O::fma(qj, x0, a[j]);
                b[j] = O::fma(qj, x1, b[j]);
            }
        }
        if constexpr (NR == 4) {  // one shuffle tree per 4 sums instead of 4 horizontal sums
            O::hsum4(a, out[0] + i, SP);
            O::hsum4(b, out[0] + i + 1, SP);
        } else {
            for (uint32_t j = 0; j < NR; ++j) {
                out[j][i] = O::hsum(a[j]);
                out[j][i + 1] = O::hsum(b[j]);
            }
        }
    }
    if (i < n) {
        const auto k0 = rows.row(i);
        V a[NR];
        for (uint32_t j = 0; j < NR; ++j) a[j] = O::zero();
        for (size_t d = 0; d < D; d += O::W) {
            const V x0 = k0.at(d);
            for (uint32_t j = 0; j < NR; ++j) a[j] = O::fma(O::load(q[j] + d), x0, a[j]);
        }
        for (uint32_t j = 0; j < NR; ++j) out[j][i] = O::hsum(a[j]);
    }
}

// acc[r0..r0+NR) += sum_i p[r][i] * v_i: accumulators of O::kValueChunks
// D-chunks held in registers across the span's tokens (2 where there are 16
// vector registers, 4 with 32), each weight broadcast once per token. The
// span's sum starts from zero and joins acc once: one fp32 running sum over a
// 32K-token chunk drifted up to 2.9e-5 relative from float64 on real
// attention (bench/RESULTS.md 6u); a sum per span then a sum of spans keeps
// the rounding to ~sqrt(span tokens) + sqrt(spans) ulps instead of
// ~sqrt(tokens).
template <uint32_t NR, class Rows>
inline void values_block(const ChunkTask &T, const Rows &rows, uint32_t n, uint32_t r0, const float *S, uint32_t SP,
                         SpanPrefetch &pf) {
    using V = typename O::V;
    constexpr uint32_t NC = O::kValueChunks;
    const size_t D = T.D;
    const float *w[NR];
    float *acc[NR];
    for (uint32_t j = 0; j < NR; ++j) {
        w[j] = S + size_t(r0 + j) * SP;
        acc[j] = T.acc + (r0 + j) * D;
    }
    size_t d = 0;
    for (; d + NC * O::W <= D; d += NC * O::W) {
        V a[NC][NR];
        for (uint32_t c = 0; c < NC; ++c)
            for (uint32_t j = 0; j < NR; ++j) a[c][j] = O::zero();
        for (size_t i = 0; i < n; ++i) {
            pf.step();
            const auto vr = rows.row(i);
            V v[NC];
            for (uint32_t c = 0; c < NC; ++c) v[c] = vr.at(d + c * O::W);
            for (uint32_t j = 0; j < NR; ++j) {
                const V p = O::set1(w[j][i]);
                for (uint32_t c = 0; c < NC; ++c) a[c][j] = O::fma(p, v[c], a[c][j]);
            }
        }
        for (uint32_t c = 0; c < NC; ++c)
            for (uint32_t j = 0; j < NR; ++j)
                O::store(acc[j] + d + c * O::W, O::add(O::load(acc[j] + d + c * O::W), a[c][j]));
    }
    for (; d < D; d += O::W) {  // chunks left over (e.g. D = 80 with 16 lanes)
        V a[NR];
        for (uint32_t j = 0; j < NR; ++j) a[j] = O::zero();
        for (size_t i = 0; i < n; ++i) {
            const V v0 = rows.row(i).at(d);
            for (uint32_t j = 0; j < NR; ++j) a[j] = O::fma(O::set1(w[j][i]), v0, a[j]);
        }
        for (uint32_t j = 0; j < NR; ++j) O::store(acc[j] + d, O::add(O::load(acc[j] + d), a[j]));
    }
}

constexpr uint32_t kRowBlock = 4;  // query rows per register block
constexpr uint32_t kMaxSpanWeights = logit_stride(128);  // one row's weights of a span (P <= 128)

template <class Rows>
inline void all_logits(const ChunkTask &T, const float *q, const Rows &rows, uint32_t n, float *S, uint32_t SP,
                       SpanPrefetch &pf) {
    uint32_t r = 0;
    for (; r + kRowBlock <= T.R; r += kRowBlock) logits_block<kRowBlock>(T, q, rows, n, r, S, SP, pf);
    switch (T.R - r) {
        case 3: logits_block<3>(T, q, rows, n, r, S, SP, pf); break;
        case 2: logits_block<2>(T, q, rows, n, r, S, SP, pf); break;
        case 1: logits_block<1>(T, q, rows, n, r, S, SP, pf); break;
        default: break;
    }
}

template <class Rows>
inline void all_values(const ChunkTask &T, const Rows &rows, uint32_t n, const float *S, uint32_t SP,
                       SpanPrefetch &pf) {
    uint32_t r = 0;
    for (; r + kRowBlock <= T.R; r += kRowBlock) values_block<kRowBlock>(T, rows, n, r, S, SP, pf);
    switch (T.R - r) {
        case 3: values_block<3>(T, rows, n, r, S, SP, pf); break;
        case 2: values_block<2>(T, rows, n, r, S, SP, pf); break;
        case 1: values_block<1>(T, rows, n, r, S, SP, pf); break;
        default: break;
    }
}

// INT4 V: the group scales and minimums of the span's tokens as floats,
// vmeta[t*G + g] and vmeta[P*G + t*G + g]: whole vectors, then the rest
// through a zero-padded copy (no read past the section; and no scalar
// converter here: quant.hpp's inline functions must not be compiled with an
// ISA file's flags).
inline void int4_v_meta(const SpanRef &s, const SubpageLayout &L, uint32_t D, uint32_t P, float *vmeta) {
    const uint32_t G = (D + kInt4VGroup - 1) / kInt4VGroup, i0 = s.begin * G, i1 = s.end * G;  // by hand: no shared
                                                                                                 // inline here
    for (int which = 0; which < 2; ++which) {
        const uint8_t *h = s.sub + (which == 0 ? L.v_scale : L.v_min);
        float *out = vmeta + which * uint64_t(P) * G;
        uint32_t i = i0;
        for (; i + O::W <= i1; i += O::W) O::store(out + i, O::f16(h + 2 * i));
        if (i < i1) {
            uint8_t pad[2 * 16] = {};
            float tmp[16];
            memcpy(pad, h + 2 * i, 2 * (i1 - i));
            O::store(tmp, O::f16(pad));
            memcpy(out + i, tmp, 4 * (i1 - i));
        }
    }
}

// INT8 values through 16-bit integer dot products (O::kIntValues, D a
// multiple of 32): acc[r] += sum_i S[r][i] * v_i, where S already holds
// p * v_scale per token. Each row's weights are rounded to int16 relative to
// the row's largest in the span (w * 32767 / max, to nearest: each weight
// off by at most max / 65534, docs/FORMATS.md), two tokens' codes are
// interleaved per channel and summed exactly in int32 lanes (at most
// P * 32767 * 128 < 2^31), and the sums go into the fp32 accumulators once
// per span, times max. Rows of 4 at a time, channels 64 at a time
// (32 for the rest), so a block's int32 sums stay in registers.
template <class Ops, uint32_t NR, uint32_t NG>
inline void values_int8_pass(const ChunkTask &T, const uint8_t *rows, uint32_t n, uint32_t r0, size_t d,
                             const int16_t (*wq)[kMaxSpanWeights], const float *wmax, SpanPrefetch &pf) {
    using VI = typename Ops::VI;
    constexpr uint32_t NC = 2 * NG;  // int32 vectors per row: (lo, hi) per 32 channels
    const size_t D = T.D;
    VI a[NR][NC];
    for (uint32_t j = 0; j < NR; ++j)
        for (uint32_t c = 0; c < NC; ++c) a[j][c] = Ops::izero();
    for (uint32_t i = 0; i < n; i += 2) {
        pf.step();  // once per token, as the fp32 value loop (SpanPrefetch: a later span's lines spread out)
        pf.step();
        const uint8_t *ra = rows + i * D + d;
        const uint8_t *rb = i + 1 < n ? ra + D : ra;  // an odd last token pairs with itself at weight 0
        VI x[NC];
        for (uint32_t g = 0; g < NG; ++g) Ops::i8_pairs(ra + 32 * g, rb + 32 * g, x[2 * g], x[2 * g + 1]);
        for (uint32_t j = 0; j < NR; ++j)
            for (uint32_t c = 0; c < NC; ++c) a[j][c] = Ops::dot_pairs(a[j][c], x[c], wq[j] + i);
    }
    for (uint32_t j = 0; j < NR; ++j)
        for (uint32_t g = 0; g < NG; ++g)
            Ops::add_pair_sums(T.acc + (r0 + j) * D + d + 32 * g, a[j][2 * g], a[j][2 * g + 1], wmax[j]);
}

template <class Ops, uint32_t NR>
inline void values_int8_block(const ChunkTask &T, const uint8_t *rows, uint32_t n, uint32_t r0, const float *S,
                              uint32_t SP, SpanPrefetch &pf) {
    const uint32_t nv = (n + Ops::W - 1) / Ops::W * Ops::W;  // weights past n are 0 (masked before the softmax)
    alignas(64) int16_t wq[NR][kMaxSpanWeights];
    float wmax[NR];
    for (uint32_t j = 0; j < NR; ++j) {
        const float *w = S + size_t(r0 + j) * SP;
        typename Ops::V mv = Ops::load(w);
        for (uint32_t i = Ops::W; i < nv; i += Ops::W) mv = Ops::max(mv, Ops::load(w + i));
        // w / wmax first, then 32767: no step underflows where wmax itself is
        // tiny (subnormals are flushed here); the flush multiplies back the same way.
        wmax[j] = Ops::hmax(mv);
        Ops::to_i16(w, nv, wmax[j] > 0.0f ? 1.0f / wmax[j] : 0.0f, wq[j]);
    }
    size_t d = 0;
    for (; d + 64 <= T.D; d += 64) values_int8_pass<Ops, NR, 2>(T, rows, n, r0, d, wq, wmax, pf);
    if (d < T.D) values_int8_pass<Ops, NR, 1>(T, rows, n, r0, d, wq, wmax, pf);
}

template <class Ops>
inline void values_int8(const ChunkTask &T, const uint8_t *rows, uint32_t n, const float *S, uint32_t SP,
                        SpanPrefetch &pf) {
    uint32_t r = 0;
    for (; r + kRowBlock <= T.R; r += kRowBlock) values_int8_block<Ops, kRowBlock>(T, rows, n, r, S, SP, pf);
    switch (T.R - r) {
        case 3: values_int8_block<Ops, 3>(T, rows, n, r, S, SP, pf); break;
        case 2: values_int8_block<Ops, 2>(T, rows, n, r, S, SP, pf); break;
        case 1: values_int8_block<Ops, 1>(T, rows, n, r, S, SP, pf); break;
        default: break;
    }
}

template <uint32_t F>
void attend_span(const ChunkTask &T, const SpanRef &s, SpanPrefetch &pf) {
    const SubpageLayout &L = T.layouts[F];
    const uint32_t D = T.D, R = T.R, n = s.end - s.begin, SP = logit_stride(T.P);
    const uint32_t nv = (n + O::W - 1) / O::W * O::W;  // n rounded up to whole vectors (<= SP)
    const bool one_block = R <= kRowBlock;              // rows fit one register block: dequantize on load
    float *S = T.logits;                                // S[r * SP + i]
    // ---- logits: every K row dequantized once for all rows ----
    const RowSource<F, true> ksrc(s.sub, L, D);
    const float *q = T.q;
    if (kRawRows<F, true>) {  // q' = q * k_scale: per channel (INT8, INT4) or the page's (FP8, times 2^8)
        for (uint32_t r = 0; r < R; ++r)
            for (uint32_t d = 0; d < D; d += O::W) {
                const typename O::V ks = F == IKV_FMT_FP8_E4M3 ? O::set1(ksrc.sc[0] * 256.0f)
                                       : F == IKV_FMT_INT4     ? O::f16(ksrc.sch + 2 * d)
                                                               : O::load(ksrc.sc + d);
                O::store(T.qfold + uint64_t(r) * D + d, O::mul(O::load(T.q + uint64_t(r) * D + d), ks));
            }
        q = T.qfold;
    }
    if (one_block) {
        all_logits(T, q, PageRows<F, true>{ksrc, s.begin}, n, S, SP, pf);
    } else {
        for (uint32_t i = 0; i < n; ++i) dequant_row(ksrc, s.begin + i, D, T.kspan + uint64_t(i) * D);
        all_logits(T, q, BufRows{T.kspan, D}, n, S, SP, pf);
    }
    if (F == IKV_FMT_INT4) {  // q.(c*s + min) = (q*s).c + q.min: add each row's bias q.min
        for (uint32_t r = 0; r < R; ++r) {
            typename O::V b = O::zero();
            for (uint32_t d = 0; d < D; d += O::W) b = O::fma(O::load(T.q + uint64_t(r) * D + d), O::f16(ksrc.mnh + 2 * d), b);
            const float bias = O::hsum(b);
            for (uint32_t i = 0; i < n; ++i) S[r * SP + i] += bias;
        }
    }
    const float cap = T.softcap;
    const bool all_past = s.pos0 + s.end - 1 <= T.q_pos0;  // no token of the span is in any query's future
    for (uint32_t r = 0; r < R; ++r) {
        float *Sr = S + r * SP;
        if (cap > 0.0f)
            for (uint32_t i = 0; i < n; ++i)  // x - x: an overflowed (infinite) logit stays NaN, as on CUDA (the header)
                Sr[i] = (Sr[i] - Sr[i]) + cap * tanhf(Sr[i] / cap);
        if (!all_past) {  // causal: query token t = r / group sees positions <= q_pos0 + t
            const uint32_t qpos = T.q_pos0 + r / T.group;
            for (uint32_t i = 0; i < n; ++i)
                if (s.pos0 + s.begin + i > qpos) Sr[i] = -INFINITY;
        }
        for (uint32_t i = n; i < nv; ++i) Sr[i] = -INFINITY;
    }
    // ---- one online-softmax update per row; S becomes the weights ----
    for (uint32_t r = 0; r < R; ++r) {
        float *Sr = S + r * SP;
        typename O::V mv = O::load(Sr);  // lanes [n, nv) hold -inf
        for (uint32_t i = O::W; i < nv; i += O::W) mv = O::max(mv, O::load(Sr + i));
        const float mloc = O::hmax(mv);
        if (mloc == -INFINITY) {  // every token of the span is in this row's future
            for (uint32_t i = 0; i < nv; ++i) Sr[i] = 0.0f;  // whole vectors: values_int8 reads them
            continue;
        }
        const float mold = T.m[r];
        const float mnew = mloc > mold ? mloc : mold;
        if (mnew > mold && mold != -INFINITY) {
            const float alpha = expf(mold - mnew);
            T.l[r] *= alpha;
            scale_row(T.acc + uint64_t(r) * D, alpha, D);
        }
        T.m[r] = mnew;
        const typename O::V neg_m = O::set1(-mnew);
        typename O::V sum = O::zero();
        for (uint32_t i = 0; i < nv; i += O::W) {
            const typename O::V p = vexp(O::add(O::load(Sr + i), neg_m));
            O::store(Sr + i, p);
            sum = O::add(sum, p);
        }
        T.l[r] += O::hsum(sum);
    }
    // ---- values: every V row dequantized once for all rows ----
    float vmeta[F == IKV_FMT_INT4 ? 2 * 128 * 8 : 1];  // INT4 V: [P*G] scales, [P*G] minimums (P <= 128, G <= 8)
    if (F == IKV_FMT_INT4) int4_v_meta(s, L, D, T.P, vmeta);
    const RowSource<F, false> vsrc(s.sub, L, D, F == IKV_FMT_INT4 ? vmeta : nullptr, T.P);
    if (F == IKV_FMT_INT8) {  // p' = p * v_scale per token: whole vectors, then the tokens left
        const uint32_t nw = n / O::W * O::W;
        for (uint32_t r = 0; r < R; ++r) {
            float *Sr = S + r * SP;
            for (uint32_t i = 0; i < nw; i += O::W) O::store(Sr + i, O::mul(O::load(Sr + i), O::load(vsrc.sc + s.begin + i)));
            for (uint32_t i = nw; i < n; ++i) Sr[i] *= vsrc.sc[s.begin + i];
        }
    } else if (F == IKV_FMT_FP8_E4M3) {  // p' = p * the page's v_scale * 2^8 (lanes past n: never read)
        const typename O::V c = O::set1(vsrc.sc[0] * 256.0f);
        for (uint32_t r = 0; r < R; ++r)
            for (uint32_t i = 0; i < nv; i += O::W) O::store(S + r * SP + i, O::mul(O::load(S + r * SP + i), c));
    }
    if constexpr (F == IKV_FMT_INT8 && O::kIntValues) {
        if (D % 32 == 0) {  // the codes straight from the page, for every row block
            values_int8<O>(T, s.sub + L.v + size_t(s.begin) * D, n, S, SP, pf);
            return;
        }
    }
    if (one_block) {
        all_values(T, PageRows<F, false>{vsrc, s.begin}, n, S, SP, pf);
    } else {
        for (uint32_t i = 0; i < n; ++i) dequant_row(vsrc, s.begin + i, D, T.vspan + uint64_t(i) * D);
        all_values(T, BufRows{T.vspan, D}, n, S, SP, pf);
    }
}

constexpr uint32_t kPrefetchSpans = 2;  // spans ahead (~ memory latency x bandwidth / span bytes)

// One span of one task, in its format, prefetching pf's span meanwhile.
inline void attend_one(const ChunkTask &T, const SpanRef &s, SpanPrefetch &pf) {
    switch (s.fmt) {
        case IKV_FMT_F16: attend_span<IKV_FMT_F16>(T, s, pf); break;
        case IKV_FMT_BF16: attend_span<IKV_FMT_BF16>(T, s, pf); break;
        case IKV_FMT_FP8_E4M3: attend_span<IKV_FMT_FP8_E4M3>(T, s, pf); break;
        case IKV_FMT_INT8: attend_span<IKV_FMT_INT8>(T, s, pf); break;
        case IKV_FMT_INT4: attend_span<IKV_FMT_INT4>(T, s, pf); break;
        default: break;  // the decoder never builds spans of other formats
    }
    pf.drain();
}

inline void start_chunk(const ChunkTask &T) {
    for (uint32_t r = 0; r < T.R; ++r) {
        T.m[r] = -INFINITY;
        T.l[r] = 0.0f;
    }
    for (uint64_t i = 0; i < uint64_t(T.R) * T.D; ++i) T.acc[i] = 0.0f;
}

// The first kPrefetchSpans spans of a task, prefetched before any is computed.
inline void prefetch_first_spans(const ChunkTask &T) {
    SpanPrefetch pf;
    for (uint32_t k = 0; k < kPrefetchSpans && k < T.n_spans; ++k) {
        pf.set(T, T.spans[k]);
        pf.drain();
    }
}

// Span k of task T, prefetching span k + kPrefetchSpans.
inline void attend_and_prefetch(const ChunkTask &T, uint32_t k) {
    SpanPrefetch pf;
    if (k + kPrefetchSpans < T.n_spans) pf.set(T, T.spans[k + kPrefetchSpans]);
    attend_one(T, T.spans[k], pf);
}

void attend_chunk(const ChunkTask &T) {
    // Subnormal operands and results flushed to zero while the kernel runs
    // (restored on return): weights below ~1e-38 of the largest change no
    // output measurably, and on x86 every FMA touching a subnormal takes a
    // microcode assist (~100 cycles), which peaked softmax rows hit often.
    [[maybe_unused]] const typename O::FlushDenormals ftz{};
    start_chunk(T);
    prefetch_first_spans(T);
    for (uint32_t k = 0; k < T.n_spans; ++k) attend_and_prefetch(T, k);
}

// n tasks over the same pages (the kv-heads of one sequence and chunk, whose
// sub-pages of a page lie side by side), span k of every task before span
// k + 1 of any: a page's kv-heads are read as one contiguous run instead of
// one head's rows every page apart. Each task's result equals attend_chunk's.
void attend_chunks(const ChunkTask *tasks, uint32_t n) {
    [[maybe_unused]] const typename O::FlushDenormals ftz{};
    for (uint32_t t = 0; t < n; ++t) start_chunk(tasks[t]);
    const uint32_t n_spans = n ? tasks[0].n_spans : 0;
    for (uint32_t t = 0; t < n; ++t) prefetch_first_spans(tasks[t]);
    for (uint32_t k = 0; k < n_spans; ++k)
        for (uint32_t t = 0; t < n; ++t) attend_and_prefetch(tasks[t], k);
}
