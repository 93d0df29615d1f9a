use llama::{Batch, ContextParams, Model, ModelParams, Sampler, SamplerChain};
use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};

#[test]
fn smoke() {
    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    let model = Model::load(&path, &ModelParams::default()).unwrap();
    let vocab = model.vocab();
    let toks = vocab.tokenize("Hello world", true).unwrap();
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(256).n_batch(64)).unwrap();
    ctx.decode(&Batch::from_tokens(&toks, 0)).unwrap();
    let mut s = Sampler::greedy();
    let t = s.sample(&mut ctx, -1).unwrap();
    let mut s2 = SamplerChain::new().top_k(40).top_p(0.9, 1).temp(0.8).dist(7).build().unwrap();
    let (t2, path2) = s2.sample_with_path(&mut ctx, -1).unwrap();
    println!("{t} {t2} {path2:?} {:?}", model.description());
    assert!(ctx.logits(0).is_err());
}
