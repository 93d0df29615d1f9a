//! Saving and restoring the KV cache of a [`Context`], whole or per
//! sequence, to bytes or files.
//!
//! Saved state holds the KV cache only, **not the logits** of the last
//! decode. After a restore, decode the last token again before sampling:
//! [`Context::redecode_last`] does exactly that.

use std::path::Path;

use crate::error::StateError;
use crate::error::{Error, Result, try_reserve};
use crate::llama::batch::{Batch, Logits};
use crate::llama::context::Context;
use crate::llama::ffi::path_to_cstring;
use crate::llama::model::{publish, temp_sibling};
use crate::llama::types::{SeqId, Token};
use crate::sys;

/// Writes a file through `write(temp)` and renames it into place, so a
/// failure never leaves a half-written file under `path`.
fn write_atomically(path: &Path, write: impl FnOnce(&std::ffi::CStr) -> bool, what: &str) -> Result<()> {
    let temp = temp_sibling(path)?;
    let c_temp = path_to_cstring(&temp)?;
    if !write(&c_temp) {
        // Dropping `temp` removes the partial file.
        return Err(Error::state(
            StateError::Failed,
            format!("llama.cpp could not write the {what} to {}", path.display()),
        ));
    }
    publish(temp, path)
}

/// Checks that `state` (the state part of a whole-context save) starts with
/// the architecture name of `ctx`'s model. llama.cpp reads that name's
/// length and allocates it (up to 4 GiB, zero-filled) before comparing, so
/// foreign or corrupt bytes would make it allocate gigabytes to reject them.
fn check_arch_prefix(ctx: &Context<'_>, state: &[u8]) -> Result<()> {
    let arch = ctx.model().metadata("general.architecture").unwrap_or_default();
    let len = state.get(..4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if len != Some(arch.len()) || state.get(4..4 + arch.len()) != Some(arch.as_bytes()) {
        return Err(Error::state(
            StateError::Mismatch,
            format!("the state was not saved from a `{arch}` model (or is corrupt)"),
        ));
    }
    Ok(())
}

/// The same check for a file written by `llama_state_save_file`: magic,
/// version, token count, tokens, then the state.
fn check_state_file(ctx: &Context<'_>, path: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e| Error::io(path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut header = [0u8; 12];
    let bad = || Error::state(StateError::Mismatch, format!("{} is not a state file of this model", path.display()));
    file.read_exact(&mut header).map_err(|_| bad())?;
    let word = |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    if word(0) != sys::LLAMA_SESSION_MAGIC || word(4) != sys::LLAMA_SESSION_VERSION {
        return Err(bad());
    }
    let n_tokens = u64::from(word(8));
    if n_tokens > u64::from(ctx.n_ctx()) {
        return Err(Error::state(
            StateError::TooLarge,
            format!("{} holds {n_tokens} tokens, more than the context's {}", path.display(), ctx.n_ctx()),
        ));
    }
    file.seek(SeekFrom::Start(12 + 4 * n_tokens)).map_err(io)?;
    let arch_len = ctx.model().metadata("general.architecture").map_or(0, |a| a.len());
    let mut prefix = Vec::with_capacity(4 + arch_len);
    file.take(4 + arch_len as u64).read_to_end(&mut prefix).map_err(io)?;
    check_arch_prefix(ctx, &prefix).map_err(|_| bad())
}

/// A recurrent model's cache holds one state per sequence, so a saved
/// sequence has at most one cell; for more, llama.cpp's restore places them
/// in one cell and asserts (`GGML_ASSERT(head + cell_count <= size)` and
/// the position checks after it in llama-memory-recurrent.cpp) once the
/// context has room for two (`n_seq_max` of 2 or more; with one, it refuses
/// them itself). A pure recurrent model's cache state (`state`:
/// after the magic and sequence id of `llama_state_seq_get_data`) starts
/// with that cell count. A hybrid model's starts with its attention
/// cache, whose length cannot be told from the bytes, so its sequence
/// states are refused where the assert is reachable.
fn check_recurrent_seq_state(ctx: &Context<'_>, state: &[u8]) -> Result<()> {
    let model = ctx.model();
    if model.is_hybrid() && ctx.n_seq_max() >= 2 {
        return Err(Error::state(
            StateError::Unsupported,
            "restoring one sequence of a hybrid (attention + recurrent) model needs n_seq_max 1: llama.cpp cannot \
             check such data before it asserts on it",
        ));
    }
    if model.is_recurrent() && !model.is_hybrid() {
        let cells = state.get(..4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        if cells.is_some_and(|n| n > 1) {
            return Err(Error::state(
                StateError::Mismatch,
                format!(
                    "a recurrent model's sequence state holds one cell, this one {}: corrupt data",
                    cells.unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// [`check_recurrent_seq_state`] for a file written by
/// `llama_state_seq_save_file`: magic, version, token count, tokens, then
/// the sequence state. Files that fail the header checks are left to
/// llama.cpp, which refuses them.
fn check_recurrent_seq_state_file(ctx: &Context<'_>, path: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    if !ctx.model().is_recurrent() && !ctx.model().is_hybrid() {
        return Ok(());
    }
    let io = |e| Error::io(path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut header = [0u8; 12];
    if file.read_exact(&mut header).is_err() {
        return Ok(());
    }
    let word = |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    if word(0) != sys::LLAMA_STATE_SEQ_MAGIC || word(4) != sys::LLAMA_STATE_SEQ_VERSION {
        return Ok(());
    }
    file.seek(SeekFrom::Start(12 + 4 * u64::from(word(8)))).map_err(io)?;
    let mut state = Vec::with_capacity(4);
    file.take(4).read_to_end(&mut state).map_err(io)?;
    check_recurrent_seq_state(ctx, &state)
}

fn check_readable(path: &Path) -> Result<std::ffi::CString> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::state(StateError::Mismatch, format!("{} is not a file", path.display())));
    }
    Ok(path_to_cstring(path)?)
}

impl Context<'_> {
    /// The size in bytes of the whole state right now.
    #[doc(alias = "llama_state_get_size")]
    pub fn state_size(&mut self) -> usize {
        if self.check_reachable().is_err() {
            return 0;
        }
        // SAFETY: a live context we hold exclusively.
        unsafe { sys::llama_state_get_size(self.as_ptr()) }
    }

    /// The whole state (every sequence's KV cache) as bytes.
    ///
    /// # Errors
    /// [`Error::State`] if llama.cpp fails to serialise it.
    #[doc(alias = "llama_state_get_data")]
    pub fn save_state(&mut self) -> Result<Vec<u8>> {
        self.check_reachable()?;
        let size = self.state_size();
        let mut buf = Vec::new();
        try_reserve(&mut buf, size)?;
        buf.resize(size, 0);
        // SAFETY: `buf` has `size` writable bytes.
        let written = unsafe { sys::llama_state_get_data(self.as_ptr(), buf.as_mut_ptr(), size) };
        if written == 0 && size != 0 {
            return Err(Error::state(StateError::Failed, "llama_state_get_data failed"));
        }
        buf.truncate(written);
        Ok(buf)
    }

    /// Restores a state saved by [`Context::save_state`]. The logits are not
    /// restored.
    ///
    /// # Errors
    /// [`Error::State`] when the bytes do not fit this context (another
    /// model, KV type or size, or corrupt data). The cache is then either
    /// unchanged or partly overwritten: clear it or load another state
    /// before decoding.
    #[doc(alias = "llama_state_set_data")]
    pub fn load_state(&mut self, data: &[u8]) -> Result<()> {
        self.check_reachable()?;
        check_arch_prefix(self, data)?;
        self.invalidate_outputs();
        self.bump_epoch(None);
        // SAFETY: `data` is readable for its length; llama.cpp validates the
        // content and catches its own exceptions.
        let read = unsafe { sys::llama_state_set_data(self.as_ptr(), data.as_ptr(), data.len()) };
        if read == 0 {
            return Err(Error::state(
                StateError::Mismatch,
                "the state does not fit this context (model or configuration differ, or the data is corrupt)",
            ));
        }
        Ok(())
    }

    /// Saves the whole state and `tokens` (the tokens it holds) to a file.
    ///
    /// # Errors
    /// [`Error::State`] or [`Error::Io`]; no partial file is left behind.
    #[doc(alias = "llama_state_save_file")]
    pub fn save_state_file(&mut self, path: impl AsRef<Path>, tokens: &[Token]) -> Result<()> {
        self.check_reachable()?;
        let ctx = self.as_ptr();
        write_atomically(
            path.as_ref(),
            // SAFETY: a NUL-terminated path and `tokens.len()` readable
            // tokens (`Token` is a transparent i32).
            |c_path| unsafe { sys::llama_state_save_file(ctx, c_path.as_ptr(), tokens.as_ptr().cast(), tokens.len()) },
            "state",
        )
    }

    /// Restores a state file written by [`Context::save_state_file`] and
    /// returns the tokens saved with it.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read, [`Error::State`] if it does
    /// not fit this context.
    #[doc(alias = "llama_state_load_file")]
    pub fn load_state_file(&mut self, path: impl AsRef<Path>) -> Result<Vec<Token>> {
        self.check_reachable()?;
        let path = path.as_ref();
        let c_path = check_readable(path)?;
        check_state_file(self, path)?;
        self.invalidate_outputs();
        self.bump_epoch(None);
        let mut tokens = vec![Token(0); self.n_ctx() as usize];
        let mut count = 0usize;
        // SAFETY: a NUL-terminated path; `tokens` has room for its length.
        let ok = unsafe {
            sys::llama_state_load_file(
                self.as_ptr(),
                c_path.as_ptr(),
                tokens.as_mut_ptr().cast(),
                tokens.len(),
                &mut count,
            )
        };
        if !ok {
            return Err(Error::state(
                StateError::Mismatch,
                format!("{} is not a state of this model and configuration", path.display()),
            ));
        }
        tokens.truncate(count);
        Ok(tokens)
    }

    /// The KV cache of one sequence as bytes.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::State`] if serialising fails.
    #[doc(alias = "llama_state_seq_get_data")]
    pub fn save_seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        // SAFETY: a valid sequence id.
        let size = unsafe { sys::llama_state_seq_get_size(self.as_ptr(), seq) };
        let mut buf = Vec::new();
        try_reserve(&mut buf, size)?;
        buf.resize(size, 0);
        // SAFETY: `buf` has `size` writable bytes; a valid sequence id.
        let written = unsafe { sys::llama_state_seq_get_data(self.as_ptr(), buf.as_mut_ptr(), size, seq) };
        if written == 0 && size != 0 {
            return Err(Error::state(StateError::Failed, "llama_state_seq_get_data failed"));
        }
        buf.truncate(written);
        Ok(buf)
    }

    /// Restores bytes from [`Context::save_seq_state`] into sequence `dest`
    /// (which may differ from the one saved). The data must come from a
    /// context with the same model, KV types and stream layout (one stream
    /// for a one-sequence or `kv_unified` context, one per sequence
    /// otherwise).
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::State`] when the data does not
    /// fit, after which sequence `dest` may have been emptied.
    #[doc(alias = "llama_state_seq_set_data")]
    pub fn load_seq_state(&mut self, data: &[u8], dest: SeqId) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(dest)?;
        // The cache's part follows llama.cpp's magic and the saved
        // sequence id (4 bytes each).
        check_recurrent_seq_state(self, data.get(8..).unwrap_or_default())?;
        self.invalidate_outputs();
        self.bump_epoch(Some(dest));
        let mut read = 0usize;
        // SAFETY: readable bytes, a valid destination, host-memory flags
        // only (ON_DEVICE is never passed); the shim catches exceptions.
        let code = unsafe {
            sys::shim::llama_rs_state_seq_set_data_ext(self.as_ptr(), data.as_ptr(), data.len(), dest, 0, &mut read)
        };
        crate::llama::ffi::check_shim(code, "llama_state_seq_set_data")?;
        if read == 0 {
            return Err(Error::state(StateError::Mismatch, "the sequence state does not fit this context"));
        }
        Ok(())
    }

    /// Saves one sequence and its `tokens` to a file.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`], [`Error::State`] or [`Error::Io`]; no
    /// partial file is left behind.
    #[doc(alias = "llama_state_seq_save_file")]
    pub fn save_seq_state_file(&mut self, path: impl AsRef<Path>, seq: SeqId, tokens: &[Token]) -> Result<()> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        let ctx = self.as_ptr();
        write_atomically(
            path.as_ref(),
            // SAFETY: a NUL-terminated path, a valid sequence id and
            // `tokens.len()` readable tokens.
            |c_path| unsafe {
                sys::llama_state_seq_save_file(ctx, c_path.as_ptr(), seq, tokens.as_ptr().cast(), tokens.len()) != 0
            },
            "sequence state",
        )
    }

    /// Restores a file from [`Context::save_seq_state_file`] into sequence
    /// `dest` and returns its tokens.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`], [`Error::Io`], or [`Error::State`] if it does
    /// not fit this context.
    #[doc(alias = "llama_state_seq_load_file")]
    pub fn load_seq_state_file(&mut self, path: impl AsRef<Path>, dest: SeqId) -> Result<Vec<Token>> {
        self.check_reachable()?;
        self.check_seq(dest)?;
        let path = path.as_ref();
        let c_path = check_readable(path)?;
        check_recurrent_seq_state_file(self, path)?;
        self.invalidate_outputs();
        self.bump_epoch(Some(dest));
        let mut tokens = vec![Token(0); self.n_ctx() as usize];
        let mut count = 0usize;
        // SAFETY: a NUL-terminated path, a valid sequence, and room for
        // `tokens.len()` tokens.
        let read = unsafe {
            sys::llama_state_seq_load_file(
                self.as_ptr(),
                c_path.as_ptr(),
                dest,
                tokens.as_mut_ptr().cast(),
                tokens.len(),
                &mut count,
            )
        };
        if read == 0 {
            return Err(Error::state(
                StateError::Mismatch,
                format!("{} is not a sequence state of this model and configuration", path.display()),
            ));
        }
        tokens.truncate(count);
        Ok(tokens)
    }

    /// After restoring a state whose sequence `seq` holds `tokens`, removes
    /// the last token from the cache and decodes it again, so that its
    /// logits are available at index 0 (or -1) for sampling.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty `tokens`;
    /// [`Error::InvalidSeqId`]; [`Error::State`] when the cache cannot
    /// remove the last token (a recurrent model's state: clear the sequence
    /// and decode all of `tokens` again instead); decode errors.
    pub fn redecode_last(&mut self, tokens: &[Token], seq: SeqId) -> Result<()> {
        self.check_reachable()?;
        let Some(&last) = tokens.last() else {
            return Err(Error::InvalidArgument("redecode_last needs at least one token".into()));
        };
        let pos = i32::try_from(tokens.len() - 1)
            .map_err(|_| Error::InvalidArgument(format!("{} tokens do not fit i32 positions", tokens.len())))?;
        if !self.seq_rm(Some(seq), Some(pos), None)? {
            return Err(Error::state(
                StateError::Unsupported,
                "redecode_last cannot remove the last token of a recurrent cache; clear the sequence and decode \
                 all its tokens again",
            ));
        }
        let mut batch = Batch::new(1, 1);
        batch.push(last, pos, &[seq], Logits::Yes)?;
        self.decode(&batch)
    }
}
