//! Quantizing GGUF models.

use std::path::Path;

use crate::error::{Error, Result};
use crate::llama::ffi::path_to_cstring;
use crate::llama::model::{Model, check_gguf_file, publish, temp_sibling};
use crate::sys;

/// A model file type (`LLAMA_FTYPE_*`): the dominant tensor type of a
/// GGUF file. An open set: values this crate has no constant for are kept
/// as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileType(pub u32);

impl FileType {
    /// All tensors F32.
    pub const F32: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_ALL_F32);
    /// Mostly F16.
    pub const F16: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_F16);
    /// Mostly BF16.
    pub const BF16: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_BF16);
    /// Mostly Q8_0.
    pub const Q8_0: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q8_0);
    /// Mostly Q4_0.
    pub const Q4_0: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q4_0);
    /// Mostly Q5_0.
    pub const Q5_0: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q5_0);
    /// Mostly Q4_K, medium.
    pub const Q4_K_M: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q4_K_M);
    /// Mostly Q5_K, medium.
    pub const Q5_K_M: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q5_K_M);
    /// Mostly Q6_K.
    pub const Q6_K: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q6_K);

    /// Not recorded in the file; llama.cpp guessed it from the tensors.
    pub const GUESSED: FileType = FileType(sys::llama_ftype::LLAMA_FTYPE_GUESSED);

    /// llama.cpp's name for the type, e.g. `Q4_K - Medium`.
    #[doc(alias = "llama_ftype_name")]
    pub fn name(self) -> String {
        // SAFETY: returns a static string for any value ("unknown" if unknown).
        let ptr = unsafe { sys::llama_ftype_name(self.0) };
        if ptr.is_null() {
            return String::new();
        }
        // SAFETY: non-null, static and NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }
}

impl Model {
    /// The file type the model was stored with.
    #[doc(alias = "llama_model_ftype")]
    pub fn file_type(&self) -> FileType {
        // SAFETY: a pure read of a live model.
        FileType(unsafe { sys::llama_model_ftype(self.as_ptr()) })
    }
}

/// Parameters for [`quantize`], as a builder: one chained setter per
/// field, named like the field. Defaults: [`FileType::Q8_0`], all cores,
/// no re-quantizing, `output.weight` quantized, llama.cpp's mixed recipe.
///
/// ```
/// use llamacpp::{FileType, QuantizeParams};
///
/// let params = QuantizeParams::default().file_type(FileType::Q4_K_M).threads(4);
/// assert_eq!(params.file_type, FileType::Q4_K_M);
/// ```
///
/// The struct is `#[non_exhaustive]`, so that new fields are not breaking
/// changes: outside this crate, start from `QuantizeParams::default()` (a
/// struct literal does not compile). The values are checked by
/// [`quantize`], not by the setters.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct QuantizeParams {
    /// The target type.
    pub file_type: FileType,
    /// Threads (0: all cores).
    pub threads: i32,
    /// Allow re-quantizing tensors that are already quantized.
    pub allow_requantize: bool,
    /// Quantize `output.weight` too.
    pub quantize_output_tensor: bool,
    /// Quantize every tensor to the target type (no mixed "K-quant" recipe).
    pub pure: bool,
}

impl Default for QuantizeParams {
    fn default() -> Self {
        QuantizeParams {
            file_type: FileType::Q8_0,
            threads: 0,
            allow_requantize: false,
            quantize_output_tensor: true,
            pure: false,
        }
    }
}

impl QuantizeParams {
    setters! {
        /// Sets [`file_type`](field@QuantizeParams::file_type).
        file_type: FileType => file_type;
        /// Sets [`threads`](field@QuantizeParams::threads).
        threads: i32 => threads;
        /// Sets [`allow_requantize`](field@QuantizeParams::allow_requantize).
        allow_requantize: bool => allow_requantize;
        /// Sets [`quantize_output_tensor`](field@QuantizeParams::quantize_output_tensor).
        quantize_output_tensor: bool => quantize_output_tensor;
        /// Sets [`pure`](field@QuantizeParams::pure).
        pure: bool => pure;
    }
}

/// Quantizes the GGUF model at `input` into `output`. The output file
/// appears under its name only once it is complete.
///
/// # Errors
/// [`Error::Io`] / [`Error::ModelLoad`] for an unreadable input,
/// [`Error::InvalidParameter`] for negative threads, [`Error::Quantize`]
/// if llama.cpp fails to quantize.
#[doc(alias = "llama_model_quantize")]
pub fn quantize(input: impl AsRef<Path>, output: impl AsRef<Path>, params: &QuantizeParams) -> Result<()> {
    crate::llama::backend::init();
    let (input, output) = (input.as_ref(), output.as_ref());
    let c_in = check_gguf_file(input)?;
    if params.threads < 0 {
        return Err(Error::InvalidParameter {
            name: "threads",
            message: format!("must be >= 0, got {}", params.threads),
        });
    }
    let temp = temp_sibling(output)?;
    let c_temp = path_to_cstring(&temp)?;
    // SAFETY: returns a plain struct of defaults (NULL optional arrays).
    let mut raw = unsafe { sys::llama_model_quantize_default_params() };
    raw.nthread = params.threads;
    raw.ftype = params.file_type.0;
    raw.allow_requantize = params.allow_requantize;
    raw.quantize_output_tensor = params.quantize_output_tensor;
    raw.pure_ = params.pure;
    crate::llama::backend::clear_last_error();
    // SAFETY: NUL-terminated paths and parameters built from the defaults;
    // llama_model_quantize catches its exceptions and returns non-zero.
    let code = unsafe { sys::llama_model_quantize(c_in.as_ptr(), c_temp.as_ptr(), &raw) };
    if code != 0 {
        // Dropping `temp` removes the partial file.
        return Err(Error::Quantize {
            path: input.to_owned(),
            reason: crate::llama::backend::last_error_or("llama.cpp failed to quantize the model"),
        });
    }
    publish(temp, output)
}
