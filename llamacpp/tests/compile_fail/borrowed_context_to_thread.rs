// A context from `Model::new_context` borrows its model, so it cannot move
// into `std::thread::spawn` (which needs 'static); `Context::new_owned`
// gives one that can.
use llamacpp::{ContextParams, Model, ModelParams};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    std::thread::spawn(move || {
        ctx.clear_kv();
    });
}
