//! GGUF metadata read with ggml's own parser (metadata only, no tensor
//! data): what the model preflight checks and the memory plan read.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use crate::sys;

/// GGUF metadata read by ggml's parser, freed on drop.
pub(crate) struct Gguf(NonNull<sys::gguf_context>);

impl Drop for Gguf {
    fn drop(&mut self) {
        // SAFETY: we own the context, created by `gguf_init_from_file`.
        unsafe { sys::gguf_free(self.0.as_ptr()) }
    }
}

impl Gguf {
    pub(crate) fn open(path: &CStr) -> Option<Gguf> {
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        // SAFETY: a NUL-terminated path; with `no_alloc` and a NULL `ctx`
        // only the metadata is read. The parser validates what it reads and
        // returns NULL on malformed input.
        NonNull::new(unsafe { sys::gguf_init_from_file(path.as_ptr(), params) }).map(Gguf)
    }

    pub(crate) fn ptr(&self) -> *const sys::gguf_context {
        self.0.as_ptr()
    }

    /// The id and type of `key`, if present.
    pub(crate) fn find(&self, key: &str) -> Option<(i64, sys::gguf_type::Type)> {
        let key = CString::new(key).ok()?;
        // SAFETY: a live context and a NUL-terminated key.
        let id = unsafe { sys::gguf_find_key(self.ptr(), key.as_ptr()) };
        if id < 0 {
            return None;
        }
        // SAFETY: `id` is a valid key id of this context.
        Some((id, unsafe { sys::gguf_get_kv_type(self.ptr(), id) }))
    }

    pub(crate) fn string(&self, key: &str) -> Option<String> {
        let (id, kind) = self.find(key)?;
        if kind != sys::gguf_type::GGUF_TYPE_STRING {
            return None;
        }
        // SAFETY: a valid id of a string value (type checked above); the
        // string lives as long as the context and is copied at once.
        Some(unsafe { crate::llama::ffi::owned_lossy(sys::gguf_get_val_str(self.ptr(), id)) })
    }

    /// A scalar `u32`, as llama.cpp's `get_key<uint32_t>` reads it (the
    /// type must match exactly, otherwise llama.cpp throws).
    pub(crate) fn scalar_u32(&self, key: &str) -> Option<u32> {
        let (id, kind) = self.find(key)?;
        // SAFETY: a valid id whose type is checked to be a scalar u32.
        (kind == sys::gguf_type::GGUF_TYPE_UINT32).then(|| unsafe { sys::gguf_get_val_u32(self.ptr(), id) })
    }

    pub(crate) fn scalar_f32(&self, key: &str) -> Option<f32> {
        let (id, kind) = self.find(key)?;
        // SAFETY: a valid id whose type is checked to be a scalar f32.
        (kind == sys::gguf_type::GGUF_TYPE_FLOAT32).then(|| unsafe { sys::gguf_get_val_f32(self.ptr(), id) })
    }

    /// An array of 32-bit integers (`i32` or `u32` elements, as llama.cpp
    /// reads token types), `None` for anything else.
    pub(crate) fn i32_array(&self, key: &str) -> Option<Vec<i32>> {
        let (id, kind) = self.find(key)?;
        if kind != sys::gguf_type::GGUF_TYPE_ARRAY {
            return None;
        }
        // SAFETY: a valid id of an array (type checked).
        let (elem, n) = unsafe { (sys::gguf_get_arr_type(self.ptr(), id), sys::gguf_get_arr_n(self.ptr(), id)) };
        if elem != sys::gguf_type::GGUF_TYPE_INT32 && elem != sys::gguf_type::GGUF_TYPE_UINT32 {
            return None;
        }
        // SAFETY: a non-string array of `n` 4-byte elements (type checked),
        // alive as long as the context.
        let data = unsafe { sys::gguf_get_arr_data(self.ptr(), id) }.cast::<u8>();
        if data.is_null() {
            return None;
        }
        // SAFETY: see above; the bytes are copied out at once.
        let bytes = unsafe { std::slice::from_raw_parts(data, n * 4) };
        Some(bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// A per-layer value as `get_key_or_arr<uint32_t>` reads it: a scalar
    /// u32 for every layer, or an array of u32/i32/bool of `n_layer`
    /// entries. `None` where llama.cpp would throw or use a default.
    pub(crate) fn per_layer_u32(&self, key: &str, n_layer: u32) -> Option<Vec<u32>> {
        let (id, kind) = self.find(key)?;
        if kind == sys::gguf_type::GGUF_TYPE_UINT32 {
            // SAFETY: a valid id of a scalar u32 (type checked).
            return Some(vec![unsafe { sys::gguf_get_val_u32(self.ptr(), id) }; n_layer as usize]);
        }
        if kind != sys::gguf_type::GGUF_TYPE_ARRAY {
            return None;
        }
        // SAFETY: a valid id of an array (type checked).
        let (elem, n) = unsafe { (sys::gguf_get_arr_type(self.ptr(), id), sys::gguf_get_arr_n(self.ptr(), id)) };
        if n != n_layer as usize {
            return None;
        }
        use sys::gguf_type as t;
        let width = match elem {
            t::GGUF_TYPE_UINT32 | t::GGUF_TYPE_INT32 => 4,
            t::GGUF_TYPE_BOOL => 1,
            _ => return None,
        };
        // SAFETY: a non-string array (element type checked) of `n`
        // elements of `width` bytes, alive as long as the context.
        let data = unsafe { sys::gguf_get_arr_data(self.ptr(), id) }.cast::<u8>();
        if data.is_null() {
            return None;
        }
        // SAFETY: see above; the bytes are copied out at once.
        let bytes = unsafe { std::slice::from_raw_parts(data, n * width) };
        Some(if width == 4 {
            bytes.chunks_exact(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
        } else {
            bytes.iter().map(|&b| u32::from(b != 0)).collect()
        })
    }

    /// Every tensor's ggml type and size in bytes, in file order.
    pub(crate) fn tensors(&self) -> Vec<TensorInfo> {
        // SAFETY: a live context.
        let n = unsafe { sys::gguf_get_n_tensors(self.ptr()) };
        (0..n)
            .map(|i| {
                // SAFETY: `i` is a valid tensor id of this context.
                unsafe {
                    TensorInfo {
                        ggml_type: sys::gguf_get_tensor_type(self.ptr(), i),
                        bytes: sys::gguf_get_tensor_size(self.ptr(), i) as u64,
                    }
                }
            })
            .collect()
    }
}

/// One tensor of a GGUF file, as its header describes it.
#[derive(Clone, Debug)]
pub(crate) struct TensorInfo {
    pub(crate) ggml_type: sys::ggml_type::Type,
    pub(crate) bytes: u64,
}
