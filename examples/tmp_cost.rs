use llama::{Batch, ContextParams, Logits, Model, ModelParams, Token};
use std::time::Instant;
fn main() {
    let path = llama_suite::model_cache::model_path().unwrap();
    let model = Model::load(&path, &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(2048).n_threads(2).n_threads_batch(2)).unwrap();
    let prompt: Vec<Token> = (0..300).map(|i| Token(1000 + i)).collect();
    ctx.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
    for k in [1usize, 2, 4, 8, 12, 17] {
        for all in [false, true] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let mut b = Batch::new(32, 1);
                for j in 0..k {
                    b.push(Token(2000 + j as i32), (300 + j) as i32, &[0], Logits::from(all || j == k - 1)).unwrap();
                }
                let t = Instant::now();
                ctx.decode(&b).unwrap();
                ctx.synchronize();
                best = best.min(t.elapsed().as_secs_f64() * 1000.0);
                ctx.seq_rm(Some(0), Some(300), None).unwrap();
            }
            println!("k {k:2} all_logits {all}: {best:.2} ms");
        }
    }
}
