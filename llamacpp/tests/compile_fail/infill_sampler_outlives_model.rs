// An infill sampler keeps a pointer to the model's vocabulary: the chain
// borrows the Model and cannot outlive it.
use llamacpp::{Model, ModelParams, Sampler, SamplerChain};

fn main() {
    let sampler: Sampler<'_>;
    {
        let model = Model::load("model.gguf", &ModelParams::default()).unwrap();
        sampler = SamplerChain::new().infill(model.vocab()).greedy().build().unwrap();
    }
    drop(sampler);
}
