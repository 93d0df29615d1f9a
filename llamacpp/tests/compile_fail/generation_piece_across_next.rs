// A piece borrows the Generation's text buffer, which the next call reuses:
// it cannot be held across the next `next_piece`.
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{ContextParams, Model, ModelParams, Sampler, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &[Token(1)], &GenerateOptions::default()).unwrap();
    let first = generation.next_piece().unwrap().unwrap();
    let second = generation.next_piece().unwrap().unwrap();
    println!("{first}{second}");
}
