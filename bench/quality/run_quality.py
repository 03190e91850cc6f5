"""Run the selection-quality harness (bench/quality/harness.py) on data sets and
report; scripts/quality.sh calls it with the shipped data.

  python3 bench/quality/run_quality.py                      every set, full size
  python3 bench/quality/run_quality.py --data synth-32k     one set
  python3 bench/quality/run_quality.py --tensors my.safetensors [--layout my.json]
  python3 bench/quality/run_quality.py --small --check      CI: small sets, properties only

Ends with one line per (data, method, budget):
  quality: data=<set> method=<name> budget=<share> recall_mean=<x> recall_p5=<x> err_mean=<x> bytes=<share>
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import synthetic  # noqa: E402
import user_tensors  # noqa: E402

METHODS = ("dense", "oracle", "random", "sinks+recent", "plan", "quest", "hybrid", "keys", "plan+quest",
           "plan+hybrid", "plan+keys", "adaptive-0.9", "adaptive-0.95")
REAL_SETS = ("real-single", "real-multidoc-8k", "real-multidoc-32k")
SYNTH_SETS = ("synth-32k", "synth-128k")
SESSION_SETS = ("synth-revisit-32k", "synth-revisit-weak-32k", "session-feedback")  # sessions of steps (sessions.py)


def build_cases(name, small):
    """The named data set as a list of contexts (small: reduced sizes for CI)."""
    if name.startswith("synth-"):
        tokens = int(name[6:-1]) * 1024
        return [synthetic.synthetic_case(8192 if small else tokens, seed=tokens, n_queries=2 if small else 8)]
    import real_sets  # needs the MiniLM model package: imported only when asked for
    if name == "real-single":
        return real_sets.single_passages(n_passages=1 if small else 8, n_queries=4 if small else 16,
                                         layers=(0, 5) if small else None)
    if name.startswith("real-multidoc-"):
        n_docs = int(name[len("real-multidoc-"):-1]) * 2  # 512-token passages
        return real_sets.multidoc(n_docs=4 if small else n_docs, n_queries=4 if small else 16,
                                  layers=(0, 5) if small else None)
    raise SystemExit("unknown data set %r; known: %s" % (name, ", ".join(REAL_SETS + SYNTH_SETS)))


def format_table(name, note, summary):
    lines = ["", "== %s (%s) ==" % (name, note),
             "%-14s %7s %11s %9s %9s %9s %7s %8s" % ("method", "budget", "recall_mean", "recall_p5", "err_mean",
                                                    "err_p95", "bytes", "needles")]
    for (method, budget), s in sorted(summary.items(), key=lambda kv: (kv[0][1], METHODS.index(kv[0][0])
                                                                          if kv[0][0] in METHODS else 99)):
        lines.append("%-14s %7.4f %11.4f %9.4f %9.4f %9.4f %7.4f %8s" % (
            method, budget, s["recall_mean"], s["recall_p5"], s["err_mean"], s["err_p95"], s["bytes"],
            "-" if s["needles"] is None else "%.3f" % s["needles"]))
    return "\n".join(lines)


def quality_lines(name, summary):
    return ["quality: data=%s method=%s budget=%g recall_mean=%.4f recall_p5=%.4f err_mean=%.4f bytes=%.4f" % (
        name, method, budget, s["recall_mean"], s["recall_p5"], s["err_mean"], s["bytes"])
        for (method, budget), s in sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][0]))]


def run_revisit(name, small, threads):
    """The query-memory session (revisit.py): table and quality lines."""
    import sessions
    weak = "weak-" if name.startswith("synth-revisit-weak-") else ""
    tokens = 8192 if small else int(name[len("synth-revisit-" + weak):-1]) * 1024
    data, out = sessions.evaluate(seq_len=tokens, n_threads=threads, return_strength=sessions.RETURN_STRENGTH[weak])
    print("\n== %s (turns: %s; recall of turn 3's attention, and on the returning document) ==" %
          (data, " / ".join(sessions.TURNS)))
    print("%-18s %7s %11s %9s %13s %11s" % ("method", "budget", "recall_mean", "recall_p5", "returning_doc",
                                             "returning_p5"))
    lines = []
    for (method, budget), (rec, home) in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rec, home = np.array(rec), np.array(home)
        print("%-18s %7.4f %11.4f %9.4f %13.4f %11.4f" % (method, budget, rec.mean(), np.percentile(rec, 5),
                                                        home.mean(), np.percentile(home, 5)))
        lines.append("quality: data=%s method=%s budget=%g recall_mean=%.4f recall_p5=%.4f returning_doc=%.4f" %
                     (data, method, budget, rec.mean(), np.percentile(rec, 5), home.mean()))
    return lines


def run_feedback(name, small, threads):
    """Attention feedback over sessions of steps (sessions.feedback_session) on
    a synthetic and a real multi-document context: table and quality lines."""
    import sessions
    lines = []
    for data in ("synth-32k", "real-multidoc-8k"):
        contexts = build_cases(data, small)
        out = {}
        for case in contexts:
            for key, rec in sessions.feedback_session(case, n_threads=threads).items():
                out.setdefault(key, []).extend(rec)
        label = "session-feedback-" + contexts[0].name
        print("\n== %s (each query a step of one sequence; recall over steps 2..N; prior weight 0.5, rate 0.5) ==" %
              label)
        print("%-20s %7s %11s %9s" % ("method", "budget", "recall_mean", "recall_p5"))
        for (method, budget), rec in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rec = np.array(rec)
            print("%-20s %7.4f %11.4f %9.4f" % (method, budget, rec.mean(), np.percentile(rec, 5)))
            lines.append("quality: data=%s method=%s budget=%g recall_mean=%.4f recall_p5=%.4f" %
                         (label, method, budget, rec.mean(), np.percentile(rec, 5)))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=",".join(REAL_SETS + SYNTH_SETS + SESSION_SETS),
                    help="comma-separated data sets")
    ap.add_argument("--tensors", help="a safetensors file of your own Q/K/V (format: bench/quality/user_tensors.py)")
    ap.add_argument("--layout", help="optional layout JSON for --tensors")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--small", action="store_true", help="reduced sizes (CI)")
    ap.add_argument("--check", action="store_true", help="check the harness's properties; exit 1 on a violation")
    ap.add_argument("--plot", help="write recall vs budget per method (PNG) here")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    harness._load_lib()
    methods = tuple(m for m in args.methods.split(",") if m)
    names = [] if args.tensors else [n for n in args.data.split(",") if n]
    all_summaries, all_lines, violations = {}, [], []
    cases = [(n, None) for n in names]
    if args.tensors:
        cases = [("user", args.tensors)]
    for name, path in cases:
        t0 = time.time()
        if name in SESSION_SETS:
            run_session = run_revisit if name.startswith("synth-revisit") else run_feedback
            all_lines += run_session(name, args.small, args.threads)
            print("(%s: %.1f s)" % (name, time.time() - t0), flush=True)
            continue
        try:
            contexts = [user_tensors.load_case(path, args.layout)] if path else build_cases(name, args.small)
        except user_tensors.TensorFileError as e:
            print("run_quality: %s" % e, file=sys.stderr)
            return 2
        checks = [] if args.check else None
        results = {}
        for case in contexts:
            try:
                harness.merge(results, harness.evaluate(case, methods, checks=checks, n_threads=args.threads))
            except harness.ikv.IntentKVError as e:  # e.g. a user layout the library refuses
                print("run_quality: %s: %s" % (case.name, e), file=sys.stderr)
                return 2
        summary = harness.summarize(results)
        name = contexts[0].name
        all_summaries[name] = summary
        print(format_table(name, contexts[0].note, summary))
        print("(%s: %.1f s)" % (name, time.time() - t0), flush=True)
        all_lines += quality_lines(name, summary)
        if checks is not None:
            violations += checks
    if args.plot:
        import plot
        plot.recall_vs_budget(all_summaries, args.plot)
        print("plot: %s" % args.plot)
    print()
    print("\n".join(all_lines))
    if args.check:
        failed = {(c, m, b) for (c, m, b), _ in violations}
        for _, message in violations[:20]:
            print("VIOLATION: " + message)
        print("decode vs float64 over its own selection, largest relative L2 (bound 1e-5): " +
              ", ".join("%s %.3g" % kv for kv in sorted(harness.LARGEST_DEVIATION.items())))
        n_rows = sum(len(s) for s in all_summaries.values())
        print("harness properties over (data, method, budget) rows: %d passed, %d failed" % (n_rows - len(failed),
                                                                                           len(failed)))
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
