//! Allocations that the crate sizes from its input fail with
//! `Error::OutOfMemory` instead of aborting the process (Rust's default
//! reaction to a failed allocation). This test binary's allocator refuses
//! any single request over 1 GiB, as a machine without that much free
//! memory would.

use std::alloc::{GlobalAlloc, Layout, System};

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path};
use llamacpp::{AddBos, Error, Model, ModelParams, Special, Token};

const LIMIT: usize = 1 << 30;

struct Limited;

// SAFETY: forwards to the system allocator, except that it returns NULL
// (allowed by `GlobalAlloc`) for requests over `LIMIT`.
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Limited = Limited;

fn vocab_only() -> Model {
    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    Model::load(path, &ModelParams::default().vocab_only(true)).unwrap()
}

#[test]
fn tokenize_and_detokenize_report_a_failed_allocation() {
    let model = vocab_only();
    let vocab = model.vocab();
    // 300 MB of text: room for one token per byte is 1.2 GB.
    let text = "a".repeat(300 << 20);
    let err = vocab.tokenize(&text, AddBos::No).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { bytes } if bytes > LIMIT), "{err:?}");
    drop(text);
    // 150 million tokens (600 MB): the text buffer would be 1.2 GB.
    let tokens = vec![Token(5); 150 << 20];
    let err = vocab.detokenize(&tokens, AddBos::No, Special::Plain).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { bytes } if bytes > LIMIT), "{err:?}");
    // Small inputs still work under the same allocator.
    let small = vocab.tokenize("Hello world", AddBos::No).unwrap();
    assert_eq!(vocab.detokenize(&small, AddBos::No, Special::Plain).unwrap(), "Hello world");
}

#[test]
fn a_chat_template_buffer_that_cannot_be_allocated_is_an_error() {
    // Two messages of 600 MB: the output buffer guessed from them is 1.2 GB.
    let big = "a".repeat(600 << 20);
    let messages =
        [llamacpp::ChatMessage::new("user", big.as_str()), llamacpp::ChatMessage::new("assistant", big.as_str())];
    let err = llamacpp::apply_builtin_template("chatml", &messages, true).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { bytes } if bytes > LIMIT), "{err:?}");
}
