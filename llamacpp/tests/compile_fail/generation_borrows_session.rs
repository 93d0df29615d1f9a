// A Generation updates the session's record of the cache: the session
// cannot be read (or reused) while the Generation is alive.
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{ContextParams, Model, ModelParams, Sampler, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &[Token(1)], &GenerateOptions::default()).unwrap();
    println!("{}", session.tokens().len());
    let _ = generation.next_piece();
}
