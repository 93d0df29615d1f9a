// A sampler chain with a grammar keeps a pointer to the model's vocabulary:
// it borrows the Model and cannot outlive it.
use llamacpp::{Model, ModelParams, Sampler, SamplerChain};

fn main() {
    let sampler: Sampler<'_>;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        sampler = SamplerChain::new()
            .grammar(model.vocab(), r#"root ::= "yes" | "no""#, "root")
            .greedy()
            .build()
            .unwrap();
    }
    drop(sampler);
}
