//! The lifetime and thread-safety promises of the safe API, checked by the
//! compiler: each program in `tests/compile_fail/` must fail to compile
//! with the error its `.stderr` file records (a borrow, lifetime or trait
//! error, never a typo). The positive side (what does cross threads) is
//! `thread_safety` in the workspace's integration tests.
//!
//! Here rather than in the workspace's suite: trybuild builds the crate's
//! dev-dependencies for the cases, and this crate has only trybuild.
//!
//! Regenerate the `.stderr` files after a compiler upgrade with
//! `TRYBUILD=overwrite cargo test -p llamacpp --test compile_fail`, and review
//! them.

#[test]
fn compile_fail() {
    // trybuild type-checks the cases (`cargo check`) in its own target
    // folder, where llamacpp-sys's build script would configure and compile
    // llama.cpp from scratch (minutes) only to link nothing. `DOCS_RS`
    // makes that build script skip the native build, exactly as on docs.rs;
    // the Rust code, and so every diagnostic, is the same.
    // SAFETY: this is the only test of this binary, and nothing else in
    // the process reads or writes the environment while it runs.
    unsafe { std::env::set_var("DOCS_RS", "1") };
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
