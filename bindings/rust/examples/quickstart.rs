//! The README's Rust example (compiled by `cargo test`, run with `cargo run --example quickstart`).
use intentkv::{DecodeRequest, Decoder, Layout, Pool, Router};

fn main() -> intentkv::Result<()> {
    let mut synth = Layout::synth_default_config();
    synth.seq_len = 4096;
    let layout = Layout::synth(&synth)?;
    let router = Router::new(&Router::default_config())?;
    let plan = router.route(&layout, 4096)?;
    let mut pc = Pool::default_config();           // kv_dtype F32 for &[f32] appends
    pc.n_layers = 1; pc.n_kv_heads = 2; pc.head_dim = 64; pc.capacity_bytes = 64 << 20;
    let mut pool = Pool::new(&pc)?;
    let seq = pool.seq_create()?;
    let kv = vec![0.25f32; 4096 * 2 * 64];
    pool.append(seq, &kv, &kv, None, Some(&plan))?; // None = every layer
    let q = vec![0.1f32; 8 * 64];
    let (seqs, plans) = ([seq], [Some(&plan)]);
    let mut req = DecodeRequest::new(&seqs, &q, 8);
    req.plans = &plans;
    let out = Decoder::new(0)?.decode(&pool, &req)?;
    println!("{} outputs, summary {:?}", out.len(), plan.summary()?);
    Ok(())
}
