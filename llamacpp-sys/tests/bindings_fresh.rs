//! The checked-in bindings must equal a fresh bindgen run over the headers
//! of the source in use. Runs with `--features bindgen` (CI does; it needs
//! libclang). Fix a failure with `llamacpp-sys/scripts/regen-bindings.sh`.
#![cfg(feature = "bindgen")]

#[test]
fn bindings_are_fresh() {
    let fresh = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let checked_in = include_str!("../src/bindings.rs");
    assert!(
        fresh == checked_in,
        "llamacpp-sys/src/bindings.rs differs from a fresh bindgen run; run llamacpp-sys/scripts/regen-bindings.sh"
    );
}
