// The chat template points into the model's metadata: the `&str` cannot
// outlive the Model.
use llamacpp::{Model, ModelParams};

fn main() {
    let template: Option<&str>;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        template = model.chat_template(None);
    }
    println!("{template:?}");
}
