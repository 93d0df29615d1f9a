// A context keeps pointers to the LoRA adapters set on it: it cannot
// outlive them.
use llamacpp::{Batch, ContextParams, Model, ModelParams, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let mut ctx = model.new_context(&ContextParams::default()).unwrap();
    {
        let adapter = model.load_lora("adapter.gguf").unwrap();
        ctx.set_lora_adapters(&[(&adapter, 1.0)]).unwrap();
    }
    ctx.decode(&Batch::from_tokens(&[Token(1)], 0)).unwrap();
}
