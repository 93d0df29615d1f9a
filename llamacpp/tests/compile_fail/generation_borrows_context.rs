// A Generation drives the context mutably: the context cannot be used
// while the Generation is alive.
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{Batch, ContextParams, Model, ModelParams, Sampler, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &[Token(1)], &GenerateOptions::default()).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(2)], 1)).unwrap();
    let _ = generation.next_piece();
}
