// An owned context hands out its model only for as long as it is borrowed:
// the `&Model` cannot outlive the context (which may hold the last `Arc`).
use std::sync::Arc;

use llamacpp::{Context, ContextParams, Model, ModelParams};

fn main() {
    let model = Arc::new(Model::load("model.gguf", &ModelParams::default()).unwrap());
    let ctx = Context::new_owned(model, &ContextParams::default()).unwrap();
    let model_ref: &Model = ctx.model();
    drop(ctx);
    println!("{}", model_ref.n_ctx_train());
}
