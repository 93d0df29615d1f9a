// A chain under construction owns raw llama.cpp samplers: SamplerChain is
// Send but not Sync.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<llamacpp::SamplerChain<'static>>();
}
