// A Detokenizer reads the model's vocabulary: it cannot outlive the Model.
use llamacpp::{Detokenizer, Model, ModelParams, Special, Token};

fn main() {
    let mut detokenizer;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        detokenizer = Detokenizer::new(model.vocab(), Special::Plain);
    }
    let _ = detokenizer.push_str(Token(1));
}
