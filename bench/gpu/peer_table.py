#!/usr/bin/env python3
"""The GPU decode table of bench/RESULTS.md (issue 18): intentkv through its
public API (tests/bench_gpu_api.c's RESULT lines) beside the peers an engine
author would pick instead, measured in the same device session the same way:
20 warm-up calls, then 200 back-to-back calls on one stream between two CUDA
events, median of 3 runs.

Peers, on the shapes of bench_gpu_api (32 q-heads, 8 kv-heads, head_dim 128,
page 16, fp16 q/out, one query token; B x ctx 1x32K, 1x128K, 8x32K, 32x16K):
  - PyTorch SDPA, enable_gqa=True, dense fp16, cuDNN and flash backends;
  - FlashInfer's BatchDecodeWithPagedKVCacheWrapper (NHD, page 16, run()
    after plan(), the better of use_tensor_cores off and on): dense; given
    the same quarter of the pages intentkv's plan reads as kv_indices (page
    4k + (7k + 3b) % 4 of sequence b); with an FP8-E4M3 KV cache, dense;
  - PyTorch FlexAttention (torch.compile'd flex_attention, enable_gqa) with a
    BlockMask keeping the same quarter of the pages (its default 128-token
    blocks, as a FlexAttention user would build it): a footnote, since it
    is slower than cuDNN dense.
FlashInfer is optional (`flashinfer-python`, fetched at benchmark time by
scripts/fetch_peer_flashinfer.sh, never committed): without it those columns
say so.

  peer_table.py --ours ikv_api.txt [--out DIR]   writes DIR/gpu_table.md
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

SHAPES = [(1, 32768), (1, 131072), (8, 32768), (32, 16384)]
HQ, HKV, D, P = 32, 8, 128, 16
WARM, STEPS, RUNS = 20, 200, 3


def time_ms(step):
    for _ in range(WARM):
        step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(RUNS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(STEPS):
            step()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) / STEPS)
    return statistics.median(runs)


def quarter_pages(B, ctx):
    """Per sequence, page 4k + (7k + 3b) % 4 of every four (bench_gpu_api.c's plan)."""
    n = ctx // P
    return [[4 * k + (7 * k + 3 * b) % 4 for k in range(n // 4)] for b in range(B)]


def sdpa(B, ctx, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = "cuda"
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.float16)
    k = torch.randn(B, HKV, ctx, D, device=dev, dtype=torch.float16)
    v = torch.randn(B, HKV, ctx, D, device=dev, dtype=torch.float16)
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel([be]):
        return time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def flashinfer_decode(B, ctx, selected, fp8):
    import flashinfer.decode as fd  # the trimmed package lacks some top-level modules
    dev = "cuda"
    n = ctx // P
    cache = torch.randn(B * n, 2, P, HKV, D, device=dev, dtype=torch.float16)
    if fp8:
        cache = cache.to(torch.float8_e4m3fn)
    if selected:
        pages = [[b * n + p for p in sel] for b, sel in enumerate(quarter_pages(B, ctx))]
    else:
        pages = [[b * n + p for p in range(n)] for b in range(B)]
    indptr = torch.tensor([0] + [sum(len(x) for x in pages[:i + 1]) for i in range(B)], dtype=torch.int32, device=dev)
    indices = torch.tensor([p for x in pages for p in x], dtype=torch.int32, device=dev)
    last = torch.full((B,), P, dtype=torch.int32, device=dev)
    q = torch.randn(B, HQ, D, device=dev, dtype=torch.float16)
    best = None
    for tc in (False, True):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        w = fd.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, HQ, HKV, D, P, pos_encoding_mode="NONE", q_data_type=torch.float16,
               kv_data_type=cache.dtype)
        ms = time_ms(lambda: w.run(q, cache))
        best = ms if best is None else min(best, ms)
    return best


def flex_quarter(B, ctx):
    """FlexAttention decode reading the same quarter of the pages (a mask over 16-token pages)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    dev = "cuda"
    keep = torch.zeros(B, ctx // P, dtype=torch.bool, device=dev)
    for b, sel in enumerate(quarter_pages(B, ctx)):
        keep[b, torch.tensor(sel, device=dev)] = True

    def page_kept(b, h, q_idx, kv_idx):
        return keep[b, kv_idx // P]

    mask = create_block_mask(page_kept, B, None, 1, ctx, device=dev)
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.float16)
    k = torch.randn(B, HKV, ctx, D, device=dev, dtype=torch.float16)
    v = torch.randn(B, HKV, ctx, D, device=dev, dtype=torch.float16)
    flex = torch.compile(flex_attention)
    return time_ms(lambda: flex(q, k, v, block_mask=mask, enable_gqa=True))


def measure(name, fn):
    try:
        ms = fn()
        print(f"  {name}: {ms:.4f} ms", flush=True)
        return ms
    except Exception as e:  # a peer that cannot run here is reported, not fatal
        print(f"  {name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return None
    finally:
        torch.cuda.empty_cache()


def read_tagged(path, tag):
    """Lines `<tag> <B> <ctx> <column> <ms>` of a benchmark's output (a missing file: none)."""
    found = {}
    if path and os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) == 5 and f[0] == tag:
                found[(int(f[1]), int(f[2]), f[3])] = float(f[4])
    return found


def read_ours(path):
    """tests/bench_gpu_api's RESULT lines."""
    return read_tagged(path, "RESULT")


def read_steps(path):
    """tests/bench_gpu_step's STEP lines (issue 19's engine step, 32 layers)."""
    return read_tagged(path, "STEP")


def step_table(steps):
    """The whole engine step beside the decodes alone (issue 19's shapes and its 1.05x target)."""
    shapes = sorted({(B, c) for B, c, _ in steps}, key=lambda s: (s[0], s[1]))
    if not shapes:
        return []
    s = lambda B, c, col: steps.get((B, c, col))  # noqa: E731
    md = ["", "The engine step (tests/bench_gpu_step: 32 layers, per layer one token appended to every sequence "
          "and one dense F16 decode; ms per step): the decodes alone, eager and replayed as a graph; the step "
          "with separate ikv_pool_append_batch calls replayed as a graph; the step with each append passed to "
          "its decode (ikv_decode_args.append), eager and replayed (issue 19's target: <= 1.05x the decodes "
          "alone).", "",
          "| B x ctx | decodes alone | decodes alone, graph | step, graph (append calls) | step, fused, eager "
          "| step, fused, graph | fused graph / decodes alone | met |", "|---|---|---|---|---|---|---|---|"]
    for B, c in shapes:
        base, fg = s(B, c, "decode-only"), s(B, c, "step-fused-graph")
        r = ratio(fg, base)
        md.append(f"| {B} x {c // 1024}K | {fmt(base)} | {fmt(s(B, c, 'decode-only-graph'))} | "
                  f"{fmt(s(B, c, 'step-graph'))} | {fmt(s(B, c, 'step-fused-eager'))} | {fmt(fg)} | "
                  f"{'-' if r is None else f'{r:.3f}x'} | {'-' if r is None else ('yes' if r <= 1.05 else 'no')} |")
    return md


def fmt(x):
    return "-" if x is None else f"{x:.4f}"


def ratio(a, b):
    return None if a is None or b is None else a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--steps", default=None, help="tests/bench_gpu_step output (the engine step table)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    ours = read_ours(args.ours)
    try:
        import flashinfer.decode  # noqa: F401
        fi_note = "FlashInfer " + getattr(sys.modules.get("flashinfer"), "__version__", "?")
    except Exception as e:
        fi_note = f"FlashInfer not available ({type(e).__name__}: {e})"
    print(fi_note, flush=True)
    peers = {}
    for B, ctx in SHAPES:
        print(f"B={B} ctx={ctx}", flush=True)
        peers[(B, ctx, "cudnn")] = measure("SDPA cuDNN", lambda: sdpa(B, ctx, "cudnn"))
        peers[(B, ctx, "flash")] = measure("SDPA flash", lambda: sdpa(B, ctx, "flash"))
        if not fi_note.startswith("FlashInfer not"):
            peers[(B, ctx, "fi")] = measure("FlashInfer dense", lambda: flashinfer_decode(B, ctx, False, False))
            peers[(B, ctx, "fi25")] = measure("FlashInfer 25% pages", lambda: flashinfer_decode(B, ctx, True, False))
            peers[(B, ctx, "fi8")] = measure("FlashInfer FP8 dense", lambda: flashinfer_decode(B, ctx, False, True))
        peers[(B, ctx, "flex25")] = measure("FlexAttention 25% pages", lambda: flex_quarter(B, ctx))

    props = torch.cuda.get_device_properties(0)
    o = lambda B, c, col: ours.get((B, c, col))  # noqa: E731
    p = lambda B, c, col: peers.get((B, c, col))  # noqa: E731
    md = [f"{props.name}, torch {torch.__version__}, {fi_note}. Milliseconds per call, "
          f"{STEPS} back-to-back calls between CUDA events (intentkv: host clock, stream synchronized), "
          f"median of {RUNS}.", "",
          "| B, ctx | ikv dense F16 | ikv dense BF16 | SDPA cuDNN | SDPA flash | FlashInfer dense | ikv 25% plan "
          "| FlashInfer 25% pages | ikv 25% top-k | ikv FP8 | FlashInfer FP8 | ikv INT8 | ikv INT4 "
          "| ikv graph: dense / plan / top-k |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for B, c in SHAPES:
        g = " / ".join(fmt(o(B, c, x + "-graph")) for x in ("dense-f16", "plan25", "topk25"))
        md.append(f"| {B}, {c // 1024}K | {fmt(o(B, c, 'dense-f16'))} | {fmt(o(B, c, 'dense-bf16'))} | "
                  f"{fmt(p(B, c, 'cudnn'))} | {fmt(p(B, c, 'flash'))} | {fmt(p(B, c, 'fi'))} | "
                  f"{fmt(o(B, c, 'plan25'))} | {fmt(p(B, c, 'fi25'))} | {fmt(o(B, c, 'topk25'))} | "
                  f"{fmt(o(B, c, 'dense-fp8'))} | {fmt(p(B, c, 'fi8'))} | {fmt(o(B, c, 'dense-int8'))} | "
                  f"{fmt(o(B, c, 'dense-int4'))} | {g} |")
    md += ["", "FlexAttention (footnote): torch.compile'd `flex_attention` with a BlockMask keeping the same 25% of "
           "pages (default 128-token blocks), ms per call: " + ", ".join(
               f"{B} x {c // 1024}K {fmt(p(B, c, 'flex25'))} (ikv 25% plan {fmt(o(B, c, 'plan25'))}, "
               f"SDPA cuDNN dense {fmt(p(B, c, 'cudnn'))})" for B, c in SHAPES) + "."]
    # The targets as ratios (> 1: intentkv faster), each against its peer.
    checks = []
    for B, c in SHAPES:
        dense = o(B, c, "dense-f16")
        peer_best = min([x for x in (p(B, c, "cudnn"), p(B, c, "fi")) if x is not None], default=None)
        big = B >= 8
        checks += [
            (B, c, "dense F16 vs the faster of cuDNN and FlashInfer", ratio(peer_best, dense), 1.00),
            (B, c, "dense BF16 vs the same", ratio(peer_best, o(B, c, "dense-bf16")), 1.00),
            (B, c, "25% plan vs FlashInfer given the same pages", ratio(p(B, c, "fi25"), o(B, c, "plan25")), 1.10),
            (B, c, "FP8 pages vs FlashInfer FP8", ratio(p(B, c, "fi8"), o(B, c, "dense-fp8")), 1.00),
            (B, c, "25% plan vs cuDNN dense", ratio(p(B, c, "cudnn"), o(B, c, "plan25")), 3.8 if big else 4.0),
            (B, c, "25% plan time / 25% top-k time", ratio(o(B, c, "plan25"), o(B, c, "topk25")), 1 / 1.15),
            (B, c, "dense graph replay vs eager", ratio(dense, o(B, c, "dense-f16-graph")), 1.00),
        ]
        if big:
            checks += [
                (B, c, "INT8 vs F16 dense", ratio(dense, o(B, c, "dense-int8")), 1.70),
                (B, c, "FP8 vs F16 dense", ratio(dense, o(B, c, "dense-fp8")), 1.90),
                (B, c, "INT4 vs F16 dense", ratio(dense, o(B, c, "dense-int4")), 2.50),
            ]
    md += ["", "Selection extras (issue 17), ms per call: top-k 25% on the Quest bound, on the hybrid score, "
           "the hybrid with a query memory of 4 turns; dense with attention feedback (the decode sums each page's share as it reads "
           "it; their copy is not waited for).", "", "| B, ctx | topk25 Quest | hybrid | hybrid + memory | dense | dense + feedback |",
           "|---|---|---|---|---|---|"]
    for B, c in SHAPES:
        md.append(f"| {B}, {c // 1024}K | " + " | ".join(fmt(o(B, c, x)) for x in (
            "topk25", "hyb25", "hyb25-mem", "dense-f16", "dense-feedback")) + " |")
    md += step_table(read_steps(args.steps))
    md += ["", "| B, ctx | ratio (> 1: intentkv faster) | value | target | met |", "|---|---|---|---|---|"]
    for B, c, name, val, target in checks:
        met = "-" if val is None else ("yes" if val >= target else "no")
        md.append(f"| {B}, {c // 1024}K | {name} | {'-' if val is None else f'{val:.2f}x'} | {target:.2f}x | {met} |")
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(args.out, "gpu_table.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
