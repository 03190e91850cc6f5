"""Adaptive budgets against fixed top-k at equal bytes (issue 17's target:
the recall of fixed top-k with <= 80% of its bytes, or more recall at equal
bytes, on real and synthetic data).

For each data set the adaptive selections (IKV_TOPK_MASS on hybrid scores,
capped by each budget of harness.BUDGETS) are run, then fixed hybrid top-k on
a fine grid of budgets; fixed top-k's recall at the adaptive run's bytes is
read off the grid by linear interpolation between the two measured points
that bracket those bytes (2.5% of the tokens apart), and its bytes at the
adaptive run's recall the same way. Recall is concave in the budget, so the
interpolated recall lies below the curve and favours the adaptive run by up
to the curve's bend: fixed top-k is therefore also run at exactly the budget
whose bytes are the adaptive run's (bytes are linear in the budget, so that
budget is interpolated exactly), and the two recalls are compared directly
(`exact:` lines). Bytes are `ikv_decoder_last_bytes_read` over dense
(summaries included).

  python3 bench/quality/equal_bytes.py [--data real-single,synth-32k,...]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import run_quality  # noqa: E402

GRID = tuple(round(0.025 * i, 4) for i in range(1, 25))  # 2.5% .. 60% of the tokens
ADAPTIVE = ("adaptive-0.9", "adaptive-0.95")
EXACT_BYTES_TOL = 0.002  # of the dense bytes: an `exact:` comparison only where fixed top-k reads that close


def curve(summary, method):
    """(bytes, recall) points of a method, by bytes."""
    pts = sorted((s["bytes"], s["recall_mean"]) for (m, _), s in summary.items() if m == method)
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


def interp(x, xs, ys):
    """ys at x by linear interpolation between the bracketing points; None outside them."""
    if x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, ys))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="real-single,real-multidoc-32k,synth-32k,synth-128k")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    harness._load_lib()
    for name in args.data.split(","):
        summary = {}
        cases = list(run_quality.build_cases(name, False))
        for case in cases:
            res = harness.evaluate(case, ADAPTIVE, harness.BUDGETS, n_threads=args.threads, log=lambda *a: None)
            harness.merge(summary, res)
            res = harness.evaluate(case, ("hybrid",), GRID, n_threads=args.threads, log=lambda *a: None)
            harness.merge(summary, res)
        summary = harness.summarize(summary)
        hb, hr = curve(summary, "hybrid")
        # Fixed top-k at exactly each adaptive run's bytes: the grid budget with those bytes.
        grid_b = np.array(sorted(GRID, key=lambda g: summary[("hybrid", g)]["bytes"]))
        targets = {}
        for method in ADAPTIVE:
            for share in harness.BUDGETS:
                s = summary.get((method, share))
                if s is not None and hb[0] <= s["bytes"] <= hb[-1]:
                    targets[(method, share)] = round(float(np.interp(s["bytes"], hb, grid_b)), 6)
        exact = {}
        if targets:
            for case in cases:
                res = harness.evaluate(case, ("hybrid",), tuple(sorted(set(targets.values()))), n_threads=args.threads,
                                       log=lambda *a: None)
                harness.merge(exact, res)
            exact = harness.summarize(exact)
        print("\n== %s: adaptive (hybrid scores, IKV_TOPK_MASS) vs fixed hybrid top-k at equal bytes ==" % name)
        print("%-14s %6s %7s %8s %16s %15s %10s" % ("method", "cap", "bytes", "recall", "fixed@same_bytes",
                                                     "fixed_bytes@rec", "bytes_ratio"))
        for method in ADAPTIVE:
            for share in harness.BUDGETS:
                s = summary.get((method, share))
                if s is None:
                    continue
                same = interp(s["bytes"], hb, hr)
                # fixed top-k's bytes for the adaptive recall (recall rises with bytes on the grid)
                order = np.argsort(hr)
                need = interp(s["recall_mean"], hr[order], hb[order])
                print("%-14s %6.4f %7.4f %8.4f %16s %15s %10s" % (
                    method, share, s["bytes"], s["recall_mean"], "-" if same is None else "%.4f" % same,
                    "-" if need is None else "%.4f" % need, "-" if need is None else "%.3f" % (s["bytes"] / need)))
                print("equal-bytes: data=%s method=%s budget=%g recall_mean=%.4f bytes=%.4f fixed_recall_same_bytes=%s "
                      "fixed_bytes_same_recall=%s" % (name, method, share, s["recall_mean"], s["bytes"],
                                                     "-" if same is None else "%.4f" % same,
                                                     "-" if need is None else "%.4f" % need))
                if (method, share) in targets:
                    f = exact[("hybrid", targets[(method, share)])]
                    if abs(f["bytes"] - s["bytes"]) > EXACT_BYTES_TOL:  # budgets are whole pages: short contexts
                        print("exact: data=%s method=%s budget=%g bytes=%.4f: no fixed budget reads those bytes "
                              "(nearest %.4f)" % (name, method, share, s["bytes"], f["bytes"]))
                        continue
                    print("exact: data=%s method=%s budget=%g recall_mean=%.4f bytes=%.4f fixed_budget=%.4f "
                          "fixed_recall=%.4f fixed_bytes=%.4f recall_gain=%+.4f" % (
                              name, method, share, s["recall_mean"], s["bytes"], targets[(method, share)],
                              f["recall_mean"], f["bytes"], s["recall_mean"] - f["recall_mean"]))


if __name__ == "__main__":
    main()
