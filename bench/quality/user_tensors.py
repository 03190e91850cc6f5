"""Your own model's tensors in the selection-quality harness.

File format (intentkv-quality-v1): one safetensors file holding, for each
layer l = 0 .. L-1 (layers numbered from 0 without gaps),
  layer.<l>.q   [n_queries, n_q_heads, head_dim]   the query rows of decode steps
  layer.<l>.k   [seq_len, n_kv_heads, head_dim]    the keys, positions 0 .. seq_len-1
  layer.<l>.v   [seq_len, n_kv_heads, head_dim]    the values
in float32 or float16, with n_q_heads a multiple of n_kv_heads (query head h
reads kv-head h / (n_q_heads / n_kv_heads)) and head_dim one intentkv supports
(32, 64, 80, 96, 128, 256). Every query row attends every key: they are the
queries of steps taken at the end of the context, as an engine decodes. Keys
as the model uses them (after RoPE); queries unscaled (the harness scales by
1/sqrt(head_dim)).

Optional layout JSON (--layout): what your engine knows of the context, for
the plan methods:
  {"blocks": [{"name": "system", "kind": "SYSTEM_PROMPT", "policy": "ALWAYS",
               "start": 0, "end": 900, "score": 1.0}, ...]}
kind and policy are the header's names without their prefix (ikv_block_kind,
ikv_policy); blocks must not overlap and must end at or before seq_len.

Writing one from PyTorch:
  from safetensors.torch import save_file
  save_file({f"layer.{l}.q": q[l].float().contiguous(), ...}, "mine.safetensors")
"""
import json
import os
import re

import numpy as np

from synthetic import Case

SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128, 256)
KINDS = ("SYSTEM_PROMPT", "MEMORY_SUMMARY", "RETRIEVED_DOC", "TOOL_OUTPUT", "SCRATCHPAD", "CONVERSATION",
         "REASONING", "OTHER")
POLICIES = ("ALWAYS", "ATTEND", "SKIP", "RECENT", "GLOBAL")


class TensorFileError(ValueError):
    """Malformed input: the message names the file, tensor or block and what is wrong."""


def _load_arrays(path):
    if not os.path.exists(path):
        raise TensorFileError("%s: no such file" % path)
    try:
        from safetensors.numpy import load_file
        return load_file(path)
    except Exception as e:  # the safetensors parser's own message says what it could not read
        raise TensorFileError("%s: not a readable safetensors file of float32/float16 tensors (%s)" % (path, e))


def _layer_count(path, arrays):
    names = set(arrays)
    layers = sorted({int(m.group(1)) for n in names for m in [re.fullmatch(r"layer\.(\d+)\.[qkv]", n)] if m})
    if not layers:
        raise TensorFileError("%s: no tensor named layer.<l>.q / .k / .v (found: %s)" %
                              (path, ", ".join(sorted(names)[:8]) or "none"))
    for l in range(layers[-1] + 1):
        for part in "qkv":
            if "layer.%d.%s" % (l, part) not in names:
                raise TensorFileError("%s: tensor layer.%d.%s is missing" % (path, l, part))
    return layers[-1] + 1


def _checked(path, name, a, shape):
    """a as float32 after checking its dtype, rank, shape (None: any) and values."""
    if a.dtype not in (np.float32, np.float16):
        raise TensorFileError("%s: tensor %s has dtype %s; float32 or float16 expected" % (path, name, a.dtype))
    if a.ndim != 3:
        raise TensorFileError("%s: tensor %s has shape %s; 3 dimensions expected" % (path, name, list(a.shape)))
    for i, (got, want) in enumerate(zip(a.shape, shape)):
        if want is not None and got != want:
            raise TensorFileError("%s: tensor %s has shape %s; dimension %d should be %d like the others" %
                                  (path, name, list(a.shape), i, want))
    a = a.astype(np.float32)
    bad = ~np.isfinite(a)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise TensorFileError("%s: tensor %s holds a non-finite value (%r at index %s)" %
                              (path, name, float(a[idx]), list(idx)))
    return a


def load_case(path, layout_path=None):
    """The Case in a user's tensor file (and layout), or TensorFileError."""
    arrays = _load_arrays(path)
    n_layers = _layer_count(path, arrays)
    k0 = arrays["layer.0.k"]
    if k0.ndim != 3:
        raise TensorFileError("%s: tensor layer.0.k has shape %s; [seq_len, n_kv_heads, head_dim] expected" %
                              (path, list(k0.shape)))
    T, H, D = k0.shape
    if D not in SUPPORTED_HEAD_DIMS:
        raise TensorFileError("%s: head_dim %d (layer.0.k's last dimension) is not one intentkv supports: %s" %
                              (path, D, SUPPORTED_HEAD_DIMS))
    if T < 16:
        raise TensorFileError("%s: layer.0.k has %d positions; at least one page (16) expected" % (path, T))
    q0 = arrays["layer.0.q"]
    if q0.ndim != 3 or q0.shape[2] != D or q0.shape[1] % H != 0 or q0.shape[0] < 1:
        raise TensorFileError("%s: tensor layer.0.q has shape %s; [n_queries, n_q_heads, %d] expected with "
                              "n_q_heads a multiple of n_kv_heads %d" % (path, list(q0.shape), D, H))
    NQ, HQ = q0.shape[:2]
    k = np.stack([_checked(path, "layer.%d.k" % l, arrays["layer.%d.k" % l], (T, H, D)) for l in range(n_layers)])
    v = np.stack([_checked(path, "layer.%d.v" % l, arrays["layer.%d.v" % l], (T, H, D)) for l in range(n_layers)])
    q = np.stack([_checked(path, "layer.%d.q" % l, arrays["layer.%d.q" % l], (NQ, HQ, D)) for l in range(n_layers)])
    blocks = load_layout(layout_path, T) if layout_path else None
    return Case(name="user-" + os.path.splitext(os.path.basename(path))[0], k=k, v=v, q=q, blocks=blocks,
                note="%d layers, %d kv-heads, %d query heads, head_dim %d, %d tokens, %d queries" %
                (n_layers, H, HQ, D, T, NQ))


def load_layout(path, seq_len):
    """Blocks of a layout JSON, checked against seq_len (the library checks overlaps)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise TensorFileError("%s: cannot read the layout JSON (%s)" % (path, e))
    blocks = doc.get("blocks") if isinstance(doc, dict) else None
    if not isinstance(blocks, list):
        raise TensorFileError("%s: expected an object with a \"blocks\" list" % path)
    out = []
    for i, b in enumerate(blocks):
        where = "%s: block %d" % (path, i)
        if not isinstance(b, dict):
            raise TensorFileError("%s is not an object" % where)
        for key in ("name", "start", "end"):
            if key not in b:
                raise TensorFileError("%s has no \"%s\"" % (where, key))
        kind, policy = b.get("kind", "OTHER"), b.get("policy", "ATTEND")
        if kind not in KINDS:
            raise TensorFileError("%s (%s): kind %r is not one of %s" % (where, b["name"], kind, KINDS))
        if policy not in POLICIES:
            raise TensorFileError("%s (%s): policy %r is not one of %s" % (where, b["name"], policy, POLICIES))
        start, end, score = b["start"], b["end"], b.get("score", 0.5)
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= seq_len):
            raise TensorFileError("%s (%s): [%r, %r) is not a range inside [0, %d)" %
                                  (where, b["name"], start, end, seq_len))
        if not (isinstance(score, (int, float)) and 0.0 <= score <= 1.0):
            raise TensorFileError("%s (%s): score %r is not in [0, 1]" % (where, b["name"], score))
        out.append(dict(name=str(b["name"]), kind=kind, policy=policy, start=start, end=end, score=float(score)))
    return out
