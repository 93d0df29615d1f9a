// A custom sampler runs wherever its chain is sent: `CustomSampler` has
// `Send` as a supertrait, which is what makes `unsafe impl Send for
// SamplerChain` (and for `Sampler`) sound. A sampler holding an `Rc` cannot
// implement it, and `SamplerChain::custom` refuses a generic sampler whose
// parameter is not `Send`.
use std::rc::Rc;

use llamacpp::{Candidates, CustomSampler, SamplerChain};

struct Shared(Rc<u32>);

impl CustomSampler for Shared {
    fn apply(&mut self, _: &mut Candidates<'_>) {}
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(Shared(Rc::clone(&self.0)))
    }
}

/// Implements the trait only where it can: for `Send` contents.
struct Holder<T>(T);

impl<T: Clone + Send + 'static> CustomSampler for Holder<T> {
    fn apply(&mut self, _: &mut Candidates<'_>) {}
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(Holder(self.0.clone()))
    }
}

fn main() {
    let chain = SamplerChain::new().custom(Holder(Rc::new(2))).greedy();
    std::thread::spawn(move || drop(chain));
}
