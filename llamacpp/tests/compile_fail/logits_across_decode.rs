// A logits row borrows the context: it cannot be held across the next
// decode, which overwrites it.
use llamacpp::{Batch, ContextParams, Model, ModelParams, Output, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(1)], 0)).unwrap();
    let logits = ctx.logits(Output::Last).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(2)], 1)).unwrap();
    println!("{}", logits[0]);
}
