// A Detokenizer reads the model's vocabulary: it cannot outlive the Model.
use llama::{Detokenizer, Model, ModelParams, Token};

fn main() {
    let mut detokenizer;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        detokenizer = Detokenizer::new(model.vocab(), false);
    }
    let _ = detokenizer.push_str(Token(1));
}
