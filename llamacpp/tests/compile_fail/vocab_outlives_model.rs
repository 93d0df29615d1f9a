// The Vocab lives inside its Model: a `&Vocab` cannot outlive the Model.
use llamacpp::{AddBos, Model, ModelParams, Vocab};

fn main() {
    let vocab: &Vocab;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        vocab = model.vocab();
    }
    let _ = vocab.tokenize("hello", AddBos::Yes);
}
