"""How far adaptive budgets could go at all: the oracle's answer to issue 17's
adaptive target (the recall of fixed top-k with <= 80% of its bytes).

For every (layer, kv-head, query) row the float64 attention gives each page's
true mass, summed over the kv-group's query heads (the oracle of harness.py).
Fixed top-k at k pages a row reads each row's k heaviest pages; its recall is
the mean over rows of the mass they hold. An adaptive budget may give rows
different page counts; for a given total the best it can do (for mean recall)
is to take the heaviest pages over all rows at once, since each row's masses,
sorted, are concave. This prints, per budget, the share of fixed top-k's
pages that this ideal allocation needs for the same mean recall. Page bytes
only (the scoring summaries cost the same either way), no estimation error:
a selection that only knows bounds does no better. If the share is above 0.8
here, no adaptive budget over these pages reaches the target on this data.

  python3 bench/quality/adaptive_ceiling.py [--data real-single,synth-32k,...]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import run_quality  # noqa: E402


def page_masses(case):
    """[rows, pages] group-summed page masses over the group's heads (each row sums to 1)."""
    L, T, H, D = case.k.shape
    nq = case.q.shape[2]
    G = nq // H
    P = harness.PAGE
    n_pages = (T + P - 1) // P
    edges = np.minimum(np.arange(n_pages + 1) * P, T)
    rows = []
    for layer in range(L):
        for h in range(H):
            k = case.k[layer, :, h, :].astype(np.float64)
            q = case.q[layer, :, h * G:(h + 1) * G, :].astype(np.float64)  # [N, G, D]
            logits = (q @ k.T) / np.sqrt(D)
            logits -= logits.max(axis=-1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=-1, keepdims=True)
            cum = np.concatenate([np.zeros(p.shape[:-1] + (1,)), np.cumsum(p, axis=-1)], axis=-1).sum(axis=1) / G
            rows.append(cum[:, edges[1:]] - cum[:, edges[:-1]])
    return np.concatenate(rows, axis=0)


def ceiling(masses, shares):
    n_rows, n_pages = masses.shape
    srt = -np.sort(-masses, axis=1)          # each row's pages, heaviest first
    flat = -np.sort(-srt.ravel())            # every row's pages, heaviest first
    cum_flat = np.cumsum(flat) / n_rows      # mean recall after taking the first j pages overall
    out = []
    for share in shares:
        k = max(1, int(round(share * n_pages)))
        fixed = srt[:, :k].sum(axis=1).mean()
        need = int(np.searchsorted(cum_flat, fixed - 1e-12)) + 1
        out.append((share, k, fixed, need / (k * n_rows)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="real-single,real-multidoc-32k,synth-32k,synth-128k")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args(argv)
    print("%-20s %7s %7s %12s %22s" % ("data", "budget", "pages", "fixed_recall", "ideal_adaptive_pages"))
    for name in args.data.split(","):
        masses = np.concatenate([page_masses(c) for c in run_quality.build_cases(name, args.small)], axis=0)
        for share, k, fixed, ratio in ceiling(masses, harness.BUDGETS):
            print("%-20s %7.4f %7d %12.4f %21.3fx" % (name, share, k, fixed, ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
