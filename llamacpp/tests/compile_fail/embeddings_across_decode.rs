// An embeddings row borrows the context: it cannot be held across the next
// decode, which overwrites it.
use llamacpp::{Batch, ContextParams, Model, ModelParams, Output, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let params = ContextParams::default().embeddings(true);
    let mut ctx = model.new_context(&params).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(1)], 0)).unwrap();
    let embedding = ctx.embeddings(Output::Last).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(2)], 1)).unwrap();
    println!("{}", embedding[0]);
}
