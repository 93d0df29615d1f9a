//! Loading GGUF models and reading what they are.

use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};
use crate::llama::extensions::Extensions;
use crate::llama::ffi::{self, path_to_cstring};
use crate::llama::vocab::Vocab;
use crate::sys;

mod load;
mod offload;
mod params;
mod preflight;
mod remote;

pub(crate) use load::check_gguf_file;
pub(crate) use remote::Remote;

pub use params::{DEFAULT_FIT_MARGIN, GpuLayers, LoadMode, MetadataValue, ModelParams, SplitMode};

/// How a model applies rotary position embeddings (RoPE).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    /// No RoPE.
    None,
    /// Original (GPT-J style, adjacent pairs).
    Normal,
    /// GPT-NeoX style (halves).
    Neox,
    /// Multi-section RoPE (vision-language models).
    MRope,
    /// Interleaved multi-section RoPE.
    InterleavedMRope,
    /// Vision encoders.
    Vision,
    /// A value newer than this crate.
    Other(i32),
}

/// The file name of split `split_no` (1-based) of `split_count` for a
/// model named `prefix`: `<prefix>-00002-of-00004.gguf`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a NUL byte or an out-of-range number.
#[doc(alias = "llama_split_path")]
pub fn split_path(prefix: &str, split_no: u32, split_count: u32) -> Result<String> {
    if split_no == 0 || split_no > split_count || split_count > 99_999 {
        return Err(Error::InvalidArgument(format!("split {split_no} of {split_count} is out of range")));
    }
    let c_prefix = CString::new(prefix)?;
    read_string(|buf, len| {
        // SAFETY: `buf` is valid for `len` bytes and the prefix is
        // NUL-terminated; llama.cpp writes with snprintf. Split numbers are
        // 0-based in C.
        unsafe { sys::llama_split_path(buf, len, c_prefix.as_ptr(), (split_no - 1) as i32, split_count as i32) }
    })
    .ok_or_else(|| Error::InvalidArgument("llama_split_path failed".into()))
}

/// The model prefix of a split file name, if `path` is split `split_no`
/// (1-based) of `split_count`: the inverse of [`split_path`].
#[doc(alias = "llama_split_prefix")]
pub fn split_prefix(path: &str, split_no: u32, split_count: u32) -> Option<String> {
    if split_no == 0 || split_no > split_count || split_count > 99_999 {
        return None;
    }
    let c_path = CString::new(path).ok()?;
    let prefix = read_string(|buf, len| {
        // SAFETY: as in `split_path`; llama.cpp returns 0 when the name does
        // not end with the expected postfix.
        unsafe { sys::llama_split_prefix(buf, len, c_path.as_ptr(), (split_no - 1) as i32, split_count as i32) }
    })?;
    (!prefix.is_empty()).then_some(prefix)
}

/// The files and parameters a [`Model`] was loaded from.
#[derive(Clone, Debug)]
pub(crate) struct Source {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) params: ModelParams,
}

/// A loaded GGUF model: weights, hyper-parameters and vocabulary.
///
/// Immutable once loaded and shareable between threads (`Send + Sync`):
/// wrap it in an `Arc` or borrow it, and give each thread its own
/// [`Context`](crate::Context).
#[derive(Debug)]
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    vocab: Vocab,
    /// Loaded with `vocab_only`: no weights, so no context can run it.
    vocab_only: bool,
    /// Loaded with `no_alloc` for the memory plan: tensors without data.
    simulated: bool,
    /// Where and how it was loaded, so that the memory plan can load the
    /// same metadata again ([`crate::plan::Planner::for_model`]).
    source: Source,
    /// Loaded with `repack_weights`: weights may not be readable back.
    repacked: bool,
    /// The metadata overrides it was loaded with, rendered as llama.cpp
    /// renders metadata values: what [`Model::metadata`] reports for them.
    overridden: Vec<(String, String)>,
    /// The model's LoRA adapter set: LoRA init and free change it
    /// (write), context creation and every decode may iterate it when
    /// llama.cpp sizes its compute graph (read, `graph_max_nodes`).
    adapters: RwLock<()>,
    /// The caches upper floors build from the model (the default chat
    /// format, the constraint table of the vocabulary), each built on first
    /// use and shared by every later one.
    extensions: Extensions,
    /// The RPC workers it uses, if any (dropped after the model is freed).
    remote: Remote,
}

// SAFETY: llama.cpp supports one model shared by many threads, each with its
// own context: that is what upstream tests/test-thread-safety.cpp does
// (contexts created and decoded concurrently on one model). Every `&self`
// method here is a read of immutable model data (llama-cpp-c-api.md §1.17:
// "metadata and vocab getters are pure reads"; tokenization is documented
// thread-safe); the calls that mutate the model (LoRA init/free) take the
// write side of `adapters`, the calls that read the adapter set (context
// creation, decode, encode) its read side, and freeing needs ownership.
unsafe impl Send for Model {}
// SAFETY: see `Send` above.
unsafe impl Sync for Model {}

impl Model {
    /// The RPC workers the model's layers live on, if any.
    pub(crate) fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Shared access to the model's LoRA adapter set, for the calls that
    /// iterate it. A poisoned lock is still usable: the guarded data is
    /// llama.cpp's, which a Rust panic cannot leave half-changed.
    pub(crate) fn adapters_read(&self) -> RwLockReadGuard<'_, ()> {
        self.adapters.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access to the model's LoRA adapter set, to change it.
    pub(crate) fn adapters_write(&self) -> RwLockWriteGuard<'_, ()> {
        self.adapters.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The raw pointer, for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    /// The caches upper floors keep for this model, one per type.
    pub(crate) fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// The model's vocabulary and tokenizer.
    #[doc(alias = "llama_model_get_vocab")]
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Loaded with `no_alloc` for the memory plan.
    pub(crate) fn is_simulated(&self) -> bool {
        self.simulated
    }

    /// The files and parameters it was loaded from.
    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// Whether the model was loaded with
    /// [`ModelParams::vocab_only`](field@ModelParams::vocab_only): it can
    /// tokenize, but [`Context::new`](crate::Context::new) refuses it.
    pub fn is_vocab_only(&self) -> bool {
        self.vocab_only
    }

    /// The context length the model was trained with.
    #[doc(alias = "llama_model_n_ctx_train")]
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_ctx_train(self.as_ptr()) }.max(0) as u32
    }

    /// The embedding width.
    #[doc(alias = "llama_model_n_embd")]
    pub fn n_embd(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_embd(self.as_ptr()) }.max(0) as usize
    }

    /// The width of the embeddings the context outputs.
    #[doc(alias = "llama_model_n_embd_out")]
    pub fn n_embd_out(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_embd_out(self.as_ptr()) }.max(0) as usize
    }

    /// The number of layers.
    #[doc(alias = "llama_model_n_layer")]
    pub fn n_layer(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_layer(self.as_ptr()) }.max(0) as usize
    }

    /// The layers this model's load asked llama.cpp to offload, with
    /// [`GpuLayers::Fit`] or [`GpuLayers::Within`] resolved to the count
    /// the fit chose: at most `n_layer() + 1` (the output layer counts).
    /// Only layers that have a device other than the CPU to go to move:
    /// in a CPU-only build everything stays on the host whatever the
    /// count (and [`GpuLayers::Fit`] resolves to 0 there).
    pub fn n_gpu_layers(&self) -> usize {
        let all = self.n_layer() + 1;
        match self.source.params.gpu_layers {
            GpuLayers::Count(n) => (n as usize).min(all),
            _ => all,
        }
    }

    /// The number of attention heads.
    #[doc(alias = "llama_model_n_head")]
    pub fn n_head(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_head(self.as_ptr()) }.max(0) as usize
    }

    /// The number of key/value heads (smaller than [`Model::n_head`] with GQA).
    #[doc(alias = "llama_model_n_head_kv")]
    pub fn n_head_kv(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_head_kv(self.as_ptr()) }.max(0) as usize
    }

    /// The sliding-window size, 0 if the model has no sliding-window attention.
    #[doc(alias = "llama_model_n_swa")]
    pub fn n_swa(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_swa(self.as_ptr()) }.max(0) as usize
    }

    /// The number of parameters.
    #[doc(alias = "llama_model_n_params")]
    pub fn n_params(&self) -> u64 {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_params(self.as_ptr()) }
    }

    /// The total size of the weights in bytes.
    #[doc(alias = "llama_model_size")]
    pub fn size(&self) -> u64 {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_size(self.as_ptr()) }
    }

    /// A one-line description, e.g. `gemma3 270M Q4_K - Medium`.
    #[doc(alias = "llama_model_desc")]
    pub fn description(&self) -> String {
        read_string(|buf, len| {
            // SAFETY: `buf` is valid for `len` bytes; the function writes at
            // most `len` bytes including the NUL.
            unsafe { sys::llama_model_desc(self.as_ptr(), buf, len) }
        })
        .unwrap_or_default()
    }

    /// One GGUF metadata value, as a string, or `None` if the key is absent.
    /// A key given in
    /// [`ModelParams::metadata_overrides`](field@ModelParams::metadata_overrides)
    /// reports the override (llama.cpp's own metadata view keeps the
    /// file's value, although the model uses the override).
    #[doc(alias = "llama_model_meta_val_str")]
    pub fn metadata(&self, key: &str) -> Option<String> {
        if let Some((_, value)) = self.overridden.iter().find(|(k, _)| k == key) {
            return Some(value.clone());
        }
        let key = CString::new(key).ok()?;
        read_string(|buf, len| {
            // SAFETY: `key` is NUL-terminated; `buf` is valid for `len` bytes.
            unsafe { sys::llama_model_meta_val_str(self.as_ptr(), key.as_ptr(), buf, len) }
        })
    }

    /// All GGUF metadata as `(key, value)` pairs sorted by key, values
    /// rendered as strings (array values are left out by llama.cpp), with
    /// the
    /// [`ModelParams::metadata_overrides`](field@ModelParams::metadata_overrides)
    /// applied as in [`Model::metadata`].
    #[doc(alias = "llama_model_meta_count")]
    pub fn metadata_entries(&self) -> Vec<(String, String)> {
        // SAFETY: a pure read of a live model.
        let count = unsafe { sys::llama_model_meta_count(self.as_ptr()) };
        let mut entries: Vec<(String, String)> = (0..count)
            .filter_map(|i| {
                let key = read_string(|buf, len| {
                    // SAFETY: `i < count`; `buf` is valid for `len` bytes.
                    unsafe { sys::llama_model_meta_key_by_index(self.as_ptr(), i, buf, len) }
                })?;
                let value = read_string(|buf, len| {
                    // SAFETY: as above.
                    unsafe { sys::llama_model_meta_val_str_by_index(self.as_ptr(), i, buf, len) }
                })?;
                Some((key, value))
            })
            .collect();
        for (key, value) in &self.overridden {
            match entries.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1.clone_from(value),
                None => entries.push((key.clone(), value.clone())),
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
    }

    /// The model's chat template (`name` `None` for the default one), as
    /// stored in its metadata (`tokenizer.chat_template[.name]`), or as
    /// given in
    /// [`ModelParams::metadata_overrides`](field@ModelParams::metadata_overrides).
    /// `None` if it has none (base models often do not).
    #[doc(alias = "llama_model_chat_template")]
    pub fn chat_template(&self, name: Option<&str>) -> Option<&str> {
        let key = match name {
            None => "tokenizer.chat_template".to_owned(),
            Some(n) => format!("tokenizer.chat_template.{n}"),
        };
        if let Some((_, value)) = self.overridden.iter().find(|(k, _)| *k == key) {
            return Some(value);
        }
        let name = match name {
            Some(n) => Some(CString::new(n).ok()?),
            None => None,
        };
        let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        // SAFETY: `name_ptr` is NULL or NUL-terminated. The result points
        // into the model's metadata (or a static string) and lives as long
        // as the model, which `&self` outlives.
        let ptr = unsafe { sys::llama_model_chat_template(self.as_ptr(), name_ptr) };
        // SAFETY: NULL or NUL-terminated, living as long as `self`.
        unsafe { ffi::borrowed_str(ptr) }
    }

    /// Whether the model has an encoder (T5-like).
    #[doc(alias = "llama_model_has_encoder")]
    pub fn has_encoder(&self) -> bool {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_has_encoder(self.as_ptr()) }
    }

    /// Whether the model has a decoder.
    #[doc(alias = "llama_model_has_decoder")]
    pub fn has_decoder(&self) -> bool {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_has_decoder(self.as_ptr()) }
    }

    /// The token that starts decoding in encoder-decoder models.
    #[doc(alias = "llama_model_decoder_start_token")]
    pub fn decoder_start_token(&self) -> Option<crate::llama::types::Token> {
        // SAFETY: a pure read of a live model.
        let t = unsafe { sys::llama_model_decoder_start_token(self.as_ptr()) };
        (t >= 0).then_some(crate::llama::types::Token(t))
    }

    /// Whether the model is recurrent (Mamba, RWKV, …).
    #[doc(alias = "llama_model_is_recurrent")]
    pub fn is_recurrent(&self) -> bool {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_is_recurrent(self.as_ptr()) }
    }

    /// Whether the model mixes attention and recurrent layers.
    #[doc(alias = "llama_model_is_hybrid")]
    pub fn is_hybrid(&self) -> bool {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_is_hybrid(self.as_ptr()) }
    }

    /// The width of the input embeddings (differs from [`Model::n_embd`]
    /// in a few architectures).
    #[doc(alias = "llama_model_n_embd_inp")]
    pub fn n_embd_inp(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_embd_inp(self.as_ptr()) }.max(0) as usize
    }

    /// The number of next-token-prediction (MTP) layers.
    #[doc(alias = "llama_model_n_layer_nextn")]
    pub fn n_layer_nextn(&self) -> usize {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_n_layer_nextn(self.as_ptr()) }.max(0) as usize
    }

    /// How the model applies rotary position embeddings.
    #[doc(alias = "llama_model_rope_type")]
    pub fn rope_type(&self) -> RopeType {
        use sys::llama_rope_type as r;
        // SAFETY: a pure read of a live model.
        match unsafe { sys::llama_model_rope_type(self.as_ptr()) } {
            r::LLAMA_ROPE_TYPE_NONE => RopeType::None,
            r::LLAMA_ROPE_TYPE_NORM => RopeType::Normal,
            r::LLAMA_ROPE_TYPE_NEOX => RopeType::Neox,
            r::LLAMA_ROPE_TYPE_MROPE => RopeType::MRope,
            r::LLAMA_ROPE_TYPE_IMROPE => RopeType::InterleavedMRope,
            r::LLAMA_ROPE_TYPE_VISION => RopeType::Vision,
            other => RopeType::Other(other),
        }
    }

    /// Whether the model is a diffusion model.
    #[doc(alias = "llama_model_is_diffusion")]
    pub fn is_diffusion(&self) -> bool {
        // SAFETY: a pure read of a live model.
        unsafe { sys::llama_model_is_diffusion(self.as_ptr()) }
    }

    /// Writes the model to a GGUF file. The file appears under its name only
    /// once it is complete.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a model loaded vocab-only or with
    /// [`ModelParams::repack_weights`](field@ModelParams::repack_weights)
    /// on (the default): the CPU backend's repacked weight buffers cannot
    /// be read back, and llama.cpp would call through a null pointer.
    /// [`Error::Exception`] if llama.cpp throws, [`Error::Io`] if the file
    /// cannot be moved into place.
    #[doc(alias = "llama_model_save_to_file")]
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        // Reading the weights back goes through the workers' connections.
        self.remote.check()?;
        if self.vocab_only || self.repacked {
            return Err(Error::InvalidArgument(
                "only a model loaded with vocab_only: false and repack_weights: false can be saved".into(),
            ));
        }
        let path = path.as_ref();
        let temp = temp_sibling(path)?;
        let c_temp = path_to_cstring(&temp)?;
        // SAFETY: a live model and a NUL-terminated path; the shim catches
        // exceptions.
        let code = unsafe { sys::shim::llama_rs_model_save_to_file(self.as_ptr(), c_temp.as_ptr()) };
        // On an error, dropping `temp` removes the partial file.
        crate::llama::ffi::check_shim(code, "llama_model_save_to_file")?;
        publish(temp, path)
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if self.remote.is_remote() {
            // Freeing sends to the workers: guarded. A model on a lost
            // worker is leaked instead (its buffers live behind the dead
            // connection, and llama.cpp would abort or wait for ever).
            if !self.remote.is_lost() {
                let ptr = crate::llama::thread::SendPtr(self.ptr.as_ptr());
                // SAFETY: as below, on the guarded thread.
                let _ = self.remote.run_once("freeing the model", false, move || unsafe {
                    let ptr = ptr;
                    sys::llama_model_free(ptr.0)
                });
            }
            return;
        }
        // SAFETY: we own the model; no context or adapter can outlive it
        // (they borrow it), so nothing uses the pointer after this.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// A new, unique file beside `path` (created empty) to write before an atomic rename over `path`: two writers of the
/// same path, in one process or two, never share one. Removed when dropped
/// unless [`tempfile::TempPath::persist`]ed.
///
/// # Errors
/// [`Error::Io`] if the folder does not exist or is not writable.
pub(crate) fn temp_sibling(path: &Path) -> Result<tempfile::TempPath> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    // The published file gets the mode any new file gets (0666 less the
    // umask), not tempfile's private 0600.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let file = builder.tempfile_in(dir).map_err(|e| Error::io(path, e))?;
    Ok(file.into_temp_path())
}

/// Renames the written `temp` over `path`.
pub(crate) fn publish(temp: tempfile::TempPath, path: &Path) -> Result<()> {
    temp.persist(path).map_err(|e| Error::io(path, e.error))
}

/// Calls an snprintf-style function (returns the full length or a negative
/// value), growing the buffer once if needed.
pub(crate) fn read_string(mut f: impl FnMut(*mut c_char, usize) -> i32) -> Option<String> {
    let mut buf = vec![0u8; 256];
    for _ in 0..2 {
        let n = f(buf.as_mut_ptr().cast(), buf.len());
        if n < 0 {
            return None;
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
        buf.resize(n + 1, 0);
    }
    None
}

#[cfg(test)]
mod temp_tests {
    use super::*;

    /// Two writers of one path (threads of one process: the same pid)
    /// write different files, each removed unless published.
    #[test]
    fn writers_of_one_path_get_their_own_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("model.gguf");
        let (a, b) = (temp_sibling(&target).unwrap(), temp_sibling(&target).unwrap());
        assert_ne!(a.to_path_buf(), b.to_path_buf());
        assert_eq!(a.parent(), Some(dir.path()));
        std::fs::write(&a, b"a").unwrap();
        publish(a, &target).unwrap();
        let b_path = b.to_path_buf();
        drop(b);
        assert!(!b_path.exists(), "an unpublished file is removed");
        assert_eq!(std::fs::read(&target).unwrap(), b"a");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
