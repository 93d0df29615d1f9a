// Sampling mutates a chain's RNG state and scratch buffers: Sampler is Send
// but not Sync.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<llamacpp::Sampler<'static>>();
}
