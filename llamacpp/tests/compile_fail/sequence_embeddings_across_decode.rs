// A pooled embedding borrows the context: it cannot be held across the
// next decode, which overwrites it.
use llamacpp::{Batch, ContextParams, Model, ModelParams, Pooling, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let params = ContextParams::default().embeddings(true).pooling(Pooling::Mean);
    let mut ctx = model.new_context(&params).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(1)], 0)).unwrap();
    let embedding = ctx.sequence_embeddings(0).unwrap();
    ctx.decode(&Batch::from_tokens(&[Token(2)], 1)).unwrap();
    println!("{}", embedding[0]);
}
