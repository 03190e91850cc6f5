"""unittest suite for the Python bindings (stdlib only). Needs $INTENTKV_LIB or a findable libintentkv."""
import array
import ctypes
import gc
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import intentkv as ikv  # noqa: E402
from intentkv import _ffi  # noqa: E402

SEQ_LEN = 1024
N_LAYERS, N_KV_HEADS, N_Q_HEADS, HEAD_DIM, PAGE = 2, 2, 4, 64, 16


def random_f32(rng, n):
    return array.array("f", (rng.uniform(-1.0, 1.0) for _ in range(n)))


def reference_attention(q, k, v, tokens, n_q_heads, n_kv_heads, head_dim):
    """Plain float64 softmax(q.k * scale) v over the given token positions, per query head."""
    group = n_q_heads // n_kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    out = []
    for h in range(n_q_heads):
        kvh = h // group
        qh = q[h * head_dim:(h + 1) * head_dim]
        logits = []
        for t in tokens:
            base = (t * n_kv_heads + kvh) * head_dim
            logits.append(scale * sum(float(qh[d]) * float(k[base + d]) for d in range(head_dim)))
        peak = max(logits)
        weights = [math.exp(x - peak) for x in logits]
        total = sum(weights)
        acc = [0.0] * head_dim
        for w, t in zip(weights, tokens):
            base = (t * n_kv_heads + kvh) * head_dim
            for d in range(head_dim):
                acc[d] += w * float(v[base + d])
        out.extend(a / total for a in acc)
    return out


class RoundTripTest(unittest.TestCase):
    def test_route_fill_decode_matches_float64_reference(self):
        rng = random.Random(7)
        with ikv.Layout.synth(seq_len=SEQ_LEN, n_documents=4, n_tool_outputs=2, n_turns=3, seed=11) as layout, \
                ikv.Router(page_size=PAGE, recent_window=128) as router, \
                router.route(layout, SEQ_LEN) as plan, \
                ikv.Pool(n_layers=N_LAYERS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE,
                         capacity_bytes=64 << 20) as pool, \
                ikv.Decoder(n_threads=1) as decoder:
            layout.validate(SEQ_LEN)
            summary = plan.summary()
            self.assertEqual(summary["seq_len"], SEQ_LEN)
            self.assertGreater(summary["tokens_selected"], 0)
            self.assertGreater(summary["tokens_skipped"], 0, "the synthetic layout should skip something")
            self.assertEqual(summary["tokens_selected"] + summary["tokens_skipped"], SEQ_LEN)

            seq = pool.seq_create()
            n = SEQ_LEN * N_LAYERS * N_KV_HEADS * HEAD_DIM
            k, v = random_f32(rng, n), random_f32(rng, n)
            self.assertEqual(pool.append(seq, k, memoryview(v), plan=plan), SEQ_LEN)
            self.assertEqual(pool.seq_length(seq), SEQ_LEN)
            self.assertEqual(pool.layer_length(seq, N_LAYERS - 1), SEQ_LEN)

            layer = 1
            k_read, v_read = pool.seq_read(seq, layer, 0, SEQ_LEN)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            out, lse = decoder.decode(pool, [seq], q, N_Q_HEADS, layer=layer, plans=[plan], return_lse=True)
            self.assertEqual(len(out), N_Q_HEADS * HEAD_DIM)
            self.assertTrue(all(math.isfinite(x) for x in lse))
            self.assertGreater(decoder.last_bytes_read(), 0)
            # The same step at the other layer reuses the page lists; the counts are exact.
            decoder.decode(pool, [seq], q, N_Q_HEADS, layer=0, plans=[plan])
            stats = decoder.stats()
            self.assertEqual((stats["steps"], stats["lists_built"], stats["lists_reused"]), (2, 1, 1))
            self.assertEqual(stats["last_bytes_read"], decoder.last_bytes_read())

            tokens = sorted({t for p in plan.pages() for t in range(p.token_begin, p.token_end)})
            self.assertEqual(len(tokens), summary["tokens_selected"])
            for h in range(N_KV_HEADS):  # what the step read: the plan's tokens, as maximal runs
                runs = decoder.last_selection(0, h)
                self.assertEqual([t for b, e in runs for t in range(b, e)], tokens)
            # An adaptive selection inside the plan reads a subset of it, within its limits.
            decoder.decode(pool, [seq], q, N_Q_HEADS, layer=layer, plans=[plan], topk_mass=0.5,
                           topk_min_tokens=32, topk_token_budget=summary["tokens_selected"],
                           topk_score=ikv.TopkScore.HYBRID)
            picked = [t for b, e in decoder.last_selection(0, 0) for t in range(b, e)]
            mandatory = {t for p in plan.pages() if p.flags & 1 for t in range(p.token_begin, p.token_end)}
            self.assertTrue(mandatory <= set(picked) <= set(tokens))
            # Hybrid candidates ranked again by their keys: within the plan and the budget, and the
            # candidates' keys count as bytes read beyond a hybrid step's.
            budget = len(mandatory) + 64
            decoder.decode(pool, [seq], q, N_Q_HEADS, layer=layer, plans=[plan], topk_token_budget=budget,
                           topk_score=ikv.TopkScore.HYBRID)
            hybrid_bytes = decoder.last_bytes_read()
            decoder.decode(pool, [seq], q, N_Q_HEADS, layer=layer, plans=[plan], topk_token_budget=budget,
                           topk_score=ikv.TopkScore.KEYS)
            for h in range(N_KV_HEADS):
                picked = [t for b, e in decoder.last_selection(0, h) for t in range(b, e)]
                self.assertTrue(mandatory <= set(picked) <= set(tokens))
                self.assertLessEqual(len(picked), budget)
            self.assertGreater(decoder.last_bytes_read(), hybrid_bytes)
            ref = reference_attention(q, k_read, v_read, tokens, N_Q_HEADS, N_KV_HEADS, HEAD_DIM)
            num = math.sqrt(sum((a - b) ** 2 for a, b in zip(out, ref)))
            den = math.sqrt(sum(b * b for b in ref))
            # The plan stores some pages as INT8: on AVX512-VNNI CPUs their values are summed with
            # int16 weights (docs/FORMATS.md), test_decode's 2e-4 bound (measured 6.6e-6 here; 5e-7 in fp32).
            self.assertLess(num / den, 2e-4)

    def test_dense_decode_of_exact_f32_pool_matches_inputs(self):
        rng = random.Random(3)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20,
                      default_format=ikv.Format.F16) as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            n_tokens = 20
            k, v = random_f32(rng, n_tokens * 64), random_f32(rng, n_tokens * 64)
            pool.append(seq, k, v, layer=0)
            k_read, v_read = pool.read(seq, 0, 0, n_tokens)
            for a, b in zip(k_read, k):  # F16 storage: half rounding of values in [-1, 1]
                self.assertLessEqual(abs(a - b), 2.0 ** -11)
            q = random_f32(rng, 2 * 64)
            out = decoder.decode(pool, seq, q, n_q_heads=2)
            ref = reference_attention(q, k_read, v_read, range(n_tokens), 2, 1, 64)
            err = max(abs(a - b) for a, b in zip(out, ref)) / max(abs(b) for b in ref)
            self.assertLess(err, 1e-5)


class QueryMemoryTest(unittest.TestCase):
    def test_memory_of_an_earlier_turn_joins_the_selection(self):
        for turns in (4, 0):  # the default (turns kept apart), and one decayed mean
            with self.subTest(turns=turns):
                self._earlier_turn_joins_the_selection(turns)

    def test_turns_argument(self):
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=32, page_size=16, capacity_bytes=1 << 20) as pool:
            for turns in (0, 1, 4, 64):
                ikv.QueryMemory(pool, n_q_heads=2, turns=turns).close()
            with self.assertRaises(ikv.IntentKVError) as ctx:
                ikv.QueryMemory(pool, n_q_heads=2, turns=65)
            self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID")
            self.assertIn("turns", ctx.exception.message)
            with self.assertRaises(ikv.InvalidArgumentError) as ctx:  # checked in Python: c_uint32 would wrap
                ikv.QueryMemory(pool, n_q_heads=2, turns=-1)
            self.assertIn("turns", ctx.exception.message)
            # A caller built with the first header (struct_size 12) gets turns = 0; its turns field is not read.
            config = _ffi.lib().ikv_query_memory_default_config_v2()
            config.n_q_heads, config.turns = 2, 65
            config.struct_size = _ffi.QueryMemoryConfig.turns.offset
            memory = ctypes.c_void_p()
            self.assertEqual(_ffi.lib().ikv_query_memory_create(pool.handle, ctypes.byref(config),
                                                                ctypes.byref(memory)), 0)
            _ffi.lib().ikv_query_memory_destroy(memory)

    def _earlier_turn_joins_the_selection(self, turns):
        rng = random.Random(5)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=32, page_size=16, capacity_bytes=8 << 20) as pool, \
                ikv.Decoder(n_threads=1) as decoder, \
                ikv.QueryMemory(pool, n_q_heads=2, decay=0.5, turns=turns) as memory:
            seq = pool.seq_create()
            n_tokens = 256
            k, v = random_f32(rng, n_tokens * 32), random_f32(rng, n_tokens * 32)
            pool.append(seq, k, v, layer=0)
            q_now = random_f32(rng, 2 * 32)
            # Nothing remembered: the memory changes nothing.
            decoder.decode(pool, seq, q_now, 2, topk_token_budget=64)
            alone = decoder.last_selection(0, 0)
            decoder.decode(pool, seq, q_now, 2, topk_token_budget=64, query_memory=memory)
            self.assertEqual(decoder.last_selection(0, 0), alone)
            self.assertFalse(set(range(48, 64)) <= {t for b, e in alone for t in range(b, e)})
            # An earlier turn's query that points at page 3's keys: page 3 is read now too.
            q_then = array.array("f", [0.0] * (2 * 32))
            for h in range(2):
                for d in range(32):
                    q_then[h * 32 + d] = 40.0 * k[(3 * 16) * 32 + d]
            memory.remember(seq, 0, q_then)
            memory.end_turn(seq)
            decoder.decode(pool, seq, q_now, 2, topk_token_budget=64, query_memory=memory)
            tokens = {t for b, e in decoder.last_selection(0, 0) for t in range(b, e)}
            self.assertTrue(set(range(48, 64)) <= tokens)
            with self.assertRaises(ikv.IntentKVError) as cm:
                memory.remember(seq, 1, q_then)
            self.assertEqual(cm.exception.status_name, "IKV_E_RANGE")
            with self.assertRaises(ikv.IntentKVError):
                memory.remember(seq, 0, q_then[:33])
            memory.forget(seq)
            memory.reset()


class PoolBoundHandlesTest(unittest.TestCase):
    """The pool must outlive its query memories and feedbacks (the header): closing the pool closes
    them first, and a decode refuses one made for another pool."""

    def test_closing_the_pool_closes_them(self):
        pool = ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=32, page_size=16, capacity_bytes=1 << 20)
        memory, feedback = ikv.QueryMemory(pool, n_q_heads=2), ikv.PageFeedback(pool)
        pool.close()
        for obj, call in ((memory, lambda: memory.end_turn(0)), (feedback, lambda: feedback.get(0, 0, 0))):
            with self.assertRaises(ikv.IntentKVError) as ctx:
                call()
            self.assertEqual(ctx.exception.status_name, "IKV_E_STATE")
            obj.close()  # closing again is harmless

    def test_decode_refuses_another_pools(self):
        rng = random.Random(3)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=32, page_size=16, capacity_bytes=1 << 20) as a, \
                ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=32, page_size=16, capacity_bytes=1 << 20) as b, \
                ikv.Decoder(n_threads=1) as decoder, ikv.QueryMemory(a, n_q_heads=2) as memory, \
                ikv.PageFeedback(a) as feedback:
            seq = b.seq_create()
            b.append(seq, random_f32(rng, 16 * 32), random_f32(rng, 16 * 32), layer=0)
            q = random_f32(rng, 2 * 32)
            for kwargs in ({"query_memory": memory, "topk_token_budget": 16}, {"feedback": feedback}):
                with self.assertRaises(ikv.InvalidArgumentError) as ctx:
                    decoder.decode(b, seq, q, 2, **kwargs)
                self.assertIn("another pool", ctx.exception.message)


class PageFeedbackTest(unittest.TestCase):
    def test_shares_of_a_dense_step_sum_to_one(self):
        rng = random.Random(8)
        with ikv.Pool(n_layers=1, n_kv_heads=2, head_dim=32, page_size=16, capacity_bytes=8 << 20) as pool, \
                ikv.Decoder(n_threads=1) as decoder, ikv.PageFeedback(pool, rate=1.0) as feedback, \
                ikv.Layout() as layout:
            seq = pool.seq_create()
            k, v = random_f32(rng, 100 * 2 * 32), random_f32(rng, 100 * 2 * 32)
            pool.append(seq, k, v, layer=0)
            decoder.decode(pool, seq, random_f32(rng, 4 * 32), 4, feedback=feedback)
            for h in range(2):  # rate 1: the averages are the step's shares, which cover the whole softmax
                shares = feedback.get(seq, 0, h)
                self.assertEqual(len(shares), 7)
                self.assertAlmostEqual(sum(shares), 1.0, places=5)
            layout.add("early", 0, 50, score=0.5)
            layout.add("late", 50, 100, score=0.5)
            feedback.block_scores(seq, layout)
            self.assertAlmostEqual(max(b.score for b in layout), 1.0, places=6)
            feedback.forget(seq)
            self.assertEqual(feedback.get(seq, 0, 0), [])


class LayoutTest(unittest.TestCase):
    def test_add_update_remove_iterate_find(self):
        with ikv.Layout() as layout:
            sys_id = layout.add("system", 0, 100, kind=ikv.Kind.SYSTEM_PROMPT, policy=ikv.Policy.ALWAYS, score=1.0)
            doc_id = layout.add("doc", 200, 300, kind=ikv.Kind.RETRIEVED_DOC, score=0.7)
            self.assertEqual(len(layout), 2)
            self.assertEqual([b.name for b in layout], ["system", "doc"])
            self.assertEqual(layout.find_token(250), doc_id)
            layout.update(doc_id, start=150, score=0.25)
            block = layout.get(doc_id)
            self.assertEqual((block.start, block.end), (150, 300))
            self.assertAlmostEqual(block.score, 0.25, places=6)
            layout.set_score(doc_id, 0.9)
            self.assertAlmostEqual(layout[-1].score, 0.9, places=6)
            with layout.clone() as copy:
                copy.remove(sys_id)
                self.assertEqual(len(copy), 1)
            self.assertEqual(len(layout), 2)
            layout.remove(sys_id)
            self.assertEqual([b.id for b in layout], [doc_id])

    def test_synth_layout_tiles_the_sequence(self):
        with ikv.Layout.synth(seq_len=2048, seed=5) as layout:
            blocks = list(layout)
            self.assertEqual(blocks[0].start, 0)
            self.assertEqual(blocks[-1].end, 2048)
            for a, b in zip(blocks, blocks[1:]):
                self.assertEqual(a.end, b.start)


class PlanTest(unittest.TestCase):
    def test_decisions_cost_prefetch_and_ranges(self):
        with ikv.Layout.synth(seq_len=4096) as layout, ikv.Router(page_size=16) as router, \
                router.route(layout, 4096) as plan:
            decisions = plan.decisions()
            self.assertEqual(sum(d.end - d.start for d in decisions), 4096)
            self.assertEqual(sum(d.tokens_selected for d in decisions), plan.summary()["tokens_selected"])
            cost = plan.cost(n_layers=4)
            self.assertEqual(cost["bytes_total"], sum(cost["bytes_by_format"]))
            self.assertLessEqual(cost["flops"], cost["flops_dense"])
            pages = {p.page for p in plan.pages()}
            self.assertFalse(pages & set(plan.skipped_pages()))
            self.assertFalse(pages & set(plan.prefetch()))
            self.assertIsInstance(plan.page_format(0), ikv.Format)
        with ikv.Plan.from_ranges([(0, 10), (40, 48)], 64, page_size=16, format=ikv.Format.INT8) as plan:
            self.assertEqual([(p.page, p.token_begin, p.token_end) for p in plan.pages()],
                             [(0, 0, 10), (2, 40, 48)])
            self.assertEqual(plan.page_format(0), ikv.Format.INT8)

    def test_router_config_and_pressure(self):
        with ikv.Router(page_size=32, token_budget=1000, precision={"attend_mid": ikv.Format.INT4}) as router:
            router.set_pressure(0.6)
            config = router.config
            self.assertEqual(config["page_size"], 32)
            self.assertEqual(config["token_budget"], 1000)
            self.assertAlmostEqual(config["memory_pressure"], 0.6, places=6)
            self.assertEqual(config["precision"]["attend_mid"], ikv.Format.INT4)


class PoolTest(unittest.TestCase):
    def test_reserve(self):
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20) as pool:
            seq = pool.seq_create()
            data = array.array("f", [0.01 * i for i in range(5 * 64)])
            pool.append(seq, data, data, layer=0)
            pool.reserve([seq], 20)  # up to 25 tokens: 4 pages, allocated now
            self.assertEqual(pool.stats()["pages_used"], 4)
            self.assertEqual(pool.seq_length(seq), 5)
            pool.reserve([seq], 0)
            self.assertEqual(pool.stats()["pages_used"], 1)
            with self.assertRaises(ikv.IntentKVError):
                pool.reserve([seq, seq], 4)

    def test_fork_truncate_evict_formats(self):
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20) as pool:
            seq = pool.seq_create()
            data = array.array("f", [0.01 * i for i in range(40 * 64)])
            pool.append(seq, data, data, layer=0)
            child = pool.fork(seq)
            self.assertEqual(pool.seq_length(child), 40)
            pool.truncate(child, 5)
            self.assertEqual((pool.seq_length(child), pool.seq_length(seq)), (35, 40))
            pool.evict(seq, 0, 16)
            self.assertTrue(pool.is_evicted(seq, 3))
            self.assertFalse(pool.is_evicted(seq, 20))
            self.assertFalse(pool.is_evicted(child, 3))
            with self.assertRaises(ikv.IntentKVError) as ctx:
                pool.set_page_format(seq, 2, ikv.Format.INT8)  # page 2 is still shared with the fork
            self.assertEqual(ctx.exception.status_name, "IKV_E_SHARED")
            pool.seq_destroy(child)
            pool.set_page_format(seq, 2, ikv.Format.INT8)
            self.assertEqual(pool.page_format(seq, 2), ikv.Format.INT8)
            stats = pool.stats()
            self.assertEqual(stats["n_sequences"], 1)
            self.assertEqual(stats["tokens_total"], 40)
            self.assertGreater(pool.page_bytes(ikv.Format.F16), pool.page_bytes(ikv.Format.INT4))


    def test_append_batch_equals_one_append_per_sequence(self):
        cfg = dict(n_layers=2, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20,
                   default_format=ikv.Format.INT8)
        with ikv.Pool(**cfg) as batched, ikv.Pool(**cfg) as single:
            seqs = [batched.seq_create() for _ in range(3)]
            ones = [single.seq_create() for _ in range(3)]
            row, n = 64, 5
            # [layer][seq][token][head][dim], every value distinct
            data = array.array("f", [0.001 * i - 1.0 for i in range(2 * 3 * n * row)])
            self.assertEqual(batched.append_batch(seqs, data, data), n)
            for i, seq in enumerate(ones):
                part = array.array("f")
                for layer in range(2):
                    start = (layer * 3 + i) * n * row
                    part.extend(data[start:start + n * row])
                single.append(seq, part, part)
            one_layer = array.array("f", [0.5 - 0.002 * i for i in range(3 * row)])
            batched.append_batch(seqs, one_layer, one_layer, layer=1)
            for i, seq in enumerate(ones):
                single.append(seq, one_layer[i * row:(i + 1) * row], one_layer[i * row:(i + 1) * row], layer=1)
            for a, b in zip(seqs, ones):
                for layer in range(2):
                    length = n + (layer == 1)
                    self.assertEqual(bytes(batched.read(a, layer, 0, length)[0]),
                                     bytes(single.read(b, layer, 0, length)[0]))
                    self.assertEqual(bytes(batched.read(a, layer, 0, length)[1]),
                                     bytes(single.read(b, layer, 0, length)[1]))
            batched.sync()  # a CPU pool has nothing pending
            with self.assertRaises(ikv.IntentKVError) as ctx:
                batched.append_batch([seqs[0], seqs[0]], one_layer[:2 * row], one_layer[:2 * row], layer=0)
            self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID")
            self.assertIn("listed twice", ctx.exception.message)

    def test_decode_with_append_equals_append_then_decode(self):
        cfg = dict(n_layers=2, n_kv_heads=2, head_dim=64, page_size=8, capacity_bytes=8 << 20,
                   default_format=ikv.Format.INT8)
        with ikv.Pool(**cfg) as fused, ikv.Pool(**cfg) as split, ikv.Decoder(1) as da, ikv.Decoder(1) as db:
            sa = [fused.seq_create() for _ in range(2)]
            sb = [split.seq_create() for _ in range(2)]
            row = 2 * 64
            for step in range(12):  # crosses a page boundary of both sequences
                for layer in range(2):
                    kv = array.array("f", [((step * 7 + layer * 3 + i) % 29) * 0.05 - 0.7 for i in range(2 * row)])
                    q = array.array("f", [((step + 5 * i) % 17) * 0.03 - 0.25 for i in range(2 * 4 * 64)])
                    out_a = da.decode(fused, sa, q, n_q_heads=4, layer=layer, append=(kv, kv))
                    split.append_batch(sb, kv, kv, layer=layer)
                    out_b = db.decode(split, sb, q, n_q_heads=4, layer=layer)
                    self.assertEqual(bytes(out_a), bytes(out_b))
            for a, b in zip(sa, sb):
                for layer in range(2):
                    self.assertEqual([bytes(x) for x in fused.read(a, layer, 0, 12)],
                                     [bytes(x) for x in split.read(b, layer, 0, 12)])
            self.assertEqual(da.stats()["appends_fused"], 0)  # a CPU decode appends, then decodes
            # Checked before anything is appended: a bad pair leaves the lengths as they were.
            with self.assertRaises(ikv.IntentKVError) as ctx:
                da.decode(fused, sa, q, n_q_heads=4, layer=0, append=(kv[:row], kv[:row]))
            self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID")
            self.assertEqual(fused.layer_length(sa[0], 0), 12)


class HostTierTest(unittest.TestCase):
    """The host tier (ikv_seq_offload / ikv_seq_fetch / ikv_seq_page_tier) as a CPU pool sees it."""

    def test_cpu_pool_refuses_a_host_tier(self):
        with self.assertRaises(ikv.IntentKVError) as ctx:
            ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=8 << 20, host_capacity_bytes=1 << 20)
        self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID")
        self.assertIn("host_capacity_bytes", ctx.exception.message)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=8 << 20, host_capacity_bytes=0) as pool:
            self.assertEqual(pool.config["host_capacity_bytes"], 0)

    def test_offload_fetch_unsupported_and_page_tier(self):
        with ikv.Pool(n_layers=2, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20) as pool:
            seq = pool.seq_create()
            data = array.array("f", [0.01 * i for i in range(2 * 20 * 64)])
            pool.append(seq, data, data)  # 20 tokens: pages 0, 1 full, page 2 partial
            before, stored = pool.stats(), [bytes(a) for a in pool.read(seq, 1, 0, 20)]
            for key in ("host_used_bytes", "host_pages", "bytes_offloaded", "bytes_fetched"):
                self.assertEqual(before[key], 0, key)
            for move in (pool.offload, pool.fetch):
                with self.assertRaises(ikv.IntentKVError) as ctx:
                    move(seq, 0, 20)
                self.assertEqual(ctx.exception.status_name, "IKV_E_UNSUPPORTED")
                self.assertIn("host tier", ctx.exception.message)
                with self.assertRaises(ikv.IntentKVError) as ctx:
                    move(seq, 0, 16, stream=0)  # 0: the default stream
                self.assertEqual(ctx.exception.status_name, "IKV_E_UNSUPPORTED")
                self.assertEqual(pool.stats(), before)
            for page in range(3):
                self.assertIs(pool.page_tier(seq, page), ikv.Tier.DEVICE)
                self.assertFalse(pool.page_tier(seq, page))
            with self.assertRaises(ikv.IntentKVError) as ctx:
                pool.page_tier(seq, 3)
            self.assertEqual(ctx.exception.status_name, "IKV_E_RANGE")
            with self.assertRaises(ikv.IntentKVError) as ctx:
                pool.page_tier(seq + 99, 0)
            self.assertEqual(ctx.exception.status_name, "IKV_E_NOT_FOUND")
            self.assertEqual(pool.stats(), before)
            self.assertEqual([bytes(a) for a in pool.read(seq, 1, 0, 20)], stored)

    def assertUnsupported(self, fn_name, call, *args, **kwargs):
        with self.assertRaises(ikv.IntentKVError) as ctx:
            call(*args, **kwargs)
        self.assertEqual(ctx.exception.status_name, "IKV_E_UNSUPPORTED")
        self.assertEqual(ctx.exception.status, _ffi.E_UNSUPPORTED)
        self.assertIn(fn_name, ctx.exception.message)
        self.assertIn("host tier", ctx.exception.message)

    def test_tier_policy_and_tier_step_on_a_cpu_pool(self):
        """ikv_pool_set_tier_policy / ikv_pool_tier_step: the policy's fields are checked first (IKV_E_INVALID
        naming the field), then the pool: a CPU pool has no host tier (IKV_E_UNSUPPORTED). Nothing changes."""
        with ikv.Pool(n_layers=2, n_kv_heads=1, head_dim=64, page_size=8, capacity_bytes=8 << 20) as pool, \
                ikv.Plan.from_ranges([(0, 8), (16, 20)], 20, page_size=8) as plan:
            seq = pool.seq_create()
            data = array.array("f", [0.01 * i for i in range(2 * 20 * 64)])
            pool.append(seq, data, data)
            before, stored = pool.stats(), [bytes(a) for a in pool.read(seq, 1, 0, 20)]
            self.assertEqual((before["host_page_reads"], before["host_reserved_bytes"]), (0, 0))
            for kwargs, field in (({"device_high": 1.5}, "device_high"), ({"device_high": -0.25}, "device_high"),
                                  ({"device_high": float("nan")}, "device_high"),
                                  ({"device_high": 0.5, "device_low": 0.75}, "device_low"),
                                  ({"device_low": -1.0}, "device_low"), ({"idle_steps": 3, "device_low": 2.0},
                                                                         "device_low")):
                with self.assertRaises(ikv.IntentKVError) as ctx:
                    pool.set_tier_policy(**kwargs)
                self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID", kwargs)
                self.assertNotIsInstance(ctx.exception, ikv.InvalidArgumentError)  # the library's check
                self.assertIn("ikv_pool_set_tier_policy: policy->" + field, ctx.exception.message)
            for kwargs in ({}, {"idle_steps": 4, "device_high": 0.8, "device_low": 0.5},
                           {"device_high": 1.0, "device_low": 1.0}, {"device_high": 0.5}, {"prefetch": False}):
                self.assertUnsupported("ikv_pool_set_tier_policy", pool.set_tier_policy, **kwargs)
            self.assertUnsupported("ikv_pool_set_tier_policy", pool.set_tier_policy, None)  # off
            # Checks made in Python before C: a negative idle_steps (no uint32), None with other fields.
            with self.assertRaises(ikv.InvalidArgumentError) as ctx:
                pool.set_tier_policy(-1)
            self.assertIn("idle_steps", ctx.exception.message)
            with self.assertRaises(ValueError):
                pool.set_tier_policy(None, device_high=0.5)
            # tier_step: one sequence, a list, plans (or None entries), no sequences, an unknown sequence (the
            # pool is checked before the sequences), an explicit stream.
            for args, kwargs in (((seq,), {}), (([seq],), {"plans": [plan]}), (([seq],), {"plans": [None]}),
                                 (([],), {}), (([],), {"plans": []}), (((),), {}), (([seq + 99],), {}),
                                 (([seq],), {"stream": 0})):
                self.assertUnsupported("ikv_pool_tier_step", pool.tier_step, *args, **kwargs)
            with self.assertRaises(ikv.InvalidArgumentError) as ctx:
                pool.tier_step([seq], plans=[plan, plan])
            self.assertIn("plans has 2 entries for 1 sequences", ctx.exception.message)
            # The raw calls: NULL arguments and struct sizes are refused before the pool's capability.
            lib = _ffi.lib()
            self.assertEqual(lib.ikv_pool_tier_step(pool.handle, None, None, 1, None, None), _ffi.E_NULL)
            self.assertIn("ikv_pool_tier_step", lib.ikv_last_error().decode())
            self.assertEqual(lib.ikv_pool_tier_step(None, None, None, 0, None, None), _ffi.E_NULL)
            small = _ffi.TierStepReport()
            small.struct_size = 16
            self.assertEqual(lib.ikv_pool_tier_step(pool.handle, None, None, 0, None, ctypes.byref(small)),
                             _ffi.E_INVALID)
            self.assertIn("struct_size", lib.ikv_last_error().decode())
            self.assertEqual(lib.ikv_pool_tier_step(pool.handle, None, None, 0, None, None), _ffi.E_UNSUPPORTED)
            policy = _ffi.TierPolicy()
            self.assertEqual(lib.ikv_pool_set_tier_policy(pool.handle, ctypes.byref(policy)), _ffi.E_INVALID)
            self.assertIn("struct_size", lib.ikv_last_error().decode())
            policy.struct_size = ctypes.sizeof(policy)
            policy.flags = 0x2
            self.assertEqual(lib.ikv_pool_set_tier_policy(pool.handle, ctypes.byref(policy)), _ffi.E_INVALID)
            self.assertIn("flags", lib.ikv_last_error().decode())
            policy.flags = ikv.IKV_TIER_NO_PREFETCH
            self.assertEqual(lib.ikv_pool_set_tier_policy(pool.handle, ctypes.byref(policy)), _ffi.E_UNSUPPORTED)
            self.assertEqual(lib.ikv_pool_set_tier_policy(None, None), _ffi.E_NULL)
            self.assertEqual(pool.stats(), before)
            self.assertEqual([bytes(a) for a in pool.read(seq, 1, 0, 20)], stored)
            for page in range(3):
                self.assertIs(pool.page_tier(seq, page), ikv.Tier.DEVICE)
        closed = ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=1 << 20)
        closed.close()
        for call in (closed.set_tier_policy, lambda: closed.tier_step([])):
            with self.assertRaises(ikv.IntentKVError) as ctx:
                call()
            self.assertEqual(ctx.exception.status_name, "IKV_E_STATE")

    def test_tier_step_report_fields(self):
        self.assertEqual(ikv.TierStepReport._fields, ("pages_fetched", "pages_offloaded", "pages_on_host", "step"))
        self.assertEqual([name for name, _ in _ffi.TierStepReport._fields_[1:]], list(ikv.TierStepReport._fields))


class ErrorTest(unittest.TestCase):
    def assertFails(self, status_name, substring, fn, *args, **kwargs):
        with self.assertRaises(ikv.IntentKVError) as ctx:
            fn(*args, **kwargs)
        self.assertEqual(ctx.exception.status_name, status_name)
        self.assertIn(substring, ctx.exception.message)
        self.assertIn(status_name, str(ctx.exception))
        return ctx.exception

    def test_layout_errors_leave_layout_unchanged(self):
        with ikv.Layout() as layout:
            first = layout.add("a", 0, 10)
            self.assertEqual(self.assertFails("IKV_E_OVERLAP", "ikv_layout_add", layout.add, "b", 5, 15).status,
                             _ffi.E_OVERLAP)
            self.assertFails("IKV_E_RANGE", "ikv_layout_add", layout.add, "b", 30, 20)
            self.assertFails("IKV_E_INVALID", "ikv_layout_add", layout.add, "b", 20, 30, score=1.5)
            self.assertFails("IKV_E_NOT_FOUND", "ikv_layout_find_token", layout.find_token, 12)
            self.assertFails("IKV_E_NOT_FOUND", "ikv_layout_remove", layout.remove, first + 100)
            self.assertEqual([(b.id, b.start, b.end) for b in layout], [(first, 0, 10)])
            self.assertFails("IKV_E_RANGE", "ikv_layout_validate", layout.validate, 5)

    def test_router_pool_decoder_errors(self):
        self.assertFails("IKV_E_INVALID", "page_size", ikv.Router, page_size=12)
        self.assertFails("IKV_E_INVALID", "head_dim", ikv.Pool, head_dim=65)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=8 << 20) as pool, \
                ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            pool.append(seq, array.array("f", [0.5] * 64), array.array("f", [0.5] * 64), layer=0)
            self.assertFails("IKV_E_RANGE", "ikv_seq_read", pool.read, seq, 0, 0, 2)
            self.assertFails("IKV_E_NOT_FOUND", "ikv_seq_length", pool.seq_length, seq + 99)
            bad = array.array("f", [float("nan")] * 64)
            self.assertFails("IKV_E_INVALID", "ikv_pool_append", pool.append, seq, bad, bad, layer=0)
            self.assertEqual(pool.seq_length(seq), 1)
            # two query tokens but only one stored token
            self.assertFails("IKV_E_INVALID", "ikv_decode", decoder.decode, pool, seq,
                             array.array("f", [0.0] * 2 * 64), n_q_heads=1, n_query_tokens=2)
            self.assertFails("IKV_E_INVALID", "holds", decoder.decode, pool, seq, array.array("f", [0.0] * 7), 1)
            self.assertFails("IKV_E_INVALID", "expected F32", pool.append, seq, array.array("d", [0.0] * 64),
                             array.array("d", [0.0] * 64), layer=0)

    def test_closed_handle_raises(self):
        layout = ikv.Layout()
        layout.close()
        layout.close()  # idempotent
        self.assertFails("IKV_E_STATE", "closed", len, layout)
        unclosed = ikv.Layout()
        unclosed.add("x", 0, 4)
        del unclosed
        gc.collect()  # __del__ frees it without error


class StructTest(unittest.TestCase):
    def test_default_struct_sizes_match_ctypes_mirrors(self):
        lib = _ffi.lib()
        pairs = [
            (lib.ikv_block_desc_default(), _ffi.BlockDesc),
            (lib.ikv_synth_default_config(), _ffi.SynthConfig),
            (lib.ikv_router_default_config(), _ffi.RouterConfig),
            (lib.ikv_model_shape_default(), _ffi.ModelShape),
            (lib.ikv_pool_default_config_v2(), _ffi.PoolConfig),
            (lib.ikv_decoder_default_config(), _ffi.DecoderConfig),
            (lib.ikv_decode_args_default_v3(), _ffi.DecodeArgs),
            (lib.ikv_query_memory_default_config_v2(), _ffi.QueryMemoryConfig),
            (lib.ikv_page_feedback_default_config(), _ffi.PageFeedbackConfig),
        ]
        for value, cls in pairs:
            self.assertEqual(value.struct_size, ctypes.sizeof(cls), cls.__name__)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=1 << 20) as pool:
            args = lib.ikv_append_default_v2(pool.handle, 3)
            self.assertEqual(args.struct_size, ctypes.sizeof(_ffi.Append))
            self.assertEqual((args.n_tokens, args.token_stride, args.head_stride, args.layer_stride), (3, 64, 64, 192))

    def test_versioned_pool_structs(self):
        # PoolConfig: 48 bytes through kv_dtype (the first layout), then host_capacity_bytes.
        self.assertEqual(_ffi.PoolConfig.host_capacity_bytes.offset, 48)
        self.assertEqual(ctypes.sizeof(_ffi.PoolConfig), 56)
        # The unversioned symbol still returns the first layout, for programs built with the first header.
        class PoolConfigV1(ctypes.Structure):
            _fields_ = _ffi.PoolConfig._fields_[:-1]
        v1 = ctypes.CFUNCTYPE(PoolConfigV1)(("ikv_pool_default_config", _ffi.lib()))()
        self.assertEqual(v1.struct_size, ctypes.sizeof(PoolConfigV1))
        self.assertEqual(v1.struct_size, 48)
        # QueryMemoryConfig: 12 bytes through decay (the first layout), then turns (default 4).
        self.assertEqual(_ffi.QueryMemoryConfig.turns.offset, 12)
        self.assertEqual(ctypes.sizeof(_ffi.QueryMemoryConfig), 16)
        qm = _ffi.lib().ikv_query_memory_default_config_v2()
        self.assertEqual((qm.struct_size, qm.n_q_heads, qm.decay, qm.turns), (16, 0, 0.5, 4))
        class QueryMemoryConfigV1(ctypes.Structure):
            _fields_ = _ffi.QueryMemoryConfig._fields_[:-1]
        qm1 = ctypes.CFUNCTYPE(QueryMemoryConfigV1)(("ikv_query_memory_default_config", _ffi.lib()))()
        self.assertEqual((qm1.struct_size, qm1.n_q_heads, qm1.decay), (12, 0, 0.5))
        # PoolStats: 144 bytes through tokens_total, then the four host-tier counters (176), then host_page_reads
        # and host_reserved_bytes.
        self.assertEqual(_ffi.PoolStats.host_used_bytes.offset, 144)
        self.assertEqual(_ffi.PoolStats.host_page_reads.offset, 176)
        self.assertEqual(_ffi.PoolStats.host_reserved_bytes.offset, 184)
        self.assertEqual(ctypes.sizeof(_ffi.PoolStats), 192)
        # The tier policy structs have no *_default(): sizes from the header's field lists.
        self.assertEqual(ctypes.sizeof(_ffi.TierPolicy), 4 * 5)
        self.assertEqual(ctypes.sizeof(_ffi.TierStepReport), 4 * 4 + 8)
        with ikv.Pool(n_layers=1, n_kv_heads=1, head_dim=64, capacity_bytes=1 << 20) as pool:
            # The library writes only the caller's struct_size bytes.
            old = _ffi.PoolStats()
            old.struct_size = _ffi.PoolStats.host_used_bytes.offset
            old.host_used_bytes = old.host_pages = old.bytes_offloaded = old.bytes_fetched = 12345
            self.assertEqual(_ffi.lib().ikv_pool_get_stats(pool.handle, ctypes.byref(old)), 0)
            self.assertEqual(old.capacity_bytes, 1 << 20)
            self.assertEqual((old.host_used_bytes, old.host_pages, old.bytes_offloaded, old.bytes_fetched),
                             (12345,) * 4)
            self.assertEqual(old.struct_size, 144)
            # A caller built with the header before host_page_reads gets the host-tier counters, not it.
            v2 = _ffi.PoolStats()
            v2.struct_size = _ffi.PoolStats.host_page_reads.offset
            v2.host_pages = v2.host_page_reads = 12345
            self.assertEqual(_ffi.lib().ikv_pool_get_stats(pool.handle, ctypes.byref(v2)), 0)
            self.assertEqual((v2.struct_size, v2.host_pages, v2.host_page_reads), (176, 0, 12345))
            self.assertEqual(pool.stats()["host_page_reads"], 0)

    def test_plain_structs_have_c_sizes(self):
        # Structs without struct_size: sizes follow from the header's field lists (no padding surprises).
        expected = {_ffi.BlockInfo: 4 + 64 + 4 * 7, _ffi.PlanPage: 16, _ffi.BlockDecision: 20,
                    _ffi.PlanSummary: 4 * 6 + 4 * 5 + 4 * 3, _ffi.PlanCost: 8 * 9, _ffi.TokenRange: 8,
                    _ffi.PrecisionPolicy: 40}
        for cls, size in expected.items():
            self.assertEqual(ctypes.sizeof(cls), size, cls.__name__)

    def test_runtime_info(self):
        info = ikv.runtime_info()
        self.assertEqual(info["version"], ikv.version())
        self.assertIn(info["cpu_isa"], ("avx512", "avx2", "neon", "scalar"))
        self.assertIn(info["cpu_isa"], info["cpu_isa_available"].split(","))
        self.assertEqual(ikv.version_string().count("."), 2)
        small = _ffi.RuntimeInfo()
        small.struct_size = 4
        status = _ffi.lib().ikv_runtime_info_get(ctypes.byref(small))
        self.assertEqual(_ffi.lib().ikv_status_name(status), b"IKV_E_INVALID")


if __name__ == "__main__":
    unittest.main()
