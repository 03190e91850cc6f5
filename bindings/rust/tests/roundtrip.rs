//! Route a synthetic layout, fill a pool, decode one step, and compare with a plain f64 attention
//! over the values read back; plus error paths and struct-size checks.

use intentkv::{ffi, Block, DecodeRequest, Decoder, Error, Layout, PageFeedback, Plan, Pool, QueryMemory,
               QueryMemoryConfig, Router, Tier, TierPolicy, TokenRange, IKV_TIER_NO_PREFETCH};

const SEQ_LEN: u32 = 1024;
const N_LAYERS: u32 = 2;
const N_KV_HEADS: usize = 2;
const N_Q_HEADS: usize = 4;
const HEAD_DIM: usize = 64;
const PAGE: u32 = 16;

/// Small deterministic generator (xorshift64*), uniform in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        (bits as f32 / (1u64 << 23) as f32) - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// softmax(q.k / sqrt(d)) v in f64 over `tokens`, per query head (GQA grouping as the header says).
fn reference(q: &[f32], k: &[f32], v: &[f32], tokens: &[u32], n_q: usize, n_kv: usize, d: usize) -> Vec<f64> {
    let group = n_q / n_kv;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(n_q * d);
    for h in 0..n_q {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        let row = |t: u32| (t as usize * n_kv + kvh) * d;
        let logits: Vec<f64> = tokens
            .iter()
            .map(|&t| scale * (0..d).map(|i| qh[i] as f64 * k[row(t) + i] as f64).sum::<f64>())
            .collect();
        let peak = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|x| (x - peak).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = vec![0f64; d];
        for (w, &t) in weights.iter().zip(tokens) {
            for i in 0..d {
                acc[i] += w * v[row(t) + i] as f64;
            }
        }
        out.extend(acc.iter().map(|a| a / total));
    }
    out
}

fn rel_error(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

#[test]
fn route_fill_decode_matches_f64_reference() {
    let mut synth = Layout::synth_default_config();
    synth.seq_len = SEQ_LEN;
    synth.n_documents = 4;
    synth.n_tool_outputs = 2;
    synth.n_turns = 3;
    synth.seed = 11;
    let layout = Layout::synth(&synth).unwrap();
    layout.validate(SEQ_LEN).unwrap();
    let mut rc = Router::default_config();
    rc.page_size = PAGE;
    rc.recent_window = 128;
    let router = Router::new(&rc).unwrap();
    let plan = router.route(&layout, SEQ_LEN).unwrap();
    let summary = plan.summary().unwrap();
    assert_eq!(summary.seq_len, SEQ_LEN);
    assert!(summary.tokens_selected > 0 && summary.tokens_skipped > 0);
    assert_eq!(summary.tokens_selected + summary.tokens_skipped, SEQ_LEN);

    let mut pc = Pool::default_config();
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = N_KV_HEADS as u32;
    pc.head_dim = HEAD_DIM as u32;
    pc.page_size = PAGE;
    pc.capacity_bytes = 64 << 20;
    let mut pool = Pool::new(&pc).unwrap();
    let seq = pool.seq_create().unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let n = (SEQ_LEN * N_LAYERS) as usize * N_KV_HEADS * HEAD_DIM;
    let (k, v) = (rng.vec(n), rng.vec(n));
    assert_eq!(pool.append(seq, &k, &v, None, Some(&plan)).unwrap(), SEQ_LEN);
    assert_eq!(pool.seq_length(seq).unwrap(), SEQ_LEN);

    let layer = 1;
    let (k_read, v_read) = pool.seq_read(seq, layer, 0, SEQ_LEN).unwrap();
    let q = rng.vec(N_Q_HEADS * HEAD_DIM);
    let seqs = [seq];
    let plans = [Some(&plan)];
    let mut req = DecodeRequest::new(&seqs, &q, N_Q_HEADS as u32);
    req.layer = layer;
    req.plans = &plans;
    let mut decoder = Decoder::new(1).unwrap();
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![0f32; N_Q_HEADS];
    decoder.decode_into(&pool, &req, &mut out, Some(&mut lse)).unwrap();
    assert!(lse.iter().all(|x| x.is_finite()));
    assert!(decoder.last_bytes_read().unwrap() > 0);
    let stats = decoder.stats().unwrap();
    assert_eq!((stats.steps, stats.lists_built, stats.lists_reused), (1, 1, 0));
    assert_eq!(stats.last_bytes_read, decoder.last_bytes_read().unwrap());

    let mut tokens: Vec<u32> = plan.pages().unwrap().iter().flat_map(|p| p.token_begin..p.token_end).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len() as u32, summary.tokens_selected);
    for h in 0..N_KV_HEADS as u32 {
        // What the step read: the plan's tokens, as maximal runs.
        let read: Vec<u32> = decoder.last_selection(0, h).unwrap().iter().flat_map(|r| r.begin..r.end).collect();
        assert_eq!(read, tokens);
    }
    let want = reference(&q, &k_read, &v_read, &tokens, N_Q_HEADS, N_KV_HEADS, HEAD_DIM);
    let err = rel_error(&out, &want);
    // The plan stores some pages as INT8: on AVX512-VNNI CPUs their values are summed with int16
    // weights (docs/FORMATS.md), test_decode's 2e-4 bound (fp32 sums stay near 5e-7).
    assert!(err < 2e-4, "relative error {err}");
}

#[test]
fn layout_edit_and_plan_queries() {
    let mut layout = Layout::new().unwrap();
    let mut system = Block::new("system", 0, 100);
    system.policy = ffi::IKV_POLICY_ALWAYS;
    let sys_id = layout.add(&system).unwrap();
    let doc_id = layout.add(&Block::new("doc", 200, 300)).unwrap();
    assert_eq!(layout.len(), 2);
    assert_eq!(layout.find_token(250).unwrap(), doc_id);
    let mut doc = layout.get(doc_id).unwrap().block;
    doc.start = 150;
    layout.update(doc_id, &doc).unwrap();
    layout.set_score(doc_id, 0.9).unwrap();
    let blocks = layout.blocks().unwrap();
    assert_eq!(blocks.iter().map(|b| (b.id, b.block.start)).collect::<Vec<_>>(), vec![(sys_id, 0), (doc_id, 150)]);
    assert_eq!(blocks[1].block.score, 0.9);
    let mut copy = layout.try_clone().unwrap();
    copy.remove(sys_id).unwrap();
    assert_eq!((copy.len(), layout.len()), (1, 2));

    let plan = Plan::from_ranges(&[TokenRange { begin: 0, end: 10 }, TokenRange { begin: 40, end: 48 }], 64, 16,
                                 ffi::IKV_FMT_INT8).unwrap();
    let pages: Vec<(u32, u32, u32)> = plan.pages().unwrap().iter().map(|p| (p.page, p.token_begin, p.token_end)).collect();
    assert_eq!(pages, vec![(0, 0, 10), (2, 40, 48)]);
    assert_eq!(plan.page_format(0).unwrap(), ffi::IKV_FMT_INT8);
    let mut shape = Plan::default_shape();
    shape.n_layers = 4;
    let cost = plan.cost(&shape).unwrap();
    assert_eq!(cost.bytes_total, cost.bytes_by_format.iter().sum::<u64>());
    assert!(cost.flops <= cost.flops_dense);
}

/// A one-head, head_dim-64, 8 MiB pool config of n_layers and page_size; the rest is the default.
fn small_config(n_layers: u32, page_size: u32) -> ffi::ikv_pool_config {
    let mut pc = Pool::default_config();
    pc.n_layers = n_layers;
    pc.n_kv_heads = 1;
    pc.head_dim = 64;
    pc.page_size = page_size;
    pc.capacity_bytes = 8 << 20;
    pc
}

#[test]
fn pool_reserve() {
    let pc = small_config(1, 8);
    let mut pool = Pool::new(&pc).unwrap();
    let seq = pool.seq_create().unwrap();
    let data: Vec<f32> = (0..5 * 64).map(|i| 0.01 * i as f32).collect();
    pool.append(seq, &data, &data, Some(0), None).unwrap();
    pool.reserve(&[seq], 20).unwrap(); // up to 25 tokens: 4 pages, allocated now
    assert_eq!(pool.stats().unwrap().pages_used, 4);
    assert_eq!(pool.seq_length(seq).unwrap(), 5);
    pool.reserve(&[seq], 0).unwrap();
    assert_eq!(pool.stats().unwrap().pages_used, 1);
    assert_eq!(pool.reserve(&[seq, seq], 4).unwrap_err().status_name(), "IKV_E_INVALID");
}

#[test]
fn pool_fork_truncate_evict() {
    let pc = small_config(1, 8);
    let mut pool = Pool::new(&pc).unwrap();
    let seq = pool.seq_create().unwrap();
    let data: Vec<f32> = (0..40 * 64).map(|i| 0.01 * i as f32).collect();
    pool.append(seq, &data, &data, Some(0), None).unwrap();
    let child = pool.fork(seq).unwrap();
    pool.truncate(child, 5).unwrap();
    assert_eq!((pool.seq_length(child).unwrap(), pool.seq_length(seq).unwrap()), (35, 40));
    pool.evict(seq, 0, 16).unwrap();
    assert!(pool.is_evicted(seq, 3).unwrap());
    assert!(!pool.is_evicted(child, 3).unwrap());
    let err = pool.set_page_format(seq, 2, ffi::IKV_FMT_INT8).unwrap_err();
    assert_eq!(err.status_name(), "IKV_E_SHARED");
    pool.seq_destroy(child).unwrap();
    pool.set_page_format(seq, 2, ffi::IKV_FMT_INT8).unwrap();
    assert_eq!(pool.page_format(seq, 2).unwrap(), ffi::IKV_FMT_INT8);
    let stats = pool.stats().unwrap();
    assert_eq!((stats.n_sequences, stats.tokens_total), (1, 40));
}

#[test]
fn append_batch_equals_one_append_per_sequence() {
    let mut pc = small_config(2, 8);
    pc.default_format = ffi::IKV_FMT_INT8;
    let mut batched = Pool::new(&pc).unwrap();
    let mut single = Pool::new(&pc).unwrap();
    let seqs: Vec<_> = (0..3).map(|_| batched.seq_create().unwrap()).collect();
    let ones: Vec<_> = (0..3).map(|_| single.seq_create().unwrap()).collect();
    let (row, n) = (64usize, 5usize);
    // [layer][seq][token][head][dim]
    let data: Vec<f32> = (0..2 * 3 * n * row).map(|i| 0.001 * i as f32 - 1.0).collect();
    assert_eq!(batched.append_batch(&seqs, &data, &data, None, None).unwrap(), n as u32);
    for (i, &seq) in ones.iter().enumerate() {
        let part: Vec<f32> = (0..2).flat_map(|l| data[(l * 3 + i) * n * row..(l * 3 + i + 1) * n * row].to_vec()).collect();
        single.append(seq, &part, &part, None, None).unwrap();
    }
    for (&a, &b) in seqs.iter().zip(ones.iter()) {
        for layer in 0..2 {
            assert_eq!(batched.seq_read(a, layer, 0, n as u32).unwrap(), single.seq_read(b, layer, 0, n as u32).unwrap());
        }
    }
    batched.sync().unwrap();
    let err = batched.append_batch(&[seqs[0], seqs[0]], &data[..2 * row], &data[..2 * row], Some(0), None).unwrap_err();
    assert_eq!(err.status_name(), "IKV_E_INVALID");
    assert!(err.message.contains("listed twice"), "{err}");
}

#[test]
fn cpu_pool_refuses_a_host_tier() {
    let mut pc = small_config(1, 8);
    pc.host_capacity_bytes = 1 << 20;
    let err = expect_err(Pool::new(&pc), ffi::IKV_E_INVALID, "host_capacity_bytes");
    assert_eq!(err.status_name(), "IKV_E_INVALID");
    assert_eq!(Pool::default_config().host_capacity_bytes, 0);
    pc.host_capacity_bytes = 0;
    assert_eq!(Pool::new(&pc).unwrap().config().host_capacity_bytes, 0);
}

#[test]
fn offload_fetch_unsupported_on_cpu_and_page_tier() {
    let mut pool = Pool::new(&small_config(2, 8)).unwrap();
    let seq = pool.seq_create().unwrap();
    let data: Vec<f32> = (0..2 * 20 * 64).map(|i| 0.01 * i as f32).collect();
    pool.append(seq, &data, &data, None, None).unwrap(); // 20 tokens: pages 0, 1 full, page 2 partial
    let before = pool.stats().unwrap();
    assert_eq!((before.host_used_bytes, before.host_pages, before.bytes_offloaded, before.bytes_fetched), (0, 0, 0, 0));
    let stored = pool.seq_read(seq, 1, 0, 20).unwrap();
    expect_err(pool.offload(seq, 0, 20), ffi::IKV_E_UNSUPPORTED, "host tier");
    expect_err(pool.fetch(seq, 0, 16), ffi::IKV_E_UNSUPPORTED, "host tier");
    assert_eq!(pool.stats().unwrap(), before);
    for page in 0..3 {
        assert_eq!(pool.page_tier(seq, page).unwrap(), Tier::Device);
    }
    expect_err(pool.page_tier(seq, 3), ffi::IKV_E_RANGE, "ikv_seq_page_tier");
    expect_err(pool.page_tier(seq + 99, 0), ffi::IKV_E_NOT_FOUND, "");
    assert_eq!(pool.stats().unwrap(), before);
    assert_eq!(pool.seq_read(seq, 1, 0, 20).unwrap(), stored);
}

#[test]
fn tier_policy_and_tier_step_unsupported_on_cpu() {
    let mut pool = Pool::new(&small_config(2, 8)).unwrap();
    let seq = pool.seq_create().unwrap();
    let data: Vec<f32> = (0..2 * 20 * 64).map(|i| 0.01 * i as f32).collect();
    pool.append(seq, &data, &data, None, None).unwrap(); // 20 tokens: pages 0, 1 full, page 2 partial
    let before = pool.stats().unwrap();
    assert_eq!((before.host_page_reads, before.host_reserved_bytes), (0, 0));
    let stored = pool.seq_read(seq, 1, 0, 20).unwrap();

    // The policy's fields are checked before the pool: IKV_E_INVALID naming the field.
    let default = Pool::default_tier_policy();
    assert_eq!(default, TierPolicy { struct_size: 20, idle_steps: 0, device_high: 0.0, device_low: 0.0, flags: 0 });
    let bad = [
        (TierPolicy { device_high: 1.5, ..default }, "policy->device_high"),
        (TierPolicy { device_high: -0.25, ..default }, "policy->device_high"),
        (TierPolicy { device_high: f32::NAN, ..default }, "policy->device_high"),
        (TierPolicy { device_high: 0.5, device_low: 0.75, ..default }, "policy->device_low"),
        (TierPolicy { device_low: -1.0, ..default }, "policy->device_low"),
        (TierPolicy { flags: 0x2, ..default }, "policy->flags"),
        (TierPolicy { struct_size: 4, ..default }, "struct_size"),
        (TierPolicy::default(), "struct_size"), // Default is all zero: struct_size unset
    ];
    for (policy, field) in &bad {
        let err = expect_err(pool.set_tier_policy(Some(policy)), ffi::IKV_E_INVALID, field);
        assert!(err.message.contains("ikv_pool_set_tier_policy"), "{err}");
    }
    // Valid policies, and turning the policy off: a CPU pool has no host tier.
    let good = [
        default,
        TierPolicy { idle_steps: 4, device_high: 0.8, device_low: 0.5, ..default },
        TierPolicy { device_high: 1.0, device_low: 1.0, ..default },
        TierPolicy { device_high: 0.5, ..default },
        TierPolicy { flags: IKV_TIER_NO_PREFETCH, ..default },
    ];
    for policy in &good {
        let err = expect_err(pool.set_tier_policy(Some(policy)), ffi::IKV_E_UNSUPPORTED, "host tier");
        assert!(err.message.contains("ikv_pool_set_tier_policy"), "{err}");
    }
    expect_err(pool.set_tier_policy(None), ffi::IKV_E_UNSUPPORTED, "host tier");

    // tier_step: with or without plans, no sequences, an unknown sequence (the pool is checked first).
    let plan = Plan::from_ranges(&[TokenRange { begin: 0, end: 8 }, TokenRange { begin: 16, end: 20 }], 20, 8,
                                 ffi::IKV_FMT_F16).unwrap();
    for (seqs, plans) in [(vec![seq], vec![]), (vec![seq], vec![Some(&plan)]), (vec![seq], vec![None]),
                          (vec![], vec![]), (vec![seq + 99], vec![])] {
        let err = expect_err(pool.tier_step(&seqs, &plans), ffi::IKV_E_UNSUPPORTED, "host tier");
        assert!(err.message.contains("ikv_pool_tier_step"), "{err}");
    }
    expect_err(pool.tier_step(&[seq], &[Some(&plan), None]), ffi::IKV_E_INVALID, "2 plans for 1 sequences");
    // The raw call: NULL seqs for n_seqs > 0 and a short report are refused before the pool's capability.
    let raw = pool.as_ptr() as *mut ffi::ikv_pool;
    assert_eq!(unsafe { ffi::ikv_pool_tier_step(raw, std::ptr::null(), std::ptr::null(), 1, std::ptr::null_mut(),
                                                std::ptr::null_mut()) }, ffi::IKV_E_NULL);
    let mut short = ffi::ikv_tier_step_report { struct_size: 16, ..Default::default() };
    assert_eq!(unsafe { ffi::ikv_pool_tier_step(raw, std::ptr::null(), std::ptr::null(), 0, std::ptr::null_mut(),
                                                &mut short) }, ffi::IKV_E_INVALID);
    assert_eq!(short, ffi::ikv_tier_step_report { struct_size: 16, ..Default::default() });

    assert_eq!(pool.stats().unwrap(), before);
    assert_eq!(pool.seq_read(seq, 1, 0, 20).unwrap(), stored);
    for page in 0..3 {
        assert_eq!(pool.page_tier(seq, page).unwrap(), Tier::Device);
    }
}

fn expect_err<T: std::fmt::Debug>(result: intentkv::Result<T>, status: i32, substring: &str) -> Error {
    let err = result.unwrap_err();
    assert_eq!(err.status, status, "{err}");
    assert!(err.message.contains(substring), "{err} lacks {substring:?}");
    err
}

#[test]
fn errors_carry_status_and_message_and_change_nothing() {
    let mut layout = Layout::new().unwrap();
    let first = layout.add(&Block::new("a", 0, 10)).unwrap();
    let err = expect_err(layout.add(&Block::new("b", 5, 15)), ffi::IKV_E_OVERLAP, "ikv_layout_add");
    assert_eq!(err.status_name(), "IKV_E_OVERLAP");
    assert!(err.to_string().starts_with("IKV_E_OVERLAP: "));
    expect_err(layout.add(&Block::new("b", 30, 20)), ffi::IKV_E_RANGE, "ikv_layout_add");
    expect_err(layout.find_token(12), ffi::IKV_E_NOT_FOUND, "ikv_layout_find_token");
    expect_err(layout.add(&Block::new("nul\0name", 20, 30)), ffi::IKV_E_INVALID, "NUL");
    assert_eq!(layout.blocks().unwrap().iter().map(|b| (b.id, b.block.start, b.block.end)).collect::<Vec<_>>(),
               vec![(first, 0, 10)]);

    let mut rc = Router::default_config();
    rc.page_size = 12;
    expect_err(Router::new(&rc), ffi::IKV_E_INVALID, "page_size");

    let pc = small_config(1, Pool::default_config().page_size);
    let mut pool = Pool::new(&pc).unwrap();
    let seq = pool.seq_create().unwrap();
    pool.append(seq, &[0.5; 64], &[0.5; 64], Some(0), None).unwrap();
    expect_err(pool.seq_read(seq, 0, 0, 2), ffi::IKV_E_RANGE, "ikv_seq_read");
    expect_err(pool.append(seq, &[f32::NAN; 64], &[0.0; 64], Some(0), None), ffi::IKV_E_INVALID, "ikv_pool_append");
    expect_err(pool.append(seq, &[0.0; 63], &[0.0; 63], Some(0), None), ffi::IKV_E_INVALID, "multiple of 64");
    assert_eq!(pool.seq_length(seq).unwrap(), 1);
    let mut decoder = Decoder::new(1).unwrap();
    let q = [0.0f32; 128];
    let seqs = [seq];
    let mut req = DecodeRequest::new(&seqs, &q, 1);
    req.n_query_tokens = 2; // two query tokens, one stored token
    expect_err(decoder.decode(&pool, &req), ffi::IKV_E_INVALID, "ikv_decode");
}

#[test]
fn struct_sizes_match_the_library() {
    use std::mem::size_of;
    unsafe {
        assert_eq!(ffi::ikv_block_desc_default().struct_size as usize, size_of::<ffi::ikv_block_desc>());
        assert_eq!(ffi::ikv_synth_default_config().struct_size as usize, size_of::<ffi::ikv_synth_config>());
        assert_eq!(ffi::ikv_router_default_config().struct_size as usize, size_of::<ffi::ikv_router_config>());
        assert_eq!(ffi::ikv_model_shape_default().struct_size as usize, size_of::<ffi::ikv_model_shape>());
        assert_eq!(ffi::ikv_pool_default_config().struct_size as usize, size_of::<ffi::ikv_pool_config>());
        assert_eq!(ffi::ikv_decoder_default_config().struct_size as usize, size_of::<ffi::ikv_decoder_config>());
        assert_eq!(ffi::ikv_decode_args_default().struct_size as usize, size_of::<ffi::ikv_decode_args>());
        assert_eq!(ffi::ikv_query_memory_default_config().struct_size as usize,
                   size_of::<ffi::ikv_query_memory_config>());
        assert_eq!(ffi::ikv_page_feedback_default_config().struct_size as usize,
                   size_of::<ffi::ikv_page_feedback_config>());
        assert_eq!(ffi::ikv_append_default(std::ptr::null(), 1).struct_size as usize, size_of::<ffi::ikv_append>());
    }
    // Filled structs: the library writes its own size (here all of the binding's) and says so.
    let stats = Decoder::new(1).unwrap().stats().unwrap();
    assert_eq!(stats.struct_size as usize, size_of::<ffi::ikv_decoder_stats>());
    assert_eq!(size_of::<ffi::ikv_decoder_stats>(), 48);
    assert_eq!(size_of::<ffi::ikv_block_info>(), 4 + 64 + 4 * 7);
    assert_eq!(size_of::<ffi::ikv_plan_page>(), 16);
    assert_eq!(size_of::<ffi::ikv_block_decision>(), 20);
    assert_eq!(size_of::<ffi::ikv_plan_summary>(), 56);
    assert_eq!(size_of::<ffi::ikv_plan_cost>(), 72);
    // Versioned pool structs: the first layouts end at kv_dtype (48) and tokens_total (144).
    let pc = Pool::default_config();
    let stats = ffi::ikv_pool_stats::default();
    let offset = |base: *const u8, field: *const u64| field as usize - base as usize;
    assert_eq!(offset(std::ptr::addr_of!(pc).cast(), std::ptr::addr_of!(pc.host_capacity_bytes)), 48);
    assert_eq!(size_of::<ffi::ikv_pool_config>(), 56);
    assert_eq!(offset(std::ptr::addr_of!(stats).cast(), std::ptr::addr_of!(stats.host_used_bytes)), 144);
    assert_eq!(offset(std::ptr::addr_of!(stats).cast(), std::ptr::addr_of!(stats.host_page_reads)), 176);
    assert_eq!(offset(std::ptr::addr_of!(stats).cast(), std::ptr::addr_of!(stats.host_reserved_bytes)), 184);
    assert_eq!(size_of::<ffi::ikv_pool_stats>(), 192);
    // ikv_query_memory_config: the first layout ends at decay (12), then turns.
    let qm = QueryMemory::default_config();
    assert_eq!(std::ptr::addr_of!(qm.turns) as usize - std::ptr::addr_of!(qm) as usize, 12);
    assert_eq!(size_of::<ffi::ikv_query_memory_config>(), 16);
    // The tier policy structs have no *_default(): sizes from the header's field lists.
    assert_eq!(size_of::<ffi::ikv_tier_policy>(), 4 * 5);
    assert_eq!(size_of::<ffi::ikv_tier_step_report>(), 4 * 4 + 8);
    assert_eq!(Pool::default_tier_policy().struct_size as usize, size_of::<ffi::ikv_tier_policy>());
    // The library writes only the caller's struct_size bytes.
    let pool = Pool::new(&small_config(1, 16)).unwrap();
    let mut old = ffi::ikv_pool_stats { struct_size: 144, host_used_bytes: 7, host_pages: 7, bytes_offloaded: 7,
                                        bytes_fetched: 7, ..Default::default() };
    assert_eq!(unsafe { ffi::ikv_pool_get_stats(pool.as_ptr(), &mut old) }, ffi::IKV_OK);
    assert_eq!(old.capacity_bytes, 8 << 20);
    assert_eq!((old.struct_size, old.host_used_bytes, old.host_pages, old.bytes_offloaded, old.bytes_fetched),
               (144, 7, 7, 7, 7));
    // A caller built with the header before host_page_reads gets the host-tier counters, not it.
    let mut v2 = ffi::ikv_pool_stats { struct_size: 176, host_pages: 7, host_page_reads: 7, ..Default::default() };
    assert_eq!(unsafe { ffi::ikv_pool_get_stats(pool.as_ptr(), &mut v2) }, ffi::IKV_OK);
    assert_eq!((v2.struct_size, v2.host_pages, v2.host_page_reads), (176, 0, 7));
    assert_eq!(pool.stats().unwrap().host_page_reads, 0);
    let info = intentkv::runtime_info().unwrap();
    assert_eq!(info.version, intentkv::version());
    assert!(["avx512", "avx2", "neon", "scalar"].contains(&info.cpu_isa.as_str()));
    assert!(info.cpu_isa_available.split(',').any(|isa| isa == info.cpu_isa));
    assert_eq!(intentkv::version_string().matches('.').count(), 2);
}

#[test]
fn query_memory_and_feedback() {
    let pc = small_config(1, 16);
    let mut pool = Pool::new(&pc).unwrap();
    let seq = pool.seq_create().unwrap();
    let mut rng = Rng(0x5EED);
    let k = rng.vec(256 * 64);
    pool.append(seq, &k, &k, Some(0), None).unwrap();
    let q = rng.vec(2 * 64);
    let seqs = [seq];
    let mut decoder = Decoder::new(1).unwrap();
    // A dense step fed back at rate 1: the averages are its shares, which cover the softmax.
    let feedback = PageFeedback::new(&pool, 1.0).unwrap();
    let mut req = DecodeRequest::new(&seqs, &q, 2);
    req.feedback = Some(&feedback);
    decoder.decode(&pool, &req).unwrap();
    let shares = feedback.get(seq, 0, 0).unwrap();
    assert_eq!(shares.len(), 16);
    assert!((shares.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    // A remembered query that points at page 3's keys puts page 3 in a 4-page top-k (it is not there alone).
    let mut alone = DecodeRequest::new(&seqs, &q, 2);
    alone.topk_token_budget = 64;
    decoder.decode(&pool, &alone).unwrap();
    let read: Vec<u32> = decoder.last_selection(0, 0).unwrap().iter().flat_map(|r| r.begin..r.end).collect();
    assert!(!(48..64).all(|t| read.contains(&t)));
    let mut memory = QueryMemory::new(&pool, 2, 0.5).unwrap();
    let then: Vec<f32> = (0..2 * 64).map(|i| 40.0 * k[3 * 16 * 64 + i % 64]).collect();
    memory.remember(seq, 0, &then).unwrap();
    memory.end_turn(seq).unwrap();
    let mut req = DecodeRequest::new(&seqs, &q, 2);
    req.topk_token_budget = 64;
    req.query_memory = Some(&memory);
    decoder.decode(&pool, &req).unwrap();
    let read: Vec<u32> = decoder.last_selection(0, 0).unwrap().iter().flat_map(|r| r.begin..r.end).collect();
    assert!((48..64).all(|t| read.contains(&t)));
    assert!(memory.remember(seq, 1, &then).is_err()); // layer out of range
    assert!(memory.remember(seq, 0, &then[..3]).is_err());
}

#[test]
fn query_memory_turns() {
    let pool = Pool::new(&small_config(1, 16)).unwrap();
    let default = QueryMemory::default_config();
    assert_eq!((default.struct_size, default.n_q_heads, default.decay, default.turns), (16, 0, 0.5, 4));
    for turns in [0, 1, 4, 64] {
        QueryMemory::with_config(&pool, &QueryMemoryConfig { n_q_heads: 2, turns, ..default }).unwrap();
    }
    QueryMemory::new(&pool, 2, 0.5).unwrap(); // turns 4
    expect_err(QueryMemory::with_config(&pool, &QueryMemoryConfig { n_q_heads: 2, turns: 65, ..default }),
               ffi::IKV_E_INVALID, "turns");
    expect_err(QueryMemory::with_config(&pool, &QueryMemoryConfig { n_q_heads: 0, ..default }),
               ffi::IKV_E_INVALID, "n_q_heads");
    // A caller built with the first header (struct_size 12) gets turns = 0: its turns field is not read.
    QueryMemory::with_config(&pool, &QueryMemoryConfig { struct_size: 12, n_q_heads: 2, turns: 65, ..default })
        .unwrap();
    // The unversioned symbol fills the first, 12-byte layout.
    #[repr(C)]
    struct ConfigV1 {
        struct_size: u32,
        n_q_heads: u32,
        decay: f32,
    }
    extern "C" {
        #[link_name = "ikv_query_memory_default_config"]
        fn ikv_query_memory_default_config_v1() -> ConfigV1;
    }
    let v1 = unsafe { ikv_query_memory_default_config_v1() };
    assert_eq!((v1.struct_size, v1.n_q_heads, v1.decay), (12, 0, 0.5));
}

/// An engine's loop: appends to the pool go on while a query memory and a feedback made for it live
/// (they share the pool's C object), and the pool may be dropped before them.
#[test]
fn appends_while_memory_and_feedback_live() {
    let mut config = Pool::default_config();
    config.n_layers = 1;
    config.n_kv_heads = 1;
    config.head_dim = 32;
    config.page_size = 16;
    config.capacity_bytes = 1 << 20;
    let mut pool = Pool::new(&config).unwrap();
    let seq = pool.seq_create().unwrap();
    let feedback = PageFeedback::new(&pool, 0.5).unwrap();
    let memory = QueryMemory::new(&pool, 2, 0.5).unwrap();
    let mut decoder = Decoder::new(1).unwrap();
    let mut rng = Rng(7);
    let seqs = [seq];
    for step in 0..20u32 {
        pool.append(seq, &rng.vec(32), &rng.vec(32), Some(0), None).unwrap();
        let q = rng.vec(2 * 32);
        let mut req = DecodeRequest::new(&seqs, &q, 2);
        req.feedback = Some(&feedback);
        req.query_memory = Some(&memory);
        decoder.decode(&pool, &req).unwrap();
        assert_eq!(pool.seq_length(seq).unwrap(), step + 1);
    }
    assert_eq!(feedback.get(seq, 0, 0).unwrap().len(), 2); // 20 tokens: pages 0 and 1 fed back
    drop(pool);
    assert_eq!(feedback.get(seq, 0, 0).unwrap().len(), 2); // the C pool lives on with them
}
