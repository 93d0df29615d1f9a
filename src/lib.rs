//! Support code shared by the examples, integration tests and benchmarks at
//! the repository root: the default model fetcher, benchmark and teacher-forcing
//! helpers, and `synthetic` (the published `llamacpp::testing`, under its old
//! name). Not published.

pub mod bench;
#[cfg(test)]
mod house;
pub use llama_model_cache as model_cache;
pub mod python;
pub mod safe_api;
pub use llamacpp::testing as synthetic;
pub mod teacher;
pub mod token_prompts;

/// Declares one doc-test holder per Markdown file, so that `cargo test
/// --doc` compiles (and, unless a block says `no_run`, runs) every Rust
/// block in them, and lists the files for the check that none is missing.
macro_rules! markdown_doctests {
    ($($name:ident => $path:literal,)*) => {
        /// The Markdown files whose Rust blocks are doc tests, relative to
        /// the repository root.
        pub const MARKDOWN_WITH_DOCTESTS: &[&str] = &[$($path),*];
        /// The README's and docs/'s Rust blocks as doc tests (here, where
        /// every feature they use is on, `testing` included).
        #[cfg(doctest)]
        pub mod markdown {
            $(
                #[doc = include_str!(concat!("../", $path))]
                pub struct $name;
            )*
        }
    };
}

markdown_doctests! {
    Readme => "README.md",
    SysReadme => "llamacpp-sys/README.md",
    ModelCacheReadme => "model-cache/README.md",
    Building => "docs/building.md",
    Chat => "docs/chat.md",
    ChatTemplates => "docs/chat-templates.md",
    Embeddings => "docs/embeddings.md",
    Engine => "docs/engine.md",
    GettingStarted => "docs/getting-started.md",
    Gpu => "docs/gpu.md",
    JsonOutput => "docs/json-output.md",
    MemoryPlan => "docs/memory-plan.md",
    Multimodal => "docs/multimodal.md",
    Performance => "docs/performance.md",
    Platforms => "docs/platforms.md",
    Rpc => "docs/rpc.md",
    Server => "docs/server.md",
    Soundness => "docs/soundness.md",
    Speculative => "docs/speculative.md",
    Testing => "docs/testing.md",
    Troubleshooting => "docs/troubleshooting.md",
    Using => "docs/using.md",
}

#[cfg(test)]
mod tests {
    /// A new file in docs/ is compiled too: it must be listed above.
    #[test]
    fn every_markdown_file_in_docs_is_a_doctest() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let name = format!("docs/{}", entry.unwrap().file_name().to_string_lossy());
            if name.ends_with(".md") && !super::MARKDOWN_WITH_DOCTESTS.contains(&name.as_str()) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "add {missing:?} to markdown_doctests! in src/lib.rs");
        assert!(super::MARKDOWN_WITH_DOCTESTS.len() >= 17);
    }

    /// No Rust block escapes compilation: `ignore` is not used.
    #[test]
    fn no_rust_block_is_ignored() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for path in super::MARKDOWN_WITH_DOCTESTS {
            let text = std::fs::read_to_string(root.join(path)).unwrap();
            assert!(!text.contains("```rust,ignore"), "{path} has a Rust block that is not compiled");
        }
    }
}
