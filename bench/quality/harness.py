"""Selection-quality harness: how much of the attention the pages a step reads
hold, at each budget, for each way of choosing them.

For every (layer, kv-head, query head, query) of a case it reports
  recall   the float64 dense softmax mass on the tokens the selection read
  err      relative L2 error of intentkv's decode through the selection
           (ikv_decode on a pool holding the case's K/V) against the float64
           dense attention
  bytes    ikv_decoder_last_bytes_read over that of a dense decode
as the mean and the 5th percentile over those rows (err: mean and 95th).

The pool holds each (layer, kv-head) as its own layer of one kv-head, so a
plan (one per decode call) can differ per kv-head, as the oracle's does; a
step's queries are decoded as a batch of forks of one sequence (forks share
every page). All references are computed from the values the pool stored
(ikv_seq_read), so what is measured is the selection, not the F16 storage.

Methods (a budget is a share of the context's tokens, in whole pages):
  dense      every token (the check that the harness is right: recall 1)
  oracle     pages by true mass summed over the kv-group's query heads (the
             ceiling of any selection shared by a group)
  random     seeded random pages (the floor)
  sinks+recent  the first page plus the newest pages (StreamingLLM)
  plan       the router's intent plan alone (layout scores, whole blocks)
  quest      query-aware top-k by Quest bound, no plan (IKV_TOPK_FIXED)
  hybrid     the same ranked by IKV_TOPK_SCORE_HYBRID (per-head shifted mean
             of the bound and the mean key's logit)
  keys       IKV_TOPK_SCORE_KEYS: hybrid's best pages for twice the budget, ranked
             again by their keys' attention share (reads those pages' keys)
  plan+quest / plan+hybrid / plan+keys   the plan routed at twice the budget, top-k within it
  adaptive-0.9 / adaptive-0.95   IKV_TOPK_MASS (90% / 95% estimated mass) on
             hybrid scores, capped at the budget and floored at a quarter of it
"""
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import intentkv as ikv  # noqa: E402

PAGE = 16
BUDGETS = (0.0625, 0.125, 0.25, 0.5)
SCORES = {"quest": ikv.TopkScore.QUEST, "hybrid": ikv.TopkScore.HYBRID, "keys": ikv.TopkScore.KEYS}


@dataclass
class Rows:
    """Per-row results of one (method, budget) over a case."""
    recall: list
    err: list
    bytes_share: list
    needle_hits: list


def _load_lib():
    lib = os.environ.get("INTENTKV_LIB")
    if lib:
        ikv.load(lib)


def page_ranges(pages, seq_len):
    """Sorted page indices -> merged (begin, end) token ranges."""
    out = []
    for p in sorted(pages):
        b, e = p * PAGE, min((p + 1) * PAGE, seq_len)
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0], e)
        else:
            out.append((b, e))
    return out


def mass_of_runs(cum, runs):
    """cum: [..., T+1] cumulative probabilities; runs: (begin, end) -> mass per leading index."""
    m = np.zeros(cum.shape[:-1])
    for b, e in runs:
        m += cum[..., e] - cum[..., b]
    return m


def make_layout(blocks):
    layout = ikv.Layout()
    for b in blocks:
        layout.add(b["name"], b["start"], b["end"], kind=ikv.Kind[b["kind"]], policy=ikv.Policy[b["policy"]],
                   score=b["score"])
    return layout


class CaseRunner:
    """Holds one case in a pool and evaluates selections on it."""

    def __init__(self, case, decoder):
        self.case, self.dec = case, decoder
        L, T, H, D = case.k.shape
        self.L, self.T, self.H, self.D = L, T, H, D
        self.nq = case.q.shape[2]
        self.group = self.nq // H
        self.N = case.q.shape[1]
        self.scale = 1.0 / math.sqrt(D)
        per_layer = T * D * 2 * 2 + (T // PAGE + 1) * 64 * D
        self.pool = ikv.Pool(n_layers=L * H, n_kv_heads=1, head_dim=D, page_size=PAGE,
                             capacity_bytes=int(per_layer * L * H * 1.3) + (64 << 20))
        self.seq = self.pool.seq_create()
        for layer in range(L):
            for h in range(H):
                self.pool.append(self.seq, np.ascontiguousarray(case.k[layer, :, h, :]),
                                 np.ascontiguousarray(case.v[layer, :, h, :]), layer=layer * H + h)
        self.forks = [self.pool.fork(self.seq) for _ in range(self.N)]
        self.layout = make_layout(case.blocks) if case.blocks else None

    def close(self):
        if self.layout:
            self.layout.close()
        self.pool.close()

    # ---- one (layer, kv-head): the float64 references ----
    def head_reference(self, layer, h):
        k, v = self.pool.read(self.seq, layer * self.H + h, 0, self.T)
        k = np.frombuffer(k, np.float32).reshape(self.T, self.D).astype(np.float64)
        v = np.frombuffer(v, np.float32).reshape(self.T, self.D).astype(np.float64)
        q = self.case.q[layer, :, h * self.group:(h + 1) * self.group, :].astype(np.float32)  # [N, G, D]
        logits = (q.astype(np.float64) @ k.T) * self.scale  # [N, G, T]
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        cum = np.concatenate([np.zeros(p.shape[:-1] + (1,)), np.cumsum(p, axis=-1)], axis=-1)
        return dict(q=np.ascontiguousarray(q), k=k, v=v, p=p, cum=cum, out=p @ v)

    def decode(self, layer, h, ref, plans=None, **topk):
        out = self.dec.decode(self.pool, self.forks, ref["q"], self.group, layer=layer * self.H + h, plans=plans,
                              **topk)
        out = np.frombuffer(out, np.float32).reshape(self.N, self.group, self.D)
        runs = [self.dec.last_selection(i, 0) for i in range(self.N)]
        return out, runs, self.dec.last_bytes_read()

    def restricted_reference(self, ref, runs):
        """float64 attention over exactly the tokens of runs[n], per query n."""
        out = np.zeros_like(ref["out"])
        for n, rr in enumerate(runs):
            idx = np.concatenate([np.arange(b, e) for b, e in rr]) if rr else np.zeros(0, int)
            if idx.size == 0:
                continue
            w = ref["p"][n][:, idx]
            out[n] = (w / w.sum(axis=-1, keepdims=True)) @ ref["v"][idx]
        return out


def budget_tokens(share, T):
    return max(PAGE, int(share * T) // PAGE * PAGE)


def external_pages(method, ref, budget, T, rng):
    """Per query n: the pages of a selection made outside the library."""
    n_pages = (T + PAGE - 1) // PAGE
    k = budget // PAGE
    if method == "oracle":
        cum = ref["cum"].sum(axis=1)  # group-summed: [N, T+1]
        edges = np.minimum(np.arange(n_pages + 1) * PAGE, T)
        page_mass = cum[:, edges[1:]] - cum[:, edges[:-1]]
        return [np.argsort(-pm, kind="stable")[:k] for pm in page_mass]
    if method == "random":
        return [rng.choice(n_pages, size=min(k, n_pages), replace=False) for _ in range(ref["p"].shape[0])]
    if method == "sinks+recent":
        pages = [0] + list(range(max(1, n_pages - (k - 1)), n_pages))
        return [np.array(pages[:k])] * ref["p"].shape[0]
    raise ValueError(method)


def evaluate(case, methods, budgets=BUDGETS, checks=None, seed=1234, n_threads=0, log=print):
    """Run every method at every budget on a case; returns {(method, budget): Rows}.
    checks (a list) collects ((data, method, budget), message) for each property
    violation (check_properties) instead of raising."""
    dec = ikv.Decoder(n_threads=n_threads)
    run = CaseRunner(case, dec)
    rng = np.random.default_rng(seed)
    results = {}
    router_cache = {}

    def plan_for(tokens):
        if tokens not in router_cache:
            with ikv.Router(page_size=PAGE, token_budget=min(tokens, run.T), recent_window=0, attend_threshold=0.0,
                            over_budget=ikv.OverBudget.KEEP) as router:
                router_cache[tokens] = router.route(run.layout, run.T)
        return router_cache[tokens]

    try:
        for layer in range(run.L):
            for h in range(run.H):
                ref = run.head_reference(layer, h)
                _, _, dense_bytes = run.decode(layer, h, ref)
                for budget_share in ((1.0,) if "dense" in methods else ()) + tuple(budgets):
                    B = budget_tokens(budget_share, run.T)
                    for method in methods:
                        if (method == "dense") != (budget_share == 1.0):
                            continue
                        if method.startswith("plan") and run.layout is None:
                            continue
                        if method in ("oracle", "random", "sinks+recent"):
                            pages = external_pages(method, ref, B, run.T, rng)
                            plans = [ikv.Plan.from_ranges(page_ranges(pg, run.T), run.T, PAGE) for pg in pages]
                            out, runs, nbytes = run.decode(layer, h, ref, plans=plans)
                            for p in plans:
                                p.close()
                        elif method == "dense":
                            out, runs, nbytes = run.decode(layer, h, ref)
                        elif method == "plan":
                            out, runs, nbytes = run.decode(layer, h, ref, plans=[plan_for(B)] * run.N)
                        elif method in ("quest", "hybrid", "keys"):
                            out, runs, nbytes = run.decode(layer, h, ref, topk_token_budget=B,
                                                           topk_score=SCORES[method])
                        elif method in ("plan+quest", "plan+hybrid", "plan+keys"):
                            out, runs, nbytes = run.decode(layer, h, ref, plans=[plan_for(2 * B)] * run.N,
                                                           topk_token_budget=B, topk_score=SCORES[method[5:]])
                        elif method.startswith("adaptive-"):
                            out, runs, nbytes = run.decode(layer, h, ref, topk_mass=float(method[9:]),
                                                           topk_min_tokens=B // 4, topk_token_budget=B,
                                                           topk_score=ikv.TopkScore.HYBRID)
                        else:
                            raise ValueError("unknown method " + method)
                        recall = np.stack([mass_of_runs(ref["cum"][n], runs[n]) for n in range(run.N)])  # [N, G]
                        num = np.linalg.norm(out - ref["out"], axis=-1)
                        err = num / np.maximum(np.linalg.norm(ref["out"], axis=-1), 1e-300)
                        hits = []
                        for n in range(run.N):
                            for g in range(run.group):
                                page = case.needles.get((layer, n, h * run.group + g))
                                if page is not None:
                                    hits.append(any(b < (page + 1) * PAGE and e > page * PAGE for b, e in runs[n]))
                        key = (method, budget_share)
                        rows = results.setdefault(key, Rows([], [], [], []))
                        rows.recall.extend(recall.ravel().tolist())
                        rows.err.extend(err.ravel().tolist())
                        rows.bytes_share.append(nbytes / dense_bytes)
                        rows.needle_hits.extend(hits)
                        if checks is not None:
                            check_properties(checks, case.name, method, budget_share, layer, h, run, ref, out, runs,
                                             recall, err, B)
    finally:
        for plan in router_cache.values():
            plan.close()
        run.close()
        dec.close()
    return results


# The largest relative L2 of intentkv's decode against the float64 attention
# over its own selection, per data set, of every checked row (the check's
# bound is 1e-5; run_quality --check prints these).
LARGEST_DEVIATION = {}


def check_properties(checks, name, method, share, layer, h, run, ref, out, runs, recall, err, B):
    """The properties that must hold whatever the data (CI runs these):
    dense reads everything at float precision; intentkv's decode equals the
    float64 attention over the tokens it reports reading; no selection holds
    more group mass than the oracle's at a token count it does not exceed."""
    where = "%s %s@%g layer %d kv-head %d" % (name, method, share, layer, h)
    key = (name, method, share)
    restricted = run.restricted_reference(ref, runs)
    dev = np.linalg.norm(out - restricted, axis=-1) / np.maximum(np.linalg.norm(restricted, axis=-1), 1e-300)
    LARGEST_DEVIATION[name] = max(LARGEST_DEVIATION.get(name, 0.0), float(dev.max()))
    if not np.all(dev <= 1e-5):
        checks.append((key, "%s: decode vs float64 over its own selection: %.3g > 1e-5" % (where, dev.max())))
    if method == "dense":
        if not np.all(np.abs(recall - 1.0) <= 1e-9):
            checks.append((key, "%s: dense recall %.12f != 1" % (where, recall.min())))
        if not np.all(err <= 1e-5):
            checks.append((key, "%s: dense error %.3g > 1e-5" % (where, err.max())))
        return
    oracle = external_pages("oracle", ref, B, run.T, None)
    for n in range(run.N):
        tokens = sum(e - b for b, e in runs[n])
        if tokens > B:
            continue  # plans may keep mandatory blocks beyond the budget (over_budget KEEP)
        if any(b % PAGE or (e % PAGE and e != run.T) for b, e in runs[n]):
            continue  # token-level cuts (plan blocks inside pages): the page-level oracle is no ceiling there
        best = mass_of_runs(ref["cum"][n], page_ranges(oracle[n], run.T)).sum()
        got = recall[n].sum()
        if got > best + 1e-9:
            checks.append((key, "%s query %d: group mass %.9f exceeds the oracle's %.9f at %d tokens" %
                           (where, n, got, best, B)))


def merge(into, results):
    """Adds the rows of results (one context) to into (a data set's contexts)."""
    for key, r in results.items():
        rows = into.setdefault(key, Rows([], [], [], []))
        rows.recall.extend(r.recall)
        rows.err.extend(r.err)
        rows.bytes_share.extend(r.bytes_share)
        rows.needle_hits.extend(r.needle_hits)


def summarize(results):
    """(method, budget) -> dict of the reported statistics."""
    out = {}
    for key, r in results.items():
        rec, err = np.array(r.recall), np.array(r.err)
        out[key] = dict(recall_mean=rec.mean(), recall_p5=np.percentile(rec, 5), err_mean=err.mean(),
                        err_p95=np.percentile(err, 95), bytes=float(np.mean(r.bytes_share)),
                        needles=(float(np.mean(r.needle_hits)) if r.needle_hits else None), rows=rec.size)
    return out
