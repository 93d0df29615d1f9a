// A Generation samples with the sampler: the sampler cannot be used (here:
// reset) while the Generation is alive.
use llamacpp::generate::{GenerateOptions, Session};
use llamacpp::{ContextParams, Model, ModelParams, Sampler, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &[Token(1)], &GenerateOptions::default()).unwrap();
    sampler.reset();
    let _ = generation.next_piece();
}
