"""Real-attention data sets for the selection-quality harness: the trained
all-MiniLM-L6-v2 (bench/quality/minilm.py) run on the English texts every
Debian system carries (/usr/share/common-licenses).

Know what this is: a bidirectional encoder with absolute positions (512 at
most), so its attention is real attention on real text but not an LLM's
long-context decode attention. Single passages are the model's native shape;
multi-document contexts concatenate passages encoded independently (each at
positions 0..511, as a cache fed by a retriever holds them), and the queries
of the last passage (the question) read the whole concatenation.
"""
import numpy as np

import minilm
from synthetic import Case

_MODEL = None
_PASSAGES = None


def _model_and_passages(n):
    global _MODEL, _PASSAGES
    if _MODEL is None:
        _MODEL = minilm.load_model()
    if _PASSAGES is None or len(_PASSAGES) < n:
        _PASSAGES = minilm.debian_passages(_MODEL, limit=max(n, 72))
    if len(_PASSAGES) < n:
        raise SystemExit("real_sets: only %d passages of text found, %d needed" % (len(_PASSAGES), n))
    return _MODEL, _PASSAGES


def _to_case_layout(qkv_by_layer, q_rows, name, blocks, note):
    """minilm's per-layer [heads, T, D] arrays -> a Case ([layers, T, heads, D])."""
    layers = sorted(qkv_by_layer)
    k = np.stack([qkv_by_layer[l][1].transpose(1, 0, 2) for l in layers]).astype(np.float32)
    v = np.stack([qkv_by_layer[l][2].transpose(1, 0, 2) for l in layers]).astype(np.float32)
    q = np.stack([qkv_by_layer[l][0][:, q_rows, :].transpose(1, 0, 2) for l in layers]).astype(np.float32)
    return Case(name=name, k=np.ascontiguousarray(k), v=np.ascontiguousarray(v), q=np.ascontiguousarray(q),
                blocks=blocks, note=note)


def single_passages(n_passages=8, n_queries=16, layers=None, seed=5):
    """real-single: one case per 512-token passage; n_queries seeded query
    positions each, every one attending the whole passage."""
    model, passages = _model_and_passages(n_passages)
    rng = np.random.default_rng(seed)
    layers = list(range(minilm.N_LAYERS)) if layers is None else list(layers)
    cases = []
    for i in range(n_passages):
        qkv = minilm.capture_single(model, passages[i])
        rows = np.sort(rng.choice(len(passages[i]), size=n_queries, replace=False))
        cases.append(_to_case_layout({l: qkv[l] for l in layers}, rows, "real-single", None,
                                     "MiniLM-L6, %d passages of 512 tokens, %d layers x 12 heads, head_dim 32, "
                                     "%d queries each" % (n_passages, len(layers), n_queries)))
    return cases


def _embedding(model, ids):
    hidden, _ = minilm.forward(model, ids)
    e = hidden.mean(axis=0)
    return e / np.linalg.norm(e)


def multidoc(n_docs=16, n_queries=16, layers=None, seed=9):
    """real-multidoc-<n_docs/2>k: n_docs passages (a seeded draw from the
    first 72) concatenated; the last is the question, whose queries read all.
    Its layout: each earlier passage a RETRIEVED_DOC scored by the model's own
    sentence-embedding cosine to the question (what a retriever would give the
    engine), the question an ATTEND block scored 1."""
    model, passages = _model_and_passages(n_docs)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(passages), size=n_docs, replace=False)
    docs = [passages[i] for i in pick]
    layers = list(range(minilm.N_LAYERS)) if layers is None else list(layers)
    by_layer, bounds = minilm.capture_multidoc(model, docs, n_docs, layers=layers)
    question = _embedding(model, docs[-1])
    blocks = []
    for d, (s, e) in enumerate(bounds[:-1]):
        score = float(np.clip(_embedding(model, docs[d]) @ question, 0.0, 1.0))
        blocks.append(dict(name="doc-%d" % d, kind="RETRIEVED_DOC", policy="ATTEND", start=s, end=e, score=score))
    s, e = bounds[-1]
    blocks.append(dict(name="question", kind="CONVERSATION", policy="ATTEND", start=s, end=e, score=1.0))
    rows = np.sort(rng.choice(e - s, size=n_queries, replace=False))
    T = bounds[-1][1]
    return [_to_case_layout(by_layer, rows, "real-multidoc-%dk" % (T // 1024), blocks,
                            "MiniLM-L6, %d passages encoded apart, %d tokens, %d layers x 12 heads, %d queries of the "
                            "last" % (n_docs, T, len(layers), n_queries))]
