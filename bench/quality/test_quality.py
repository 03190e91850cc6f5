"""Tests of the selection-quality harness that need no model: the user tensor
format's checks (malformed input gets a message naming the tensor, never a
crash) and a user file run end to end with the harness's property checks."""
import json
import os
import sys
import tempfile
import unittest

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import run_quality  # noqa: E402
from user_tensors import TensorFileError, load_case  # noqa: E402


def tensors(layers=2, T=64, H=2, G=2, D=32, N=3, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for l in range(layers):
        out["layer.%d.q" % l] = rng.standard_normal((N, H * G, D)).astype(np.float32)
        out["layer.%d.k" % l] = rng.standard_normal((T, H, D)).astype(np.float32)
        out["layer.%d.v" % l] = rng.standard_normal((T, H, D)).astype(np.float32)
    return out


class UserTensorsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        harness._load_lib()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, arrays, name="t.safetensors"):
        path = os.path.join(self.dir.name, name)
        save_file(arrays, path)
        return path

    def expect_error(self, arrays, needle):
        with self.assertRaises(TensorFileError) as cm:
            load_case(self.write(arrays))
        self.assertIn(needle, str(cm.exception))

    def test_malformed_files_name_the_problem(self):
        t = tensors()
        del t["layer.1.v"]
        self.expect_error(t, "layer.1.v is missing")
        t = tensors()
        t["layer.1.k"] = t["layer.1.k"][:, :, :16].copy()
        self.expect_error(t, "layer.1.k has shape")
        t = tensors()
        t["layer.0.k"][5, 1, 3] = np.nan
        self.expect_error(t, "layer.0.k holds a non-finite value")
        t = tensors()
        t["layer.1.q"][0, 0, 0] = np.inf
        self.expect_error(t, "layer.1.q holds a non-finite value")
        self.expect_error(tensors(D=48), "head_dim 48")
        t = tensors()
        t["layer.0.q"] = t["layer.0.q"][:, :3].copy()
        self.expect_error(t, "multiple of n_kv_heads")
        self.expect_error({"x": np.zeros((2, 2, 2), np.float32)}, "no tensor named layer.<l>")
        t = tensors()
        t["layer.0.v"] = t["layer.0.v"].astype(np.float64)
        self.expect_error(t, "dtype float64")
        with self.assertRaises(TensorFileError) as cm:
            load_case(os.path.join(self.dir.name, "absent.safetensors"))
        self.assertIn("no such file", str(cm.exception))
        bad = os.path.join(self.dir.name, "junk.safetensors")
        with open(bad, "wb") as f:
            f.write(b"not a safetensors file")
        with self.assertRaises(TensorFileError):
            load_case(bad)

    def test_layout_errors_name_the_block(self):
        path = self.write(tensors())
        layout = os.path.join(self.dir.name, "layout.json")
        for blocks, needle in (([{"name": "a", "start": 0, "end": 99}], "not a range inside [0, 64)"),
                               ([{"name": "a", "start": 0, "end": 8, "kind": "NOPE"}], "kind 'NOPE'"),
                               ([{"name": "a", "start": 0, "end": 8, "score": 2}], "score 2"),
                               ([{"start": 0, "end": 8}], "has no \"name\"")):
            with open(layout, "w") as f:
                json.dump({"blocks": blocks}, f)
            with self.assertRaises(TensorFileError) as cm:
                load_case(path, layout)
            self.assertIn(needle, str(cm.exception))
        # Overlapping blocks pass the file checks and are refused by the library: exit 2, a message.
        with open(layout, "w") as f:
            json.dump({"blocks": [{"name": "a", "start": 0, "end": 32}, {"name": "b", "start": 16, "end": 48}]}, f)
        self.assertEqual(run_quality.main(["--tensors", path, "--layout", layout, "--methods", "plan"]), 2)

    def test_user_file_runs_with_properties_held(self):
        path = self.write(tensors(T=96, D=32))
        layout = os.path.join(self.dir.name, "layout.json")
        with open(layout, "w") as f:
            json.dump({"blocks": [{"name": "sys", "start": 0, "end": 16, "policy": "ALWAYS"},
                                  {"name": "doc", "start": 16, "end": 80, "kind": "RETRIEVED_DOC", "score": 0.9},
                                  {"name": "turn", "start": 80, "end": 96, "score": 1.0}]}, f)
        case = load_case(path, layout)
        checks = []
        results = harness.evaluate(case, run_quality.METHODS, checks=checks, n_threads=1)
        self.assertEqual(checks, [])
        summary = harness.summarize(results)
        self.assertAlmostEqual(summary[("dense", 1.0)]["recall_mean"], 1.0, places=9)
        for budget in harness.BUDGETS:
            oracle = summary[("oracle", budget)]["recall_mean"]
            for method in ("random", "sinks+recent", "quest", "hybrid", "keys", "adaptive-0.9"):
                self.assertLessEqual(summary[(method, budget)]["recall_mean"], oracle + 1e-9, (method, budget))


if __name__ == "__main__":
    unittest.main()
