"""Selection over sessions of steps: what earlier steps teach the next ones.

revisit (query memory, ikv_query_memory): the attended document changes and
later returns.

Per query head: turn 1 reads document A, turn 2 document B, turn 3 returns to
A with a weaker query (half of A's topic in it, or a fifth in the "weak" set:
the "unusual query" the memory is for). The same keys throughout
(synthetic.py's construction: 1024-token documents with topic directions,
sinks). The memory remembers turns 1 and 2 (all of their queries), then turn
3 decodes with and without it at each budget, in both of the memory's forms:
`hybrid+memory` keeps the turns apart and each head recalls the most similar
(ikv_query_memory_config.turns = 4, the default), `hybrid+memory-mean` keeps
one decayed mean (turns = 0, the first version). Reported: recall of turn 3's
true attention, and recall on the returning document (its share of turn 3's
mass that the pages read hold).
"""
import numpy as np

import harness
from synthetic import DOC_TOKENS, SINK_TOKENS, Case, _unit

TURNS = ("A", "B", "A again, weaker")
RETURN_STRENGTH = {"": 1.5, "weak-": 0.6}  # turn 3's share of A's topic (turns 1 and 2: 3.0), per set name


def revisit_case(seq_len=32768, seed=7, n_kv_heads=4, group=4, head_dim=64, n_queries=8, return_strength=1.5):
    """Keys, values and three turns of queries ([turn][query][q_head][D]), and
    per q-head the returning document's token range."""
    rng = np.random.default_rng(seed)
    T, D, H, G = seq_len, head_dim, n_kv_heads, group
    n_docs, sd = T // DOC_TOKENS, np.sqrt(D)
    k = (0.3 * rng.standard_normal((T, H, D))).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    q = np.empty((3, n_queries, H * G, D), np.float32)
    home = {}
    for h in range(H):
        topics = _unit(rng, n_docs, D)
        sink = _unit(rng, 1, D)[0]
        for d in range(n_docs):
            k[d * DOC_TOKENS:(d + 1) * DOC_TOKENS, h] += (2.0 * topics[d]).astype(np.float32)
        k[:SINK_TOKENS, h] += (4.0 * sink).astype(np.float32)
        for g in range(G):
            a, b = rng.choice(np.arange(1, n_docs - 1), size=2, replace=False)
            home[h * G + g] = (a * DOC_TOKENS, (a + 1) * DOC_TOKENS)
            for turn, (doc, strength) in enumerate(((a, 3.0), (b, 3.0), (a, return_strength))):
                for n in range(n_queries):
                    q[turn, n, h * G + g] = (strength * topics[doc] * sd + 2.0 * sink * sd +
                                             rng.standard_normal(D)).astype(np.float32)
    weak = [p for p, x in RETURN_STRENGTH.items() if x == return_strength]
    case = Case(name="synth-revisit-%s%dk" % (weak[0] if weak else "", T // 1024), k=k[None], v=v[None], q=q[2][None],
                note="%d kv-heads x %d query heads, head_dim %d, 3 turns of %d queries" % (H, G, D, n_queries))
    return case, q, home


def evaluate(seq_len=32768, budgets=harness.BUDGETS, decay=0.5, n_threads=0, return_strength=1.5):
    """{(method, budget): (recall list, returning-document recall list)}."""
    case, turns, home = revisit_case(seq_len, return_strength=return_strength)
    dec = harness.ikv.Decoder(n_threads=n_threads)
    run = harness.CaseRunner(case, dec)
    # The pool holds kv-head h as layer h (harness.CaseRunner): the memory
    # remembers each layer's group of query heads.
    memories = {"hybrid+memory": harness.ikv.QueryMemory(run.pool, n_q_heads=run.group, decay=decay, turns=4),
                "hybrid+memory-mean": harness.ikv.QueryMemory(run.pool, n_q_heads=run.group, decay=decay, turns=0)}
    for memory in memories.values():
        for turn in (0, 1):  # every fork remembers turns 1 and 2 (each step's queries)
            for seq in run.forks:
                for h in range(run.H):
                    memory.remember(seq, h, np.ascontiguousarray(turns[turn, :, h * run.group:(h + 1) * run.group]))
                memory.end_turn(seq)
    out = {}
    try:
        for h in range(run.H):
            ref = run.head_reference(0, h)
            for share in budgets:
                B = harness.budget_tokens(share, run.T)
                for method, mem in (("hybrid", None),) + tuple(memories.items()):
                    _, runs, _ = run.decode(0, h, ref, topk_token_budget=B, topk_score=harness.ikv.TopkScore.HYBRID,
                                            query_memory=mem)
                    rec, home_rec = out.setdefault((method, share), ([], []))
                    for n in range(run.N):
                        got = harness.mass_of_runs(ref["cum"][n], runs[n])  # [G]
                        rec.extend(got.tolist())
                        for g in range(run.group):
                            b, e = home[h * run.group + g]
                            inside = [(max(b, rb), min(e, re)) for rb, re in runs[n] if rb < e and re > b]
                            total = ref["cum"][n, g, e] - ref["cum"][n, g, b]
                            home_rec.append(harness.mass_of_runs(ref["cum"][n, g], inside) / total)
    finally:
        for memory in memories.values():
            memory.close()
        run.close()
        dec.close()
    return case.name, out


def _plans_at_step(run, dec, ref, pl, fb, B, n):
    """Recall of step n read through the plan at budget B, routed from the
    layout's scores (`plan`) and from the block scores the feedback of steps
    0..n-1 gives (`plan+feedback-scores`); these decodes feed nothing back."""
    out = {}
    with harness.ikv.Router(page_size=harness.PAGE, token_budget=B, recent_window=0, attend_threshold=0.0,
                            over_budget=harness.ikv.OverBudget.KEEP) as router, run.layout.clone() as rescored:
        fb.block_scores(run.seq, rescored)
        for key, layout in (("plan", run.layout), ("plan+feedback-scores", rescored)):
            with router.route(layout, run.T) as plan:
                dec.decode(run.pool, [run.seq], ref["q"][n], run.group, layer=pl, plans=[plan])
                out[key] = harness.mass_of_runs(ref["cum"][n], dec.last_selection(0, 0)).tolist()
    return out


def feedback_session(case, budgets=harness.BUDGETS, weight=0.5, rate=0.5, n_threads=0):
    """Attention feedback (ikv_page_feedback) over a session: the case's N
    queries are N consecutive decode steps of one sequence; each step decodes
    with top-k (hybrid score) with and without the averages of the steps
    before it as a prior (topk_feedback_weight), and feeds back its shares.
    With a layout, the router's plan at the budget is measured too at each
    step n, routed from the engine's scores (`plan`) and from the block scores
    the feedback of steps before n gives (`plan+feedback-scores`,
    ikv_page_feedback_block_scores).
    Returns {(method, budget): recall list} over steps 2..N."""
    dec = harness.ikv.Decoder(n_threads=n_threads)
    run = harness.CaseRunner(case, dec)
    out = {}
    try:
        for layer in range(run.L):
            for h in range(run.H):
                ref = run.head_reference(layer, h)
                pl = layer * run.H + h
                for share in budgets:
                    B = harness.budget_tokens(share, run.T)
                    for method, w in (("hybrid", 0.0), ("hybrid+feedback", weight)):
                        with harness.ikv.PageFeedback(run.pool, rate=rate) as fb:
                            for n in range(run.N):
                                if n > 0 and run.layout is not None and w == 0.0:
                                    for key, rec in _plans_at_step(run, dec, ref, pl, fb, B, n).items():
                                        out.setdefault((key, share), []).extend(rec)
                                dec.decode(run.pool, [run.seq], ref["q"][n], run.group, layer=pl, topk_token_budget=B,
                                           topk_score=harness.ikv.TopkScore.HYBRID, feedback=fb,
                                           topk_feedback_weight=w)
                                if n == 0:
                                    continue  # no feedback yet: both methods read the same
                                got = harness.mass_of_runs(ref["cum"][n], dec.last_selection(0, 0))
                                out.setdefault((method, share), []).extend(got.tolist())
    finally:
        run.close()
        dec.close()
    return out
