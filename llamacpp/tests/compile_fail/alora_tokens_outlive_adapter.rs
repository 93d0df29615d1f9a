// An aLoRA adapter's invocation tokens live inside the adapter, which frees
// them: the slice cannot outlive the LoraAdapter.
use llamacpp::{Model, ModelParams, Token};

fn main() {
    let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
    let tokens: &[Token];
    {
        let adapter = model.load_lora("adapter.gguf").unwrap();
        tokens = adapter.alora_invocation_tokens();
    }
    println!("{tokens:?}");
}
