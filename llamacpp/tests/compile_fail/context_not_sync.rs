// Every llama.cpp call on a context mutates it: Context is Send but not Sync.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<llamacpp::Context<'static>>();
}
