//! Tokenizer conformance against llama.cpp's own test vectors.
//!
//! The llama.cpp source tree that llamacpp-sys was built from
//! ([`llamacpp_sys::SOURCE_DIR`]) ships `models/ggml-vocab-*.gguf` vocabularies,
//! and for most of them a `.inp` file of texts and a `.out` file of the
//! token ids the reference (Hugging Face) tokenizer gives. Upstream's
//! `tests/test-tokenizer-0.cpp` checks llama.cpp against them; this file
//! does the same through the safe `llamacpp` crate:
//!
//! * the `.inp` file is split on `"\n__ggml_vocab_test__\n"`, the `.out`
//!   file into lines (`std::getline`), each line stripped and split on
//!   single spaces into integers; both must have the same number of cases;
//! * the cases go into a map keyed by input (a repeated input keeps its last
//!   expected output), as upstream's `std::map` does;
//! * each input is tokenized with `add_special = false` and
//!   `parse_special = false` (upstream's `common_tokenize(ctx, text, false,
//!   false)`), from several threads at once, and must give exactly the
//!   expected ids.
//!
//! test-tokenizer-0 prints the detokenized text but asserts nothing about
//! it. The round trip upstream does assert is in `test-tokenizer-1-spm.cpp`
//! (the only tokenizer-1 test its CMakeLists enables, on
//! `ggml-vocab-llama-spm.gguf`): every token id, detokenized with special
//! tokens rendered, then tokenized with special-token parsing and
//! detokenized again, gives the same bytes; and every Unicode code point
//! (except surrogates, U+40000..=U+E0000, and U+2581 `▁`) tokenizes and
//! detokenizes back to itself. [`spm_detokenize_round_trip`] mirrors it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use llamacpp::{AddBos, Model, ModelParams, Special, Token, Vocab};
use llamacpp_sys as sys;

/// Upstream's separator between the texts of a `.inp` file.
const SEPARATOR: &[u8] = b"\n__ggml_vocab_test__\n";

/// `<SOURCE_DIR>/models`, or a panic that says why it is missing.
fn models_dir() -> PathBuf {
    let source = sys::SOURCE_DIR;
    assert!(
        !source.is_empty(),
        "llamacpp_sys::SOURCE_DIR is empty (a docs.rs-style build without a llama.cpp tree): \
         the tokenizer vectors live in <llama.cpp>/models"
    );
    let dir = Path::new(source).join("models");
    assert!(
        dir.is_dir(),
        "the llama.cpp tree llamacpp-sys was built from ({source}) has no models/ folder, so the tokenizer \
         test vectors (models/ggml-vocab-*.gguf with .inp/.out) are missing. Build against a full llama.cpp \
         checkout (LLAMA_CPP_DIR) or unset LLAMA_CPP_DIR to use the pinned vendored tree."
    );
    dir
}

/// The vocabularies of the pinned llama.cpp tree that come with `.inp` and
/// `.out` test vectors (`ggml-vocab-NAME.gguf`), sorted.
const WITH_VECTORS: [&str; 15] = [
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The vocabularies of the pinned tree without test vectors, sorted.
const WITHOUT_VECTORS: [&str; 4] = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"];

/// Every `ggml-vocab-*.gguf` in `models/`, sorted by name.
fn vocab_files() -> Vec<PathBuf> {
    let dir = models_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("ggml-vocab-") && name.ends_with(".gguf")
        })
        .collect();
    files.sort();
    files
}

fn has_vectors(path: &Path) -> bool {
    sibling(path, ".inp").is_file() && sibling(path, ".out").is_file()
}

/// `NAME` of `ggml-vocab-NAME.gguf`.
fn vocab_name(path: &Path) -> String {
    let name = file_name(path);
    name.strip_prefix("ggml-vocab-").and_then(|n| n.strip_suffix(".gguf")).unwrap_or(&name).to_owned()
}

/// Every `ggml-vocab-*.gguf` in `models/` that has both a `.inp` and a
/// `.out` file, sorted by name.
fn vocab_files_with_vectors() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = vocab_files().into_iter().filter(|p| has_vectors(p)).collect();
    assert!(
        !files.is_empty(),
        "{} has no ggml-vocab-*.gguf with .inp and .out test vectors; is it a trimmed llama.cpp tree?",
        models_dir().display()
    );
    files
}

/// `path` with `suffix` appended to its file name (`x.gguf` → `x.gguf.inp`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The test cases of one vocabulary, parsed as upstream's `read_tests` does.
struct Vectors {
    /// Input bytes → expected token ids (later duplicates win, as in
    /// upstream's `std::map`).
    cases: BTreeMap<Vec<u8>, Vec<i32>>,
    /// Number of cases in the files, duplicates included.
    raw_count: usize,
}

/// `std::getline` over the whole file: a final `'\n'` ends the last line
/// rather than starting an empty one.
fn getline_split(text: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// `string_strip` from common.cpp: trims C `isspace` bytes on both sides.
fn strip(line: &[u8]) -> &[u8] {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let start = line.iter().position(|b| !is_space(b)).unwrap_or(line.len());
    let end = line.iter().rposition(|b| !is_space(b)).map_or(start, |i| i + 1);
    &line[start..end]
}

fn read_vectors(vocab_file: &Path) -> Vectors {
    let (inp_path, out_path) = (sibling(vocab_file, ".inp"), sibling(vocab_file, ".out"));
    let raw = std::fs::read(&inp_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", inp_path.display()));
    let out = std::fs::read(&out_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", out_path.display()));

    // Upstream's loop: split on the separator; a separator at the very end
    // does not start another (empty) case.
    let mut inputs: Vec<&[u8]> = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(offset) => {
                inputs.push(&raw[pos..pos + offset]);
                pos += offset + SEPARATOR.len();
            }
            None => {
                inputs.push(&raw[pos..]);
                break;
            }
        }
    }
    let outputs = getline_split(&out);
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{} and {} have different numbers of test cases",
        inp_path.display(),
        out_path.display()
    );
    assert!(!inputs.is_empty(), "no test cases in {}", inp_path.display());

    let mut cases = BTreeMap::new();
    for (n, (input, line)) in inputs.iter().zip(&outputs).enumerate() {
        let line = strip(line);
        let expected: Vec<i32> = if line.is_empty() {
            Vec::new()
        } else {
            line.split(|&b| b == b' ')
                .map(|t| {
                    std::str::from_utf8(t).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
                        panic!(
                            "{} line {}: {:?} is not a token id",
                            out_path.display(),
                            n + 1,
                            String::from_utf8_lossy(t)
                        )
                    })
                })
                .collect()
        };
        cases.insert(input.to_vec(), expected);
    }
    Vectors { cases, raw_count: inputs.len() }
}

fn load_vocab_only(path: &Path) -> Model {
    let params = ModelParams::default().vocab_only(true);
    Model::load(path, &params).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

/// Tokenizes bytes. The safe API takes `&str`; for bytes that are not
/// UTF-8 (which llama.cpp accepts) this falls back to the raw shim call.
fn tokenize_bytes(vocab: &Vocab, text: &[u8], add_special: bool, parse_special: bool) -> Vec<Token> {
    if let Ok(text) = std::str::from_utf8(text) {
        let mut out = Vec::new();
        vocab
            .tokenize_into(
                text,
                if add_special { AddBos::Yes } else { AddBos::No },
                if parse_special { Special::Markup } else { Special::Plain },
                &mut out,
            )
            .unwrap_or_else(|e| panic!("tokenize {text:?}: {e}"));
        return out;
    }
    let len = i32::try_from(text.len()).expect("test text under 2 GiB");
    let mut out: Vec<i32> = vec![0; text.len() + 2];
    loop {
        let mut n = 0;
        // SAFETY: `text` is readable for `len` bytes, `out` writable for
        // `out.len()` tokens; the vocab lives in a model the caller holds;
        // the shim catches exceptions.
        let code = unsafe {
            sys::shim::llama_rs_tokenize(
                vocab.as_ptr(),
                text.as_ptr().cast(),
                len,
                out.as_mut_ptr(),
                out.len() as i32,
                add_special,
                parse_special,
                &mut n,
            )
        };
        assert_eq!(code, sys::shim::OK, "llama_tokenize threw");
        if n >= 0 {
            out.truncate(n as usize);
            return out.into_iter().map(Token).collect();
        }
        out.resize((-n) as usize, 0);
    }
}

/// upstream's `common_detokenize(vocab, tokens, special)`: the bytes of
/// `llama_detokenize(remove_special = false, unparse_special = special)`.
/// The safe `Vocab::detokenize` returns a `String` (invalid UTF-8 replaced),
/// which cannot represent a lone byte token, so this uses the raw shim call.
fn detokenize_bytes(vocab: &Vocab, tokens: &[Token], special: bool) -> Vec<u8> {
    let mut buf = vec![0u8; tokens.len().max(16)];
    loop {
        let mut n = 0;
        // SAFETY: `tokens` is `tokens.len()` readable ids (`Token` is a
        // `repr(transparent)` i32), all inside the vocabulary (callers pass
        // ids from `0..n_tokens` or from `tokenize`); `buf` is writable for
        // its length; the shim catches exceptions.
        let code = unsafe {
            sys::shim::llama_rs_detokenize(
                vocab.as_ptr(),
                tokens.as_ptr().cast(),
                tokens.len() as i32,
                buf.as_mut_ptr().cast(),
                buf.len() as i32,
                false,
                special,
                &mut n,
            )
        };
        assert_eq!(code, sys::shim::OK, "llama_detokenize threw");
        if n >= 0 {
            buf.truncate(n as usize);
            return buf;
        }
        buf.resize((-n) as usize, 0);
    }
}

fn ids(tokens: &[Token]) -> Vec<i32> {
    tokens.iter().map(|t| t.0).collect()
}

/// How many threads tokenize at once (upstream uses all hardware threads).
fn n_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

#[test]
fn tokenizer_vectors_match_upstream() {
    let started = Instant::now();
    let files = vocab_files_with_vectors();
    assert_eq!(files.iter().map(|f| vocab_name(f)).collect::<Vec<_>>(), WITH_VECTORS);
    let threads = n_threads();
    let (mut total_cases, mut total_raw) = (0, 0);
    let mut failures = Vec::new();

    for file in &files {
        let name = file_name(file);
        let vectors = read_vectors(file);
        let model = load_vocab_only(file);
        let vocab = model.vocab();

        // Every thread tokenizes every case, as upstream does, to exercise
        // the documented thread safety of tokenization; all results are
        // checked, not only the first thread's.
        let per_thread: Vec<Vec<Vec<i32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        vectors
                            .cases
                            .keys()
                            .map(|input| ids(&tokenize_bytes(vocab, input, false, false)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("tokenizer thread panicked")).collect()
        });

        for (thread, results) in per_thread.iter().enumerate() {
            for ((input, expected), got) in vectors.cases.iter().zip(results) {
                if got != expected {
                    let shown = |t: &[i32]| {
                        let tokens: Vec<Token> = t.iter().copied().map(Token).collect();
                        String::from_utf8_lossy(&detokenize_bytes(vocab, &tokens, true)).into_owned()
                    };
                    failures.push(format!(
                        "{name} (thread {thread}): {:?}\n  expected {expected:?} ({:?})\n  got      {got:?} ({:?})",
                        String::from_utf8_lossy(input),
                        shown(expected),
                        shown(got),
                    ));
                }
            }
        }
        eprintln!("{name}: {} cases ({} in the files)", vectors.cases.len(), vectors.raw_count);
        total_cases += vectors.cases.len();
        total_raw += vectors.raw_count;
    }

    eprintln!(
        "tokenizer vectors: {} vocab files, {total_cases} distinct cases ({total_raw} in the files), \
         {threads} threads each, {:.2?}",
        files.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failures (case × thread) in {total_cases} cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn spm_detokenize_round_trip() {
    let started = Instant::now();
    let path = models_dir().join("ggml-vocab-llama-spm.gguf");
    assert!(path.is_file(), "{} is missing from the llama.cpp tree", path.display());
    let model = load_vocab_only(&path);
    let vocab = model.vocab();
    assert_eq!(
        // SAFETY: a pure read of the live vocab.
        unsafe { sys::llama_vocab_type(vocab.as_ptr()) },
        sys::llama_vocab_type::LLAMA_VOCAB_TYPE_SPM,
        "ggml-vocab-llama-spm.gguf should be a SentencePiece vocabulary"
    );
    let n_vocab = vocab.n_tokens();
    assert!(n_vocab > 0);

    // Every token: detokenize (special tokens rendered), tokenize that with
    // special-token parsing, detokenize again: the same bytes.
    let mut failures = Vec::new();
    for id in 0..n_vocab as i32 {
        let text = detokenize_bytes(vocab, &[Token(id)], true);
        let tokens = tokenize_bytes(vocab, &text, false, true);
        let check = detokenize_bytes(vocab, &tokens, true);
        if check != text {
            failures.push(format!(
                "token {id} detokenizes to {:?} but its tokenization {:?} detokenizes to {:?}",
                String::from_utf8_lossy(&text),
                ids(&tokens),
                String::from_utf8_lossy(&check)
            ));
        }
    }
    let tokens_done = started.elapsed();

    // Every code point (as upstream: no surrogates, none of the unassigned
    // planes U+40000..=U+E0000; U+2581 `▁` is the SentencePiece space and
    // comes back as " "), through the safe API: `tokenize_special` and
    // `detokenize(remove_special = false, unparse_special = true)`.
    let threads = n_threads();
    let code_points: Vec<char> = (0u32..0x11_0000)
        .filter(|cp| !(0x4_0000..=0xE_0000).contains(cp))
        .filter_map(char::from_u32)
        .filter(|&c| c != '\u{2581}')
        .collect();
    let chunk = code_points.len().div_ceil(threads);
    let cp_failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = code_points
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut bad = Vec::new();
                    let mut buf = [0u8; 4];
                    for &c in part {
                        let text = c.encode_utf8(&mut buf);
                        let tokens = vocab.tokenize_special(text, AddBos::No).expect("tokenize a code point");
                        let check =
                            vocab.detokenize(&tokens, AddBos::No, Special::Markup).expect("detokenize its tokens");
                        if check != *text {
                            bad.push(format!(
                                "U+{:04X} {text:?} tokenizes to {:?}, which detokenizes to {check:?}",
                                c as u32,
                                ids(&tokens)
                            ));
                        }
                    }
                    bad
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("code point thread panicked")).collect()
    });
    failures.extend(cp_failures);

    eprintln!(
        "llama-spm round trip: {n_vocab} tokens ({tokens_done:.2?}), {} code points on {threads} threads, {:.2?} in all",
        code_points.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} round-trip failures:\n{}",
        failures.len(),
        failures.iter().take(50).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The tree's vocabularies are exactly the expected ones, by name, with and
/// without test vectors: a vocabulary that disappears, or loses its vectors,
/// fails here instead of silently shrinking the conformance test.
#[test]
fn the_expected_vocabularies_are_tested() {
    let files = vocab_files();
    let with: Vec<String> = files.iter().filter(|p| has_vectors(p)).map(|p| vocab_name(p)).collect();
    let without: Vec<String> = files.iter().filter(|p| !has_vectors(p)).map(|p| vocab_name(p)).collect();
    assert_eq!(with, WITH_VECTORS, "vocabularies with .inp/.out vectors in {}", models_dir().display());
    assert_eq!(without, WITHOUT_VECTORS, "vocabularies without vectors in {}", models_dir().display());
    let tested: Vec<String> = vocab_files_with_vectors().iter().map(|p| vocab_name(p)).collect();
    assert_eq!(tested, WITH_VECTORS, "what tokenizer_vectors_match_upstream runs on");
}

/// The vocabularies without test vectors still load (vocab only) and
/// tokenize: a sample text gives ids inside the vocabulary, which detokenize
/// back to the text (exactly for the byte-level and SentencePiece ones; the
/// Unigram nomic-bert-moe normalises, so its round trip drops an unknown
/// emoji and squeezes whitespace), and the same ids from several threads.
#[test]
fn vocabularies_without_vectors_load_and_tokenize() {
    const SAMPLE: &str = "Hello world! The quick brown fox, 1234 tokens: ünïcödé 日本語 🦙\n\tdone.";
    for name in WITHOUT_VECTORS {
        let path = models_dir().join(format!("ggml-vocab-{name}.gguf"));
        assert!(path.is_file(), "{} is missing", path.display());
        let model = load_vocab_only(&path);
        let vocab = model.vocab();
        let n_vocab = vocab.n_tokens();
        assert!(n_vocab > 1000, "{name}: only {n_vocab} tokens");
        let tokens = tokenize_bytes(vocab, SAMPLE.as_bytes(), false, false);
        assert!(tokens.len() > 10 && tokens.len() < SAMPLE.len(), "{name}: {} tokens for the sample", tokens.len());
        assert!(tokens.iter().all(|t| (0..n_vocab as i32).contains(&t.0)), "{name}: {:?}", ids(&tokens));
        let back = String::from_utf8(detokenize_bytes(vocab, &tokens, false)).expect("UTF-8");
        eprintln!("{name}: {n_vocab} tokens; sample -> {} ids -> {back:?}", tokens.len());
        if name == "nomic-bert-moe" {
            // Its (UGM) vocabulary has no llama emoji: that becomes the
            // unknown token, which detokenizes to nothing; and its
            // normaliser turns the run of whitespace into one space.
            assert_eq!(back.trim_start(), SAMPLE.replace("🦙\n\t", " "), "{name}: the round trip");
        } else {
            assert_eq!(back.trim_start(), SAMPLE, "{name}: the round trip");
        }
        // With special tokens added, the same ids inside whatever the
        // vocabulary adds (BOS, CLS/SEP).
        let special = tokenize_bytes(vocab, SAMPLE.as_bytes(), true, false);
        assert!(special.len() >= tokens.len(), "{name}");
        assert!(
            special.windows(tokens.len()).any(|w| w == tokens.as_slice()),
            "{name}: add_special changed the text's ids: {:?} vs {:?}",
            ids(&special),
            ids(&tokens)
        );
        let parallel: Vec<Vec<Token>> = std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..n_threads()).map(|_| s.spawn(|| tokenize_bytes(vocab, SAMPLE.as_bytes(), false, false))).collect();
            handles.into_iter().map(|h| h.join().expect("tokenizer thread panicked")).collect()
        });
        assert!(parallel.iter().all(|p| *p == tokens), "{name}: threads disagree");
    }
}
