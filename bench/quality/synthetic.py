"""Structured synthetic long contexts for the selection-quality harness.

Real models stop at 512 positions here (bench/quality/minilm.py), so contexts of
32K-128K tokens are built from the parts an agentic context has, each with a
known share of the attention (seeded, numpy only):

  sinks        the first 4 tokens: keys along a direction every query shares
               (attention sinks, as in StreamingLLM)
  documents    1024-token blocks; each has a topic direction and a relevance
               grade (how closely its topic follows the turn's topics)
  targets      per query head, the document the head is reading this turn:
               the 4 query heads of a kv-group read different documents
  needles      one 16-token page per query head, in a document that is not
               its target, whose keys match that head's query strongly
  recent       the newest 256 tokens, mildly aligned with every query

Logits are q.k / sqrt(D). Calibration (D = 64): a target document's tokens sit
about 6 above the background (background logits have std ~1), graded
documents 0-1.5, sinks 8, needles 6, the recent window 1.5, so a head's target
holds most of its mass, sinks and the recent window a tenth or so, needles a
few percent (small, but a selection that misses them loses the fact they hold).
"""
from dataclasses import dataclass, field

import numpy as np

DOC_TOKENS = 1024
SINK_TOKENS = 4
RECENT_TOKENS = 256
PAGE = 16


@dataclass
class Case:
    """One evaluation context: K/V of every layer, the query rows that read it,
    and what an engine would know of it (its layout)."""
    name: str
    k: np.ndarray            # [layers, T, kv_heads, D] float32
    v: np.ndarray            # [layers, T, kv_heads, D] float32
    q: np.ndarray            # [layers, n_queries, q_heads, D] float32; each attends every key
    blocks: list = None      # layout blocks (dicts: name, kind, policy, start, end, score) or None
    needles: dict = field(default_factory=dict)  # (layer, query, q_head) -> needle page index
    note: str = ""


def _unit(rng, n, d):
    u = rng.standard_normal((n, d))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def synthetic_case(seq_len, seed, n_kv_heads=4, group=4, head_dim=64, n_queries=8):
    """A seeded agentic context of seq_len tokens (a multiple of DOC_TOKENS plus
    nothing else: sinks and the recent window lie inside the first and last
    documents) with one layer."""
    assert seq_len % DOC_TOKENS == 0 and seq_len >= 8 * DOC_TOKENS
    rng = np.random.default_rng(seed)
    T, D, H, G = seq_len, head_dim, n_kv_heads, group
    n_docs = T // DOC_TOKENS
    sd = np.sqrt(D)
    # Key noise is small beside the structure: every query component multiplies it.
    k = (0.3 * rng.standard_normal((T, H, D))).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    q = np.empty((n_queries, H * G, D), np.float32)
    sink_dir = _unit(rng, H, D)
    recent_dir = _unit(rng, H, D)
    needles = {}
    # Documents 1 .. n_docs-2 can be targets or hold needles (0 holds the sinks,
    # the last one the recent window).
    middle = np.arange(1, n_docs - 1)
    relevance = np.zeros(n_docs)
    for h in range(H):
        topics = _unit(rng, n_docs, D)
        targets = rng.choice(middle, size=G, replace=False)
        turn = topics[targets].mean(axis=0)
        turn /= np.linalg.norm(turn)
        # Graded documents: topics pulled toward the turn by a seeded amount.
        grade = rng.uniform(0.0, 0.5, n_docs)
        grade[targets] = 0.0
        for d in range(n_docs):
            direction = topics[d] + grade[d] * turn
            direction /= np.linalg.norm(direction)
            k[d * DOC_TOKENS:(d + 1) * DOC_TOKENS, h] += (2.0 * direction).astype(np.float32)
        relevance = np.maximum(relevance, grade / 0.5 * 0.6)
        relevance[targets] = 1.0
        k[:SINK_TOKENS, h] += (4.0 * sink_dir[h]).astype(np.float32)
        k[T - RECENT_TOKENS:, h] += (1.5 * recent_dir[h]).astype(np.float32)
        for g in range(G):
            hq = h * G + g
            # A needle page in a document that is not this head's target.
            doc = rng.choice(np.setdiff1d(middle, targets))
            page = doc * DOC_TOKENS // PAGE + rng.integers(0, DOC_TOKENS // PAGE)
            needle_dir = _unit(rng, 1, D)[0]
            k[page * PAGE:(page + 1) * PAGE, h] += (3.0 * needle_dir).astype(np.float32)
            for n in range(n_queries):
                needles[(0, n, hq)] = int(page)
            base = 3.0 * topics[targets[g]] * sd + 2.0 * sink_dir[h] * sd + 1.0 * recent_dir[h] * sd \
                + 2.0 * needle_dir * sd
            for n in range(n_queries):
                q[n, hq] = (base + rng.standard_normal(D)).astype(np.float32)
    blocks = [dict(name="system", kind="SYSTEM_PROMPT", policy="ALWAYS", start=0, end=PAGE, score=1.0)]
    for d in range(n_docs):
        start, end = max(d * DOC_TOKENS, PAGE), min((d + 1) * DOC_TOKENS, T - RECENT_TOKENS)
        # What a retriever would say: the relevance grade, seen through noise.
        score = float(np.clip(relevance[d] + rng.normal(0, 0.1), 0.0, 1.0))
        blocks.append(dict(name="doc-%d" % d, kind="RETRIEVED_DOC", policy="ATTEND", start=start, end=end,
                           score=score))
    blocks.append(dict(name="turn", kind="CONVERSATION", policy="RECENT", start=T - RECENT_TOKENS, end=T, score=1.0))
    return Case(name="synth-%dk" % (T // 1024), k=k[None], v=v[None], q=q[None], blocks=blocks, needles=needles,
                note="%d kv-heads x %d query heads each, head_dim %d, %d documents" % (H, G, D, n_docs))
