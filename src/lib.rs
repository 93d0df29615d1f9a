//! Examples, integration tests and benchmarks of the `llama` crates live beside this file.
