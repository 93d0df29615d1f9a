//! Criterion benchmarks of prefill and decode on the default model.
fn main() {}
