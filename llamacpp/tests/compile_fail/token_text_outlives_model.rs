// A token's stored text lives in the vocabulary: the `&str` cannot outlive
// the Model.
use llamacpp::{Model, ModelParams, Token};

fn main() {
    let text: &str;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        text = model.vocab().text(Token(1)).unwrap();
    }
    println!("{text}");
}
