// A Context borrows its Model: it cannot outlive it.
use llamacpp::{ContextParams, Model, ModelParams};

fn main() {
    let ctx;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        ctx = model.new_context(&ContextParams::default()).unwrap();
    }
    drop(ctx);
}
