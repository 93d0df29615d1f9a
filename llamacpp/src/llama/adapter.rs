//! LoRA adapters and control vectors.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::llama::context::Context;
use crate::llama::ffi::check_shim;
use crate::llama::ffi::path_to_cstring;
use crate::llama::model::{Model, read_string};
use crate::sys;

/// A LoRA adapter loaded for one model.
///
/// It borrows the model (llama.cpp registers the adapter inside the model),
/// and a context it is set on borrows the adapter, so neither can be freed
/// while in use.
pub struct LoraAdapter<'m> {
    ptr: NonNull<sys::llama_adapter_lora>,
    model: &'m Model,
}

// SAFETY: the adapter's weights are read-only once loaded; freeing is
// serialised through the model's adapter lock and needs ownership.
unsafe impl Send for LoraAdapter<'_> {}
// SAFETY: `&LoraAdapter` only allows reads of metadata.
unsafe impl Sync for LoraAdapter<'_> {}

impl fmt::Debug for LoraAdapter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoraAdapter").field("ptr", &self.ptr).finish()
    }
}

impl Model {
    /// Loads a LoRA adapter (GGUF) made for this model.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read; [`Error::Adapter`] if
    /// llama.cpp rejects it (wrong format or base model);
    /// [`Error::Unsupported`] for a model with layers on RPC workers.
    #[doc(alias = "llama_adapter_lora_init")]
    pub fn load_lora(&self, path: impl AsRef<std::path::Path>) -> Result<LoraAdapter<'_>> {
        if self.remote().is_remote() {
            // The adapter's tensors would go to the workers' devices through
            // calls that are not guarded against a dying worker.
            return Err(Error::Unsupported("LoRA adapters on a model with layers on RPC workers".into()));
        }
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if !meta.is_file() || meta.len() == 0 {
            return Err(Error::Adapter(format!("{} is not a LoRA GGUF file", path.display())));
        }
        let c_path = path_to_cstring(path)?;
        let _guard = self.adapters_write();
        crate::llama::backend::clear_last_error();
        // SAFETY: a live model and a NUL-terminated path; the call mutates
        // the model's adapter set, which the write lock serialises against
        // every reader of the set (context creation, decode). It
        // catches its own exceptions and returns NULL.
        let ptr = unsafe { sys::llama_adapter_lora_init(self.as_ptr(), c_path.as_ptr()) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::Adapter(crate::llama::backend::last_error_or(&format!(
                "cannot load LoRA adapter {}",
                path.display()
            )))
        })?;
        Ok(LoraAdapter { ptr, model: self })
    }
}

impl LoraAdapter<'_> {
    /// One GGUF metadata value of the adapter.
    #[doc(alias = "llama_adapter_meta_val_str")]
    pub fn metadata(&self, key: &str) -> Option<String> {
        let key = std::ffi::CString::new(key).ok()?;
        read_string(|buf, len| {
            // SAFETY: a live adapter; `buf` is valid for `len` bytes.
            unsafe { sys::llama_adapter_meta_val_str(self.ptr.as_ptr(), key.as_ptr(), buf, len) }
        })
    }

    /// The activation tokens of an aLoRA adapter (empty for plain LoRA).
    #[doc(alias = "llama_adapter_get_alora_invocation_tokens")]
    pub fn alora_invocation_tokens(&self) -> &[crate::llama::types::Token] {
        // SAFETY: the array lives in the adapter, which `&self` keeps alive.
        unsafe {
            let n = sys::llama_adapter_get_alora_n_invocation_tokens(self.ptr.as_ptr()) as usize;
            let p = sys::llama_adapter_get_alora_invocation_tokens(self.ptr.as_ptr());
            if n == 0 || p.is_null() { &[] } else { std::slice::from_raw_parts(p.cast(), n) }
        }
    }
}

impl Drop for LoraAdapter<'_> {
    fn drop(&mut self) {
        let _guard = self.model.adapters_write();
        // SAFETY: the model is alive (borrowed), no context still uses the
        // adapter (contexts borrow it), and the write lock serialises the
        // change of the model's adapter set against its readers.
        unsafe { sys::llama_adapter_lora_free(self.ptr.as_ptr()) }
    }
}

impl<'m> Context<'m> {
    /// Replaces the active LoRA adapters with `adapters` (each with its
    /// scale); an empty slice removes them all. The context borrows the
    /// adapters for as long as it lives.
    ///
    /// # Errors
    /// [`Error::Adapter`] for an adapter of another model or a non-finite
    /// scale; [`Error::Exception`] if llama.cpp throws.
    #[doc(alias = "llama_set_adapters_lora")]
    pub fn set_lora_adapters(&mut self, adapters: &[(&'m LoraAdapter<'m>, f32)]) -> Result<()> {
        self.check_reachable()?;
        let model = self.model().as_ptr();
        let mut ptrs = Vec::with_capacity(adapters.len());
        let mut scales = Vec::with_capacity(adapters.len());
        for (adapter, scale) in adapters {
            if adapter.model.as_ptr() != model {
                return Err(Error::Adapter("the LoRA adapter was loaded for another model".into()));
            }
            if !scale.is_finite() {
                return Err(Error::Adapter(format!("LoRA scale {scale} is not finite")));
            }
            ptrs.push(adapter.ptr.as_ptr());
            scales.push(*scale);
        }
        let (p, s) = if adapters.is_empty() {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (ptrs.as_mut_ptr(), scales.as_mut_ptr())
        };
        let mut ret = 0;
        // SAFETY: arrays of `len` adapters of this context's model (or NULL
        // with 0); the context stores the pointers, and the `'m` borrow
        // keeps the adapters alive as long as the context. The shim catches
        // exceptions.
        let code = unsafe { sys::shim::llama_rs_set_adapters_lora(self.as_ptr(), p, ptrs.len(), s, &mut ret) };
        check_shim(code, "llama_set_adapters_lora")?;
        if ret != 0 {
            return Err(Error::Adapter(format!("llama_set_adapters_lora returned {ret}")));
        }
        Ok(())
    }

    /// Applies a control vector: `data` holds `n_embd` floats for each
    /// layer from 1 on (layer 0 has none), applied to layers
    /// `layer_start..=layer_end`. The data is copied.
    ///
    /// # Errors
    /// [`Error::Adapter`] if `data` is not a whole number of `n_embd` rows.
    #[doc(alias = "llama_set_adapter_cvec")]
    pub fn set_control_vector(&mut self, data: &[f32], layer_start: i32, layer_end: i32) -> Result<()> {
        self.check_reachable()?;
        let n_embd = self.model().n_embd();
        if data.is_empty() || n_embd == 0 || !data.len().is_multiple_of(n_embd) {
            return Err(Error::Adapter(format!(
                "control vector length {} is not a multiple of n_embd {n_embd}",
                data.len()
            )));
        }
        // SAFETY: `data` is readable for its length and copied; n_embd
        // matches the model.
        let ret = unsafe {
            sys::llama_set_adapter_cvec(self.as_ptr(), data.as_ptr(), data.len(), n_embd as i32, layer_start, layer_end)
        };
        if ret != 0 {
            return Err(Error::Adapter(crate::llama::backend::last_error_or("llama_set_adapter_cvec failed")));
        }
        Ok(())
    }

    /// Turns the control vector off.
    pub fn clear_control_vector(&mut self) {
        if self.check_reachable().is_err() {
            return; // nothing may reach the lost worker's buffers
        }
        // SAFETY: NULL data disables the control vector.
        unsafe { sys::llama_set_adapter_cvec(self.as_ptr(), std::ptr::null(), 0, 0, -1, -1) };
    }
}
