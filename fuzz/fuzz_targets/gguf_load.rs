//! GGUF model loading from arbitrary bytes: the bytes are written to a file
//! and loaded vocab-only and in full. `Err` is fine; a panic, abort or
//! sanitizer report is a finding.
#![no_main]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use llamacpp::{AddBos, Model, ModelParams, Special};

fn scratch_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // /dev/shm when there is one: a write per input, no disk traffic.
        let dir = ["/dev/shm"].iter().map(PathBuf::from).find(|d| d.is_dir()).unwrap_or_else(std::env::temp_dir);
        dir.join(format!("llama-fuzz-gguf-{}.gguf", std::process::id()))
    })
}

fn exercise(model: &Model) {
    // Read what a caller would read after a successful load.
    let vocab = model.vocab();
    let _ = (model.n_ctx_train(), model.n_embd(), model.n_layer(), model.description(), model.metadata_entries());
    let _ = model.chat_template(None);
    let _ = vocab.tokenize("Hello world! 123 <s>", AddBos::Yes);
    let _ = vocab.tokenize_special("Hello <|ctrl|></s>", AddBos::Yes);
    for id in [0, 1, 2, vocab.n_tokens() as i32 - 1] {
        let _ = vocab.token_to_piece(llamacpp::Token(id), Special::Markup);
    }
}

fuzz_target!(|data: &[u8]| {
    let path = scratch_path();
    {
        let mut f = std::fs::File::create(path).expect("create the scratch file");
        f.write_all(data).expect("write the scratch file");
    }
    for vocab_only in [true, false] {
        let params = ModelParams::default().vocab_only(vocab_only);
        if let Ok(model) = Model::load(path, &params) {
            exercise(&model);
        }
    }
});
