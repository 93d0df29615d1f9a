//! A safe wrapper of ggml's GGUF writer, for synthetic models.

use std::ffi::{CString, c_char, c_void};
use std::fs::OpenOptions;
use std::io;
use std::path::Path;

use crate::sys;

use super::invalid_input;

/// Owns a `ggml_context` that allocates tensor data in its own pool.
struct GgmlContext {
    ctx: *mut sys::ggml_context,
    /// Bytes of the pool not yet promised to a tensor.
    left: usize,
    /// The pool, allocated here (fallibly) rather than by ggml, which
    /// aborts when its allocation fails. Dropped after `ctx` is freed.
    _pool: Vec<PoolChunk>,
}

/// The unit of the pool: ggml wants its buffer aligned to GGML_MEM_ALIGN
/// (16 bytes); 64 covers it everywhere.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct PoolChunk([u8; 64]);

/// The largest pool the writer allocates: tiny models need a few MB.
const MAX_POOL: usize = 1 << 32;

impl GgmlContext {
    pub(super) fn new(mem_size: usize) -> io::Result<Self> {
        if mem_size > MAX_POOL {
            return Err(invalid_input(format!("{mem_size} bytes of tensors exceed the writer's {MAX_POOL}")));
        }
        let chunks = mem_size.div_ceil(64).max(1);
        let mut pool = Vec::new();
        pool.try_reserve_exact(chunks).map_err(|_| io::Error::other(format!("cannot allocate {mem_size} bytes")))?;
        pool.resize(chunks, PoolChunk([0; 64]));
        let params =
            sys::ggml_init_params { mem_size: chunks * 64, mem_buffer: pool.as_mut_ptr().cast(), no_alloc: false };
        // SAFETY: `params` is a valid by-value struct whose buffer holds
        // `mem_size` bytes, 64-byte aligned, and outlives the context (it is
        // freed after `ggml_free`, field order); ggml does not free a buffer
        // it was given.
        let ctx = unsafe { sys::ggml_init(params) };
        if ctx.is_null() {
            return Err(io::Error::other("ggml_init failed"));
        }
        Ok(Self { ctx, left: chunks * 64, _pool: pool })
    }
}

impl Drop for GgmlContext {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from `ggml_init`, is non-null and is freed only
        // here (before the pool it points into); the `GgufContext` that
        // copied its tensors is dropped first (field order of `GgufWriter`).
        unsafe { sys::ggml_free(self.ctx) };
    }
}

/// Owns a `gguf_context` being filled for writing.
struct GgufContext(*mut sys::gguf_context);

impl Drop for GgufContext {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `gguf_init_empty`, is non-null and is
        // freed only here.
        unsafe { sys::gguf_free(self.0) };
    }
}

/// A GGUF file under construction, written with ggml's own GGUF writer:
/// metadata and F32 tensors. For tests that need a model of an
/// architecture the tiny models do not cover (`tests/never_abort.rs`
/// writes T5, BERT and Mamba files with it).
///
/// Field order matters: `gguf` holds copies of tensor headers whose data
/// live in `ggml`'s pool, so it drops first.
pub struct GgufWriter {
    gguf: GgufContext,
    ggml: GgmlContext,
    /// Bytes of tensor data, each tensor padded to the GGUF alignment.
    data_size: usize,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter").field("data_size", &self.data_size).finish_non_exhaustive()
    }
}

impl GgufWriter {
    /// A writer with room for F32 tensors of these element counts.
    ///
    /// # Errors
    /// When the sizes overflow or pass 4 GiB, or the pool cannot be
    /// allocated.
    pub fn for_tensors(element_counts: &[u64]) -> io::Result<Self> {
        let mem_size = element_counts.iter().try_fold(0usize, |acc, &n| {
            let bytes = usize::try_from(n).ok()?.checked_mul(4)?;
            acc.checked_add(Self::pool_bytes(bytes))
        });
        Self::new(mem_size.ok_or_else(|| invalid_input("tensors too large"))?)
    }

    pub(super) fn new(mem_size: usize) -> io::Result<Self> {
        // SAFETY: no preconditions; the result is checked for null.
        let gguf = unsafe { sys::gguf_init_empty() };
        if gguf.is_null() {
            return Err(io::Error::other("gguf_init_empty failed"));
        }
        let gguf = GgufContext(gguf);
        Ok(Self { gguf, ggml: GgmlContext::new(mem_size)?, data_size: 0 })
    }

    /// Sets the metadata value `key` (`gguf_set_val_str`).
    ///
    /// # Errors
    /// For a NUL byte in a string, or the reserved `general.alignment`.
    pub fn set_str(&mut self, key: &str, val: &str) -> io::Result<()> {
        let (key, val) = (metadata_key(key)?, cstring(val)?);
        // SAFETY: the context is live; both are NUL-terminated strings that
        // outlive the call (gguf copies them).
        unsafe { sys::gguf_set_val_str(self.gguf.0, key.as_ptr(), val.as_ptr()) };
        Ok(())
    }

    /// Sets the metadata value `key` (`gguf_set_val_u32`).
    ///
    /// # Errors
    /// For a NUL byte in a string, or the reserved `general.alignment`.
    pub fn set_u32(&mut self, key: &str, val: u32) -> io::Result<()> {
        let key = metadata_key(key)?;
        // SAFETY: the context is live; `key` is NUL-terminated (gguf copies it).
        unsafe { sys::gguf_set_val_u32(self.gguf.0, key.as_ptr(), val) };
        Ok(())
    }

    /// Sets the metadata value `key` (`gguf_set_val_f32`).
    ///
    /// # Errors
    /// For a NUL byte in a string, or the reserved `general.alignment`.
    pub fn set_f32(&mut self, key: &str, val: f32) -> io::Result<()> {
        let key = metadata_key(key)?;
        // SAFETY: the context is live; `key` is NUL-terminated (gguf copies it).
        unsafe { sys::gguf_set_val_f32(self.gguf.0, key.as_ptr(), val) };
        Ok(())
    }

    /// Sets the metadata value `key` (`gguf_set_val_bool`).
    ///
    /// # Errors
    /// For a NUL byte in a string, or the reserved `general.alignment`.
    pub fn set_bool(&mut self, key: &str, val: bool) -> io::Result<()> {
        let key = metadata_key(key)?;
        // SAFETY: the context is live; `key` is NUL-terminated (gguf copies it).
        unsafe { sys::gguf_set_val_bool(self.gguf.0, key.as_ptr(), val) };
        Ok(())
    }

    /// Sets the metadata value `key` (`gguf_set_arr_str`).
    ///
    /// # Errors
    /// For a NUL byte in a string, or the reserved `general.alignment`.
    pub fn set_arr_str(&mut self, key: &str, vals: &[String]) -> io::Result<()> {
        let key = metadata_key(key)?;
        let owned = vals.iter().map(|s| cstring(s)).collect::<io::Result<Vec<_>>>()?;
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: the context is live; `ptrs` holds `ptrs.len()` pointers to
        // NUL-terminated strings owned by `owned`, alive across the call
        // (gguf copies them); gguf only reads through the array.
        unsafe { sys::gguf_set_arr_str(self.gguf.0, key.as_ptr(), ptrs.as_mut_ptr(), ptrs.len()) };
        Ok(())
    }

    /// Sets the metadata value `key` to an array of F32
    /// (`gguf_set_arr_data`).
    ///
    /// # Errors
    /// For a NUL byte in `key`, or the reserved `general.alignment`.
    pub fn set_arr_f32(&mut self, key: &str, vals: &[f32]) -> io::Result<()> {
        self.set_arr_data(key, sys::gguf_type::GGUF_TYPE_FLOAT32, vals)
    }

    /// Sets the metadata value `key` to an array of I32
    /// (`gguf_set_arr_data`).
    ///
    /// # Errors
    /// For a NUL byte in `key`, or the reserved `general.alignment`.
    pub fn set_arr_i32(&mut self, key: &str, vals: &[i32]) -> io::Result<()> {
        self.set_arr_data(key, sys::gguf_type::GGUF_TYPE_INT32, vals)
    }

    /// `ty` must be the GGUF type of `T` (4-byte F32 or I32).
    fn set_arr_data<T: Copy>(&mut self, key: &str, ty: sys::gguf_type::Type, vals: &[T]) -> io::Result<()> {
        let key = metadata_key(key)?;
        // SAFETY: the context is live; `vals` is `vals.len()` values of `T`,
        // which the callers pair with its GGUF type `ty` (same size and
        // layout); gguf copies them.
        unsafe { sys::gguf_set_arr_data(self.gguf.0, key.as_ptr(), ty, vals.as_ptr().cast::<c_void>(), vals.len()) };
        Ok(())
    }

    /// Bytes of ggml pool a tensor of `n_bytes` data needs.
    pub(super) fn pool_bytes(n_bytes: usize) -> usize {
        // SAFETY: no preconditions; returns a constant.
        let overhead = unsafe { sys::ggml_tensor_overhead() };
        // ggml pads each object to GGML_MEM_ALIGN (at most 16). Saturating:
        // a size past usize is refused as too large by `new`.
        overhead.saturating_add(n_bytes).saturating_add(16)
    }

    /// Declares an F32 tensor of ggml shape `ne` (`ne[0]` is the row
    /// length) in the ggml pool, fills it with `values` and adds it to
    /// the GGUF file. Names must be unique.
    ///
    /// # Errors
    /// For a name that is too long or has a NUL byte, a shape other than
    /// 1 to 4 positive dimensions, values that do not fill it, or a pool
    /// too small (see [`GgufWriter::for_tensors`]), or a name used already.
    pub fn add_f32_tensor(&mut self, name: &str, ne: &[u32], values: &[f32]) -> io::Result<()> {
        let n_elements = ne.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
        if n_elements != Some(values.len()) {
            return Err(invalid_input(format!("tensor {name}: shape {ne:?} does not hold {} values", values.len())));
        }
        self.add_tensor_with(name, ne, sys::ggml_type::GGML_TYPE_F32, |data| {
            for (chunk, v) in data.chunks_exact_mut(4).zip(values) {
                chunk.copy_from_slice(&v.to_ne_bytes());
            }
        })
    }

    /// Declares a tensor of ggml type `ty` and shape `ne` in the ggml
    /// pool, lets `fill` write its data (`ggml_nbytes` bytes, in the
    /// type's block layout) and adds it to the GGUF file.
    ///
    /// # Errors
    /// As [`GgufWriter::add_f32_tensor`]; a row length that is not a
    /// multiple of the type's block size.
    pub(super) fn add_tensor_with(
        &mut self,
        name: &str,
        ne: &[u32],
        ty: sys::ggml_type::Type,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let display = name;
        let name = cstring(name)?;
        if name.as_bytes().len() >= sys::GGML_MAX_NAME as usize {
            return Err(invalid_input(format!("tensor name too long: {display}")));
        }
        if ne.is_empty() || ne.len() > 4 || ne.contains(&0) {
            return Err(invalid_input(format!("tensor {display}: shape {ne:?} is not 1 to 4 positive dimensions")));
        }
        // SAFETY: plain reads of ggml's type traits, valid for every type
        // the callers pass (enum values of this ggml).
        let block = unsafe { sys::ggml_blck_size(ty) } as u64;
        if block == 0 || u64::from(ne[0]) % block != 0 {
            return Err(invalid_input(format!("tensor {display}: row of {} is not whole blocks of {block}", ne[0])));
        }
        // SAFETY: as above.
        let row = unsafe { sys::ggml_row_size(ty, i64::from(ne[0])) } as u64;
        let n_bytes = ne[1..]
            .iter()
            .try_fold(row, |acc, &d| acc.checked_mul(u64::from(d)))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| invalid_input(format!("tensor {display}: too large")))?;
        // SAFETY: a live context and a NUL-terminated name.
        if unsafe { sys::gguf_find_tensor(self.gguf.0, name.as_ptr()) } >= 0 {
            // gguf_add_tensor aborts on a duplicate.
            return Err(invalid_input(format!("a tensor named {display} was added already")));
        }
        let need = Self::pool_bytes(n_bytes);
        if need > self.ggml.left {
            // ggml would abort the process instead of failing.
            return Err(io::Error::other("ggml pool too small for the model"));
        }
        self.ggml.left -= need;
        let ne: Vec<i64> = ne.iter().map(|&d| i64::from(d)).collect();

        // SAFETY: the ggml context is live and (checked above) has room for
        // the tensor and its data, so ggml_new_tensor neither aborts nor
        // returns an unusable tensor; `ne` holds `ne.len()` (1 to 4, within
        // GGML_MAX_DIMS, checked above) positive dimensions whose row is
        // whole blocks of `ty`.
        let tensor = unsafe { sys::ggml_new_tensor(self.ggml.ctx, ty, ne.len() as i32, ne.as_ptr()) };
        if tensor.is_null() {
            return Err(io::Error::other("ggml_new_tensor failed"));
        }
        // SAFETY: `tensor` is a live tensor of the context; `name` is
        // NUL-terminated and shorter than GGML_MAX_NAME (checked above).
        unsafe { sys::ggml_set_name(tensor, name.as_ptr()) };
        // SAFETY: `tensor` is a live tensor of the context.
        let (data, nbytes) = unsafe { (sys::ggml_get_data(tensor), sys::ggml_nbytes(tensor)) };
        if data.is_null() || nbytes != n_bytes {
            return Err(io::Error::other(format!("tensor {} has {nbytes} bytes of data, expected {n_bytes}", display)));
        }
        // SAFETY: `data` points to `nbytes` == `n_bytes` writable bytes in the
        // ggml pool (no_alloc = false), owned by the context this writer
        // holds exclusively (`&mut self`), and not aliased by any Rust
        // reference for the length of `fill`.
        fill(unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), n_bytes) });
        // SAFETY: both contexts are live; the tensor's name is new in this
        // file (checked above), so gguf_add_tensor does not abort; gguf copies
        // the header, whose data pointer stays valid until `ggml` drops, after
        // `gguf` (field order).
        unsafe { sys::gguf_add_tensor(self.gguf.0, tensor) };

        // SAFETY: the context is live.
        let alignment = unsafe { sys::gguf_get_alignment(self.gguf.0) };
        self.data_size += n_bytes.div_ceil(alignment) * alignment;
        Ok(())
    }

    /// Writes the GGUF file and checks that all of it reached the file.
    ///
    /// # Errors
    /// When ggml cannot write it, or the file is shorter than expected.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let c_path = path_to_cstring(path)?;
        // SAFETY: the context is live.
        let meta_size = unsafe { sys::gguf_get_meta_size(self.gguf.0) };
        // SAFETY: the context is live and every tensor added to it has its
        // data in the live ggml pool; `c_path` is NUL-terminated.
        let ok = unsafe { sys::gguf_write_to_file(self.gguf.0, c_path.as_ptr(), false) };
        if !ok {
            return Err(io::Error::other(format!("gguf_write_to_file failed for {}", path.display())));
        }
        // gguf ignores the result of fclose, so check what landed on disk.
        let file = OpenOptions::new().write(true).open(path)?;
        file.sync_all()?;
        let len = file.metadata()?.len();
        let expected = (meta_size + self.data_size) as u64;
        if len != expected {
            return Err(io::Error::other(format!("{} has {len} bytes, expected {expected}", path.display())));
        }
        Ok(())
    }
}

pub(super) fn path_to_cstring(path: &Path) -> io::Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| invalid_input(format!("path is not UTF-8: {}", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| invalid_input(format!("NUL byte in path {}", path.display())))
}

/// A metadata key as a C string. `general.alignment` is refused: gguf
/// aborts on a value that is not a power-of-two `u32`, and the writer's
/// size checks assume the default alignment.
fn metadata_key(key: &str) -> io::Result<CString> {
    if key == "general.alignment" {
        return Err(invalid_input("the writer keeps GGUF's default alignment: general.alignment cannot be set"));
    }
    cstring(key)
}

pub(super) fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| invalid_input(format!("NUL byte in {s:?}")))
}
