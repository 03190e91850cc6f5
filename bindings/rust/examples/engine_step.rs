//! An engine's decode loop in Rust (`cargo run --example engine_step`): a batch of sequences of
//! different lengths, each with its own routed plan; per step and per layer, one batch append of
//! the step's token followed by one decode of the whole batch through the plans and query-aware
//! top-k (hybrid score); a re-route at the turn boundary under higher memory pressure, with the
//! existing pages re-stored at the demoted precisions. The C template with every call of a real
//! engine (CUDA streams, asynchronous appends, forks) is `examples/engine_loop.c`.
use intentkv::{ffi, Block, DecodeRequest, Decoder, Layout, Plan, Pool, Router};

const LAYERS: u32 = 2;
const KV_HEADS: u32 = 2;
const Q_HEADS: u32 = 8;
const HEAD_DIM: u32 = 64;
const STEPS: u32 = 8;
const TURN: u32 = 4;

/// Deterministic stand-in for the model's K, V and Q (the values do not matter here).
fn fake(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2000) as f32 / 1000.0 - 1.0).collect()
}

/// The newest turn as a RECENT block ending where the turn will end; routed for that length, so
/// one route serves every step of the turn (decode clips a plan to the tokens stored).
fn route_turn(router: &Router, layout: &mut Layout, len: u32, turn: u32) -> intentkv::Result<Plan> {
    let mut b = Block::new(&format!("turn {}", turn), len, len + TURN);
    b.kind = ffi::IKV_KIND_CONVERSATION;
    b.policy = ffi::IKV_POLICY_RECENT;
    b.turn = turn;
    layout.add(&b)?;
    router.route(layout, len + TURN)
}

fn main() -> intentkv::Result<()> {
    let lens = [2048u32, 3072, 4096];
    let mut pc = Pool::default_config(); // kv_dtype F32 for &[f32] appends
    pc.n_layers = LAYERS;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim = HEAD_DIM;
    pc.capacity_bytes = 256 << 20;
    let mut pool = Pool::new(&pc)?;
    let mut rc = Router::default_config();
    rc.token_budget = 1024;
    rc.over_budget = ffi::IKV_OVER_BUDGET_KEEP;
    let mut router = Router::new(&rc)?;
    let mut decoder = Decoder::new(0)?;

    // prefill: a layout per request, routed; the prompt's K/V with the plan's page precisions
    let mut layouts = Vec::new();
    let mut plans = Vec::new();
    let mut seqs = Vec::new();
    for (b, &len) in lens.iter().enumerate() {
        let mut sc = Layout::synth_default_config();
        sc.seq_len = len;
        sc.seed = 7 + b as u64;
        let layout = Layout::synth(&sc)?;
        let plan = router.route(&layout, len)?;
        let seq = pool.seq_create()?;
        let kv = fake((LAYERS * len * KV_HEADS * HEAD_DIM) as usize, b as u32);
        pool.append(seq, &kv, &kv, None, Some(&plan))?; // None = every layer
        layouts.push(layout);
        plans.push(plan);
        seqs.push(seq);
    }
    for b in 0..seqs.len() {
        plans[b] = route_turn(&router, &mut layouts[b], lens[b], 1)?;
    }

    let row = (KV_HEADS * HEAD_DIM) as usize;
    let k_step = fake(seqs.len() * row, 11); // [seq][kv_head][head_dim] for one layer
    let q = fake(seqs.len() * (Q_HEADS * HEAD_DIM) as usize, 13);
    for step in 0..STEPS {
        if step > 0 && step % TURN == 0 {
            // turn boundary: pressure rose; new plans demote, existing pages follow them
            router.set_pressure(0.6)?;
            for b in 0..seqs.len() {
                let len = pool.seq_length(seqs[b])?;
                plans[b] = route_turn(&router, &mut layouts[b], len, 1 + step / TURN)?;
                pool.apply_plan_formats(seqs[b], &plans[b])?;
            }
        }
        let plan_refs: Vec<Option<&Plan>> = plans.iter().map(Some).collect();
        let mut bytes = 0;
        for layer in 0..LAYERS {
            pool.append_batch(&seqs, &k_step, &k_step, Some(layer), None)?; // the step's own token first
            let mut req = DecodeRequest::new(&seqs, &q, Q_HEADS);
            req.layer = layer;
            req.plans = &plan_refs;
            req.topk_token_budget = 512;
            req.topk_score = ffi::IKV_TOPK_SCORE_HYBRID;
            let out = decoder.decode(&pool, &req)?; // [seq][q_head][head_dim]
            assert!(out.iter().all(|x| x.is_finite()));
            bytes += decoder.last_bytes_read()?;
        }
        println!("step {}: {} KiB of KV read over {} layers", step, bytes / 1024, LAYERS);
    }
    let st = pool.stats()?;
    println!("pool: {} pages, {} KiB, {} tokens", st.pages_used, st.used_bytes / 1024, st.tokens_total);
    Ok(())
}
