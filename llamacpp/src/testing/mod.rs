//! Tiny synthetic GGUF models for tests (feature `testing`): test your own
//! code against a real model of a few hundred kilobytes, written on the
//! fly, instead of downloading one.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use llamacpp::testing::{TinyModelSpec, tiny_llama_path};
//! use llamacpp::{CompleteOptions, Model, ModelParams};
//!
//! let path = tiny_llama_path(&TinyModelSpec::default())?; // cached in the temp folder
//! let model = Model::load(&path, &ModelParams::default())?;
//! let done = model.complete("Hello world", &CompleteOptions::default().max_tokens(8))?;
//! assert_eq!(done.stats.prompt_tokens, 3); // <s> ▁Hello ▁world
//! # Ok(()) }
//! ```
//!
//! The models are random but real: a `llama` architecture network (RMS norm,
//! rotary attention with grouped-query heads, SwiGLU feed-forward) with F32
//! weights drawn from a small deterministic PRNG, and a SentencePiece-style
//! (`tokenizer.ggml.model = "llama"`) vocabulary with byte fallback. They load
//! with `llama_model_load_from_file`, tokenize any UTF-8 text, and decode in
//! milliseconds on a CPU, so tests can exercise the whole stack without
//! downloading a model.
//!
//! The file is written by ggml's own GGUF writer (`gguf_init_empty`,
//! `gguf_set_*`, `gguf_add_tensor`, `gguf_write_to_file`) through `llamacpp-sys`;
//! the same [`TinyModelSpec`] always gives a byte-identical file.
//!
//! Vocabulary layout (ids):
//!
//! | id            | piece                          | type    |
//! |---------------|--------------------------------|---------|
//! | 0             | `<unk>`                        | UNKNOWN |
//! | 1             | `<s>` (BOS)                    | CONTROL |
//! | 2             | `</s>` (EOS)                   | CONTROL |
//! | 3..=258       | `<0x00>`..=`<0xFF>`            | BYTE    |
//! | 259           | [`TINY_CONTROL_TOKEN`]         | CONTROL |
//! | 260..         | `▁`, printable ASCII, word pieces | NORMAL |
//!
//! Every word piece is reachable by SentencePiece merges (all its prefixes
//! are pieces too), so `"Hello world"` tokenizes to `<s> ▁Hello ▁world`;
//! anything else falls back to byte tokens and detokenizes back exactly.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::sys;

#[cfg(feature = "mtmd")]
mod projector;
mod shaped;
mod tensors;
mod writer;

#[cfg(feature = "mtmd")]
pub use projector::{ProjectorKind, ProjectorSpec, tiny_projector_path, write_tiny_projector};
pub use shaped::{ShapedSpec, write_shaped_llama};
use tensors::*;
pub use writer::GgufWriter;

/// Id of `<unk>`.
pub const TINY_UNK_ID: i32 = 0;
/// Id of `<s>`, the BOS token (added by `tokenize` with `add_special`).
pub const TINY_BOS_ID: i32 = 1;
/// Id of `</s>`, the EOS token (not added by `tokenize`).
pub const TINY_EOS_ID: i32 = 2;
/// Id of the byte token `<0x00>`; byte `b` is `TINY_FIRST_BYTE_ID + b`.
pub const TINY_FIRST_BYTE_ID: i32 = 3;
/// A control token. Tokenizing its text with special-token parsing off
/// gives ordinary pieces; with it on, gives [`TINY_CONTROL_TOKEN_ID`].
pub const TINY_CONTROL_TOKEN: &str = "<|ctrl|>";
/// Id of [`TINY_CONTROL_TOKEN`].
pub const TINY_CONTROL_TOKEN_ID: i32 = TINY_FIRST_BYTE_ID + 256;
/// Id of the first normal piece (`▁`).
const FIRST_NORMAL_ID: usize = TINY_CONTROL_TOKEN_ID as usize + 1;
/// Number of tokens in the vocabulary of every tiny model.
pub const TINY_VOCAB_SIZE: usize = FIRST_NORMAL_ID + NORMAL_PIECES.len();

/// Bump when the generated weights or metadata change, so that files cached
/// by [`tiny_llama_path`] under the old scheme are not reused. (Changes to
/// the vocabulary invalidate the cache by themselves: it is hashed too.)
const GENERATOR_VERSION: u32 = 1;

/// Normal pieces, in id order from [`FIRST_NORMAL_ID`]: the word-boundary
/// marker, printable ASCII, then word pieces ordered by length. Every piece
/// of two or more characters has its prefix one character shorter in the
/// table, so SentencePiece merges can build it. Scores fall with the index,
/// so shorter merges win first, as in a trained vocabulary.
#[rustfmt::skip]
const NORMAL_PIECES: &[&str] = &[
    "▁", "!", "\"", "#", "$", "%", "&", "'", "(", ")", "*", "+", ",", "-", ".", "/", "0", "1", "2",
    "3", "4", "5", "6", "7", "8", "9", ":", ";", "<", "=", ">", "?", "@", "A", "B", "C", "D", "E",
    "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S", "T", "U", "V", "W", "X",
    "Y", "Z", "[", "\\", "]", "^", "_", "`", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k",
    "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "{", "|", "}", "~",
    "▁t", "▁b", "▁o", "▁a", "▁i", "▁h", "▁I", "▁f", "▁n", "▁w", "▁y", "▁d", "▁s", "▁m", "▁u", "▁g",
    "▁c", "▁l", "▁j", "▁k", "▁p", "▁e", "▁H", "▁W", "▁T", "▁R", "▁q", "▁r", "▁v", "in", "ed", "er",
    "ly", "es", "ti", "me", "ne", "al", "▁th", "▁be", "▁to", "▁of", "▁an", "▁in", "▁ha", "▁it",
    "▁fo", "▁no", "▁on", "▁wi", "▁he", "▁as", "▁yo", "▁do", "▁at", "▁bu", "▁hi", "▁by", "▁fr",
    "▁we", "▁sa", "▁sh", "▁or", "▁my", "▁al", "▁wo", "▁wh", "▁so", "▁up", "▁ou", "▁if", "▁ab",
    "▁ge", "▁go", "▁me", "▁ma", "▁ca", "▁li", "▁ti", "▁ju", "▁kn", "▁ta", "▁pe", "▁ye", "▁co",
    "▁se", "▁ot", "▁lo", "▁ov", "▁ba", "▁af", "▁us", "▁tw", "▁ho", "▁fi", "▁wa", "▁ev", "▁ne",
    "▁gi", "▁da", "▁mo", "▁is", "▁ar", "▁He", "▁Wo", "▁Th", "▁It", "▁te", "▁ll", "▁Ru", "▁sm",
    "▁fa", "▁qu", "▁br", "▁la", "▁re", "▁bl", "▁gr", "▁ru", "▁ve", "▁mu", "ing", "tio", "men",
    "nes", "est", "▁the", "▁and", "▁tha", "▁hav", "▁for", "▁not", "▁wit", "▁you", "▁thi", "▁but",
    "▁his", "▁fro", "▁say", "▁her", "▁she", "▁wil", "▁one", "▁all", "▁wou", "▁wha", "▁out", "▁abo",
    "▁who", "▁get", "▁whi", "▁whe", "▁mak", "▁can", "▁lik", "▁tim", "▁jus", "▁him", "▁kno", "▁tak",
    "▁peo", "▁int", "▁yea", "▁goo", "▁som", "▁cou", "▁see", "▁oth", "▁now", "▁loo", "▁onl", "▁com",
    "▁its", "▁ove", "▁als", "▁bac", "▁aft", "▁use", "▁two", "▁how", "▁our", "▁wor", "▁fir", "▁wel",
    "▁way", "▁eve", "▁new", "▁wan", "▁bec", "▁any", "▁giv", "▁day", "▁mos", "▁are", "▁was", "▁wer",
    "▁has", "▁had", "▁bee", "▁sai", "▁Hel", "▁hel", "▁Wor", "▁The", "▁Thi", "▁mod", "▁tes", "▁tok",
    "▁lla", "▁Rus", "▁tex", "▁sma", "▁tin", "▁fas", "▁qui", "▁bro", "▁fox", "▁jum", "▁laz", "▁dog",
    "▁cat", "▁red", "▁blu", "▁gre", "▁run", "▁wal", "▁yes", "▁why", "▁mor", "▁ver", "▁muc", "▁man",
    "tion", "ment", "ness", "▁that", "▁have", "▁with", "▁this", "▁from", "▁they", "▁will", "▁woul",
    "▁ther", "▁thei", "▁what", "▁abou", "▁whic", "▁when", "▁make", "▁like", "▁time", "▁just",
    "▁know", "▁take", "▁peop", "▁into", "▁year", "▁your", "▁good", "▁some", "▁coul", "▁them",
    "▁othe", "▁than", "▁then", "▁look", "▁only", "▁come", "▁over", "▁thin", "▁also", "▁back",
    "▁afte", "▁work", "▁firs", "▁well", "▁even", "▁want", "▁beca", "▁thes", "▁give", "▁most",
    "▁were", "▁been", "▁said", "▁Hell", "▁hell", "▁worl", "▁Worl", "▁This", "▁mode", "▁test",
    "▁toke", "▁llam", "▁Rust", "▁text", "▁smal", "▁tiny", "▁fast", "▁quic", "▁brow", "▁jump",
    "▁lazy", "▁blue", "▁gree", "▁runn", "▁walk", "▁wher", "▁here", "▁more", "▁very", "▁much",
    "▁many", "▁would", "▁there", "▁their", "▁about", "▁which", "▁peopl", "▁could", "▁other",
    "▁think", "▁after", "▁first", "▁becau", "▁these", "▁Hello", "▁hello", "▁world", "▁World",
    "▁model", "▁token", "▁llama", "▁small", "▁quick", "▁brown", "▁jumps", "▁green", "▁runni",
    "▁walke", "▁where", "▁people", "▁becaus", "▁runnin", "▁walked", "▁because", "▁running",
];

/// The shape and seed of a tiny synthetic model.
///
/// Constraints (checked by [`write_tiny_llama`]): every field but `seed` is
/// at least 1, `n_head` divides `n_embd` with an even head size (rotary
/// embedding), and `n_head_kv` divides `n_head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TinyModelSpec {
    /// Transformer blocks.
    pub n_layer: u32,
    /// Embedding (hidden) size.
    pub n_embd: u32,
    /// Attention (query) heads.
    pub n_head: u32,
    /// Key/value heads; fewer than `n_head` gives grouped-query attention.
    pub n_head_kv: u32,
    /// Feed-forward inner size.
    pub n_ff: u32,
    /// Training context length written to the metadata.
    pub n_ctx_train: u32,
    /// Seed of the weights; the same spec gives a byte-identical file.
    pub seed: u64,
}

impl Default for TinyModelSpec {
    /// 2 layers, `n_embd` 64, 4 heads over 2 KV heads, `n_ff` 128,
    /// `n_ctx_train` 2048, seed 42.
    fn default() -> Self {
        Self { n_layer: 2, n_embd: 64, n_head: 4, n_head_kv: 2, n_ff: 128, n_ctx_train: 2048, seed: 42 }
    }
}

/// RoPE base frequency written to the metadata.
const ROPE_FREQ_BASE: f32 = 10_000.0;
/// RMS norm epsilon written to the metadata.
const RMS_EPS: f32 = 1e-5;
/// Scale of the output projection relative to a variance-preserving one:
/// makes the logits spread over a few units, so the argmax depends on the
/// input instead of being flat noise.
const OUTPUT_GAIN: f32 = 2.0;
/// Largest tensor data a "tiny" model may have, in bytes.
const MAX_DATA_BYTES: u64 = 1 << 31;

/// Writes a tiny llama model for `spec` to `path`.
///
/// The file is written to a unique temporary file next to `path`, flushed
/// to disk and renamed over `path`, so readers never see a partial file.
///
/// # Errors
///
/// [`io::ErrorKind::InvalidInput`] for a spec that breaks the constraints
/// of [`TinyModelSpec`] or a path without a file name or with a NUL byte;
/// otherwise the I/O error of creating, writing or renaming the file (the
/// parent folder must exist: [`io::ErrorKind::NotFound`] if it does not).
pub fn write_tiny_llama(path: &Path, spec: &TinyModelSpec) -> io::Result<()> {
    write_tiny(path, spec, Arch::Llama, None)
}

/// Writes the tiny llama model of `spec` with the rank-`rank` adapter of
/// [`write_tiny_lora_with_alpha`] (or, for `alpha = rank`, of
/// [`write_tiny_lora`]) merged into its weights at adapter scale `scale`,
/// the way llama.cpp applies it: layer 0's query projection `W` becomes
/// `W + s·(B·A)` with `s = scale · alpha / rank` (`s = scale` for
/// `alpha = 0`). In ggml's order `lora_a` has `ne = [n_embd, rank]`
/// (`rank` rows of `n_embd`: `A` is rank × n_embd) and `lora_b`
/// `ne = [rank, n_embd]` (`B` is n_embd × rank), and llama.cpp computes
/// `W·x + s·B·(A·x)`; `B·A` is n_embd × n_embd like `W` (`ne = [n_embd,
/// n_embd]`, row `o` holding output `o`'s weights). The product is summed in
/// f64 and the merged weights rounded to f32 once. Every other tensor is
/// [`write_tiny_llama`]'s. Written as [`write_tiny_llama`] writes.
///
/// # Errors
/// As [`write_tiny_lora`] and [`write_tiny_llama`].
pub fn write_tiny_llama_lora_merged(
    path: &Path,
    spec: &TinyModelSpec,
    rank: u32,
    alpha: f32,
    scale: f32,
) -> io::Result<()> {
    validate(spec)?;
    lora_plan(spec, rank)?;
    if !scale.is_finite() || !alpha.is_finite() {
        return Err(invalid_input(format!("LoRA scale {scale} or alpha {alpha} is not finite")));
    }
    write_tiny(path, spec, Arch::Llama, Some(LoraMerge { rank, alpha, scale }))
}

/// Writes a tiny Mamba (recurrent state-space) model for `spec` to `path`:
/// `n_layer` blocks of `n_embd` with llama.cpp's only supported expansion
/// factor (inner size `2 * n_embd`), convolution kernel 4, state size 8,
/// time-step rank 4; the attention and feed-forward fields are unused. Its
/// cache is llama.cpp's recurrent memory (one state per sequence), for
/// tests of what only recurrent models do. Written as
/// [`write_tiny_llama`] writes.
///
/// # Errors
/// As [`write_tiny_llama`].
pub fn write_tiny_mamba(path: &Path, spec: &TinyModelSpec) -> io::Result<()> {
    write_tiny(path, spec, Arch::Mamba, None)
}

/// The architectures the writer knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Llama,
    Mamba,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mamba => "mamba",
        }
    }
}

/// A LoRA adapter of [`write_tiny_lora`] to merge into the weights.
#[derive(Clone, Copy, Debug)]
struct LoraMerge {
    rank: u32,
    /// The adapter's `adapter.lora.alpha`.
    alpha: f32,
    /// The adapter scale a user would set (llama.cpp multiplies it by
    /// alpha / rank).
    scale: f32,
}

fn write_tiny(path: &Path, spec: &TinyModelSpec, arch: Arch, merge: Option<LoraMerge>) -> io::Result<()> {
    validate(spec)?;
    write_atomically(path, |tmp| write_gguf(tmp, spec, arch, merge))
}

/// Runs `write` on a unique temporary file beside `path`, then renames it
/// over `path`, so readers never see a partial file; the temporary file is
/// removed when anything fails.
fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let file_name = path.file_name().ok_or_else(|| invalid_input(format!("no file name in {}", path.display())))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tmp, file) = create_unique_temp(&dir, &file_name.to_string_lossy())?;
    drop(file);
    let result = write(&tmp).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        // Best effort: the temporary name is ours alone.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Returns the path of a tiny llama model for `spec`, writing it on first
/// use.
///
/// Models live in `std::env::temp_dir()/llama-rs-tiny/`, named by a hash of
/// the spec, the vocabulary and the generator version, and are reused by
/// later calls and other processes. Safe to call from several threads and
/// processes at once: each writer writes a unique temporary file and renames
/// it into place, so a reader sees either no file or a whole one.
///
/// # Errors
///
/// As [`write_tiny_llama`], plus the error of creating the folder.
pub fn tiny_llama_path(spec: &TinyModelSpec) -> io::Result<PathBuf> {
    tiny_path(spec, Arch::Llama)
}

/// [`tiny_llama_path`] for the Mamba model of [`write_tiny_mamba`].
///
/// # Errors
/// As [`tiny_llama_path`].
pub fn tiny_mamba_path(spec: &TinyModelSpec) -> io::Result<PathBuf> {
    tiny_path(spec, Arch::Mamba)
}

fn tiny_path(spec: &TinyModelSpec, arch: Arch) -> io::Result<PathBuf> {
    /// Keeps threads of one process from writing the same model twice.
    static GENERATE: Mutex<()> = Mutex::new(());

    validate(spec)?;
    let dir = std::env::temp_dir().join("llama-rs-tiny");
    fs::create_dir_all(&dir)?;
    let path = dir.join(format!("tiny-{}-{:016x}.gguf", arch.name(), spec_key(spec, arch)));
    if is_complete_gguf(&path) {
        return Ok(path);
    }

    let _guard = GENERATE.lock().unwrap_or_else(PoisonError::into_inner);
    if is_complete_gguf(&path) {
        return Ok(path);
    }
    match write_tiny(&path, spec, arch, None) {
        Ok(()) => Ok(path),
        // Another process may have won the race and hold the file open
        // (where that blocks a rename); its file is as good as ours.
        Err(_) if is_complete_gguf(&path) => Ok(path),
        Err(e) => Err(e),
    }
}

fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

fn validate(spec: &TinyModelSpec) -> io::Result<()> {
    let TinyModelSpec { n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx_train, seed: _ } = *spec;
    if [n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx_train].contains(&0) {
        return Err(invalid_input(format!("tiny model spec has a zero size: {spec:?}")));
    }
    if n_embd % n_head != 0 || (n_embd / n_head) % 2 != 0 {
        return Err(invalid_input(format!("n_embd {n_embd} is not n_head {n_head} times an even head size")));
    }
    if n_head % n_head_kv != 0 {
        return Err(invalid_input(format!("n_head_kv {n_head_kv} does not divide n_head {n_head}")));
    }
    match data_bytes(spec) {
        Some(n) if n <= MAX_DATA_BYTES => Ok(()),
        _ => Err(invalid_input(format!(
            "tiny model spec is not tiny (over {MAX_DATA_BYTES} bytes of weights): {spec:?}"
        ))),
    }
}

/// Bytes of F32 data in the tensors of [`tensor_plan`], counted without
/// building it (a huge `n_layer` must fail here, not allocate); `None` on
/// overflow. Needs `n_head` to divide `n_embd` and be nonzero.
fn data_bytes(spec: &TinyModelSpec) -> Option<u64> {
    let (embd, ff) = (u64::from(spec.n_embd), u64::from(spec.n_ff));
    let embd_kv = (embd / u64::from(spec.n_head)).checked_mul(u64::from(spec.n_head_kv))?;
    // norms + q, o + k, v + gate, up, down
    let per_layer = [(2, 1), (2, embd), (2, embd_kv), (3, ff)]
        .iter()
        .try_fold(0u64, |acc, &(k, d)| acc.checked_add(embd.checked_mul(d)?.checked_mul(k)?))?;
    // token_embd + output + output_norm
    let global = (2 * TINY_VOCAB_SIZE as u64 + 1).checked_mul(embd)?;
    u64::from(spec.n_layer).checked_mul(per_layer)?.checked_add(global)?.checked_mul(4)
}

/// A stable (cross-process, cross-version) hash naming the cached file.
fn spec_key(spec: &TinyModelSpec, arch: Arch) -> u64 {
    let mut h = Fnv1a::new();
    h.write(b"llama-rs tiny ");
    h.write(arch.name().as_bytes());
    h.write(&GENERATOR_VERSION.to_le_bytes());
    for v in [spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_ff, spec.n_ctx_train] {
        h.write(&v.to_le_bytes());
    }
    h.write(&spec.seed.to_le_bytes());
    h.write(TINY_CONTROL_TOKEN.as_bytes());
    for piece in NORMAL_PIECES {
        h.write(piece.as_bytes());
        h.write(&[0]);
    }
    h.finish()
}

/// Whether `path` is a file that starts with the GGUF magic. Files appear
/// only by rename once complete, so this is enough to reuse one.
fn is_complete_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok_and(|()| &magic == b"GGUF")
}

/// Creates a new, empty file with a name unique to this call in `dir`.
fn create_unique_temp(dir: &Path, base: &str) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last_err = None;
    for _ in 0..100 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{base}.{}.{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            // A leftover of a dead process with our pid: try the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no free temporary file name")))
}

fn tiny_vocab() -> Vocab {
    use sys::llama_token_type::*;

    let mut v = Vocab {
        texts: Vec::with_capacity(TINY_VOCAB_SIZE),
        scores: Vec::with_capacity(TINY_VOCAB_SIZE),
        types: Vec::with_capacity(TINY_VOCAB_SIZE),
    };
    let mut push = |text: String, score: f32, ty: sys::llama_token_type::Type| {
        v.texts.push(text);
        v.scores.push(score);
        v.types.push(ty as i32);
    };
    push("<unk>".into(), 0.0, LLAMA_TOKEN_TYPE_UNKNOWN);
    push("<s>".into(), 0.0, LLAMA_TOKEN_TYPE_CONTROL);
    push("</s>".into(), 0.0, LLAMA_TOKEN_TYPE_CONTROL);
    for b in 0..=255u8 {
        push(format!("<0x{b:02X}>"), 0.0, LLAMA_TOKEN_TYPE_BYTE);
    }
    push(TINY_CONTROL_TOKEN.into(), 0.0, LLAMA_TOKEN_TYPE_CONTROL);
    for (i, piece) in NORMAL_PIECES.iter().enumerate() {
        push((*piece).into(), -(i as f32), LLAMA_TOKEN_TYPE_NORMAL);
    }
    v
}

/// Builds the model for `spec` and writes it to `path` (not atomically).
fn write_gguf(path: &Path, spec: &TinyModelSpec, arch: Arch, merge: Option<LoraMerge>) -> io::Result<()> {
    let plan = match arch {
        Arch::Llama => tensor_plan(spec),
        Arch::Mamba => mamba_tensor_plan(spec),
    };
    let mem_size = plan.iter().try_fold(0usize, |acc, t| {
        let bytes = usize::try_from(t.n_elements()?).ok()?.checked_mul(4)?;
        acc.checked_add(GgufWriter::pool_bytes(bytes))
    });
    let mem_size = mem_size.ok_or_else(|| invalid_input("tiny model too large"))?;
    let mut w = GgufWriter::new(mem_size)?;

    let name = arch.name();
    let key = |k: &str| format!("{name}.{k}");
    w.set_str("general.architecture", name)?;
    w.set_str("general.name", &format!("llama-rs tiny synthetic {name}"))?;
    w.set_u32(&key("vocab_size"), TINY_VOCAB_SIZE as u32)?;
    w.set_u32(&key("context_length"), spec.n_ctx_train)?;
    w.set_u32(&key("embedding_length"), spec.n_embd)?;
    w.set_u32(&key("block_count"), spec.n_layer)?;
    match arch {
        Arch::Llama => {
            w.set_u32(&key("feed_forward_length"), spec.n_ff)?;
            w.set_u32(&key("attention.head_count"), spec.n_head)?;
            w.set_u32(&key("attention.head_count_kv"), spec.n_head_kv)?;
            w.set_u32(&key("rope.dimension_count"), spec.n_embd / spec.n_head)?;
            w.set_f32(&key("rope.freq_base"), ROPE_FREQ_BASE)?;
        }
        Arch::Mamba => {
            w.set_u32(&key("feed_forward_length"), 0)?;
            w.set_u32(&key("attention.head_count"), 0)?;
            w.set_u32(&key("ssm.conv_kernel"), MAMBA_D_CONV)?;
            w.set_u32(&key("ssm.inner_size"), 2 * spec.n_embd)?;
            w.set_u32(&key("ssm.state_size"), MAMBA_D_STATE)?;
            w.set_u32(&key("ssm.time_step_rank"), MAMBA_DT_RANK)?;
        }
    }
    // After the architecture's keys: the llama file keeps the byte layout
    // of earlier versions, so cached files stay valid.
    w.set_f32(&key("attention.layer_norm_rms_epsilon"), RMS_EPS)?;

    let vocab = tiny_vocab();
    w.set_str("tokenizer.ggml.model", "llama")?;
    w.set_arr_str("tokenizer.ggml.tokens", &vocab.texts)?;
    w.set_arr_f32("tokenizer.ggml.scores", &vocab.scores)?;
    w.set_arr_i32("tokenizer.ggml.token_type", &vocab.types)?;
    w.set_u32("tokenizer.ggml.bos_token_id", TINY_BOS_ID as u32)?;
    w.set_u32("tokenizer.ggml.eos_token_id", TINY_EOS_ID as u32)?;
    w.set_u32("tokenizer.ggml.unknown_token_id", TINY_UNK_ID as u32)?;
    w.set_bool("tokenizer.ggml.add_bos_token", true)?;
    w.set_bool("tokenizer.ggml.add_eos_token", false)?;
    w.set_bool("tokenizer.ggml.add_space_prefix", true)?;

    let merged = merge.map(|m| merged_lora_weight(spec, m).map(|w| (LORA_TARGET, w))).transpose()?;
    for def in &plan {
        let values = match &merged {
            Some((target, values)) if def.name == *target => values.clone(),
            _ => def.values(spec.seed),
        };
        w.add_f32_tensor(&def.name, &def.ne, &values)?;
    }
    w.write(path)
}

/// The tensor the tiny LoRA adapts.
const LORA_TARGET: &str = "blk.0.attn_q.weight";

/// The tensors of the rank-`rank` LoRA of [`write_tiny_lora`]: `lora_a`
/// (`ne = [n_embd, rank]`) and `lora_b` (`ne = [rank, n_embd]`).
fn lora_plan(spec: &TinyModelSpec, rank: u32) -> io::Result<[TensorDef; 2]> {
    if rank == 0 || rank > spec.n_embd {
        return Err(invalid_input(format!("LoRA rank {rank} must be in 1..={}", spec.n_embd)));
    }
    Ok([
        TensorDef { name: format!("{LORA_TARGET}.lora_a"), ne: vec![spec.n_embd, rank], init: Init::Uniform(0.5) },
        TensorDef { name: format!("{LORA_TARGET}.lora_b"), ne: vec![rank, spec.n_embd], init: Init::Uniform(0.5) },
    ])
}

/// The seed of the LoRA tensors' values.
fn lora_seed(spec: &TinyModelSpec) -> u64 {
    spec.seed ^ 0x10_4A
}

/// `W + scale · alpha / rank · (B·A)` for [`LORA_TARGET`] (see
/// [`write_tiny_llama_lora_merged`]), flat in ggml's order: element
/// `[o * n_embd + i]` is the weight of input `i` in output `o`.
fn merged_lora_weight(spec: &TinyModelSpec, merge: LoraMerge) -> io::Result<Vec<f32>> {
    let [a_def, b_def] = lora_plan(spec, merge.rank)?;
    let (a, b) = (a_def.values(lora_seed(spec)), b_def.values(lora_seed(spec)));
    let plan = tensor_plan(spec);
    let w_def = plan.iter().find(|d| d.name == LORA_TARGET).ok_or_else(|| io::Error::other("no LoRA target"))?;
    let w = w_def.values(spec.seed);
    let (n, rank) = (spec.n_embd as usize, merge.rank as usize);
    // llama_adapter_lora_weight::get_scale, where rank = ne[0] of B.
    let s = if merge.alpha != 0.0 {
        f64::from(merge.scale) * f64::from(merge.alpha) / rank as f64
    } else {
        f64::from(merge.scale)
    };
    let mut out = Vec::with_capacity(w.len());
    for o in 0..n {
        for i in 0..n {
            // A is rank rows of n (a[r * n + i]), B is n rows of rank
            // (b[o * rank + r]).
            let ba: f64 = (0..rank).map(|r| f64::from(b[o * rank + r]) * f64::from(a[r * n + i])).sum();
            out.push((f64::from(w[o * n + i]) + s * ba) as f32);
        }
    }
    Ok(out)
}

/// Writes a rank-`rank` LoRA adapter for the tiny model of `spec`: low-rank
/// deltas `lora_a` (`n_embd` × `rank`) and `lora_b` (`rank` × `n_embd`) for
/// the query projection of layer 0, with alpha = rank (scale 1), values
/// from the spec's seed. Not atomic: write to a fresh path.
pub fn write_tiny_lora(path: &Path, spec: &TinyModelSpec, rank: u32) -> io::Result<()> {
    write_tiny_lora_with_alpha(path, spec, rank, rank as f32)
}

/// [`write_tiny_lora`] with `adapter.lora.alpha` = `alpha`, so that
/// llama.cpp scales the adapter by `alpha / rank` times the user's scale.
///
/// # Errors
/// As [`write_tiny_lora`]; [`io::ErrorKind::InvalidInput`] for an alpha
/// that is not finite.
pub fn write_tiny_lora_with_alpha(path: &Path, spec: &TinyModelSpec, rank: u32, alpha: f32) -> io::Result<()> {
    validate(spec)?;
    let plan = lora_plan(spec, rank)?;
    if !alpha.is_finite() {
        return Err(invalid_input(format!("LoRA alpha {alpha} is not finite")));
    }
    let bytes = (spec.n_embd as usize) * (rank as usize) * 4;
    let mut w = GgufWriter::new(2 * GgufWriter::pool_bytes(bytes))?;
    w.set_str("general.architecture", "llama")?;
    w.set_str("general.type", "adapter")?;
    w.set_str("adapter.type", "lora")?;
    w.set_f32("adapter.lora.alpha", alpha)?;
    for def in &plan {
        w.add_f32_tensor(&def.name, &def.ne, &def.values(lora_seed(spec)))?;
    }
    w.write(path)
}

/// The id of a normal piece, for tests; `None` if it is not in the table.
#[cfg(test)]
fn normal_piece_id(piece: &str) -> Option<usize> {
    NORMAL_PIECES.iter().position(|p| *p == piece).map(|i| FIRST_NORMAL_ID + i)
}

#[cfg(test)]
mod tests;
