// A LoRA adapter is registered inside its Model: it cannot outlive it.
use llamacpp::{Model, ModelParams};

fn main() {
    let adapter;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        adapter = model.load_lora("adapter.gguf").unwrap();
    }
    drop(adapter);
}
