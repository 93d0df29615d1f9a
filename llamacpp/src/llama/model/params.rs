//! The parameters of [`Model::load`](super::Model::load) and their
//! translation into llama.cpp's `llama_model_params`: load mode, device
//! split, RPC servers, metadata overrides.

use std::ffi::c_char;

use crate::error::{Error, Result};
use crate::llama::backend::Device;
use crate::llama::context::ContextParams;
use crate::llama::plan::MemoryBudget;
use crate::sys;

/// How many of a model's layers go to its GPUs and RPC workers
/// ([`ModelParams::gpu_layers`]). llama.cpp offloads the last repeating
/// layers first and the output layer last, so a count of `n_layer + 1`
/// is every layer.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GpuLayers {
    /// As many as fit each device's free memory less
    /// [`fit_margin`](field@ModelParams::fit_margin), beside a context made
    /// with [`fit_context`](field@ModelParams::fit_context): the most
    /// layers whose exact memory plan (weights, KV cache and compute
    /// buffers per device, [`Planner::fit_layers`](crate::plan::Planner::fit_layers))
    /// stays within that, at most `log2(n_layer + 2) + 2` plans of the
    /// metadata. The default. Where the model has no GPU or RPC device (a
    /// CPU-only build without RPC servers) this is 0, decided without a
    /// plan; where not even the compute buffers fit, 0 with a warning.
    /// Host memory is not limited.
    #[default]
    Fit,
    /// As many as fit `budget` (per device, as
    /// [`Planner::fit_layers`](crate::plan::Planner::fit_layers) reads it)
    /// beside a context made with
    /// [`fit_context`](field@ModelParams::fit_context): a fixed budget in
    /// place of the devices' free memory.
    Within(MemoryBudget),
    /// Every layer, the output layer included.
    All,
    /// This many (more than the model has: all).
    Count(u32),
}

/// How the weights get into memory.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// llama.cpp decides (memory-maps where it can).
    #[default]
    Auto,
    /// Memory-map the file: fast start, pages shared between processes.
    Mmap,
    /// Memory-map and lock the pages in RAM.
    MmapLocked,
    /// Read the file into allocated memory.
    Read,
    /// Read into memory and lock it.
    ReadLocked,
    /// Direct I/O, where the platform has it.
    DirectIo,
}

impl LoadMode {
    pub(super) fn raw(self) -> sys::llama_load_mode::Type {
        use sys::llama_load_mode as m;
        match self {
            LoadMode::Auto => m::LLAMA_LOAD_MODE_AUTO,
            LoadMode::Mmap => m::LLAMA_LOAD_MODE_MMAP,
            LoadMode::MmapLocked => m::LLAMA_LOAD_MODE_MMAP_MLOCK,
            LoadMode::Read => m::LLAMA_LOAD_MODE_NONE,
            LoadMode::ReadLocked => m::LLAMA_LOAD_MODE_MLOCK,
            LoadMode::DirectIo => m::LLAMA_LOAD_MODE_DIRECT_IO,
        }
    }
}

/// How a model is spread over several GPUs.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Everything on the main GPU.
    None,
    /// Whole layers (and their KV cache) per GPU.
    #[default]
    Layer,
    /// Rows of each tensor across GPUs.
    Row,
    /// Tensor parallelism.
    Tensor,
}

impl SplitMode {
    pub(super) fn raw(self) -> sys::llama_split_mode::Type {
        use sys::llama_split_mode as m;
        match self {
            SplitMode::None => m::LLAMA_SPLIT_MODE_NONE,
            SplitMode::Layer => m::LLAMA_SPLIT_MODE_LAYER,
            SplitMode::Row => m::LLAMA_SPLIT_MODE_ROW,
            SplitMode::Tensor => m::LLAMA_SPLIT_MODE_TENSOR,
        }
    }
}

/// A value that replaces a GGUF metadata entry at load time.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string of at most 127 bytes.
    Str(String),
}

/// Parameters for [`Model::load`](crate::Model::load), as a builder: one
/// chained setter per field, named like the field. Defaults: memory-mapped,
/// as many layers on the GPUs as fit their free memory ([`GpuLayers::Fit`];
/// none in a CPU-only build).
///
/// ```
/// use llamacpp::{GpuLayers, LoadMode, MetadataValue, ModelParams};
///
/// let mut params = ModelParams::default()
///     .n_gpu_layers(99)
///     .load_mode(LoadMode::Read)
///     .metadata_override("general.name", MetadataValue::Str("mine".into()));
/// params.check_tensors = true; // the fields stay public
/// assert_eq!(params.gpu_layers, GpuLayers::Count(99));
/// assert_eq!(ModelParams::default().n_gpu_layers(-1).gpu_layers, GpuLayers::All);
/// ```
///
/// The struct is `#[non_exhaustive]`, so that new fields are not breaking
/// changes: outside this crate, start from `ModelParams::default()` (a
/// struct literal does not compile). The values are checked by
/// [`Model::load`](crate::Model::load), not by the setters.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct ModelParams {
    /// How the weights get into memory.
    pub load_mode: LoadMode,
    /// Layers to offload to the GPUs and RPC workers. Default
    /// [`GpuLayers::Fit`]: what fits, as llama.cpp's tools do (`-ngl auto`
    /// with `--fit on`); an explicit count always wins.
    pub gpu_layers: GpuLayers,
    /// What [`GpuLayers::Fit`] and [`GpuLayers::Within`] leave room for on
    /// the devices: a context made with these parameters (default
    /// `ContextParams::default()`: 4096 tokens, one sequence). Set it to
    /// the context the model will be used with.
    pub fit_context: ContextParams,
    /// Free memory [`GpuLayers::Fit`] leaves on each device, in bytes
    /// (default 1 GiB, llama.cpp's `--fit-target`): room for other
    /// processes and for what the plan does not count.
    pub fit_margin: u64,
    /// How the model is split across GPUs.
    pub split_mode: SplitMode,
    /// The GPU used with [`SplitMode::None`].
    pub main_gpu: i32,
    /// The devices to use; `None` means all that llama.cpp finds (with
    /// [`rpc_servers`](field@Self::rpc_servers): those servers' devices, then the
    /// local GPUs).
    pub devices: Option<Vec<Device>>,
    /// RPC servers (`host:port`, feature `rpc`) whose devices the model's
    /// offloaded layers go to, first in the device list; each is checked to
    /// answer within `llamacpp::rpc::DEFAULT_TIMEOUT` (5 s) before llama.cpp
    /// connects (see `llamacpp::rpc::add_server`). Empty: local devices only.
    pub rpc_servers: Vec<String>,
    /// How much of the offloaded model each device of the list gets, in
    /// proportion (`[1.0, 3.0]`: a quarter, three quarters); empty means in
    /// proportion to each device's free memory (llama.cpp's default).
    pub tensor_split: Vec<f32>,
    /// Load only the vocabulary (for tokenizing): no weights, no contexts.
    pub vocab_only: bool,
    /// Validate tensor data while loading.
    pub check_tensors: bool,
    /// Let the CPU backend repack quantized weights into layouts its
    /// kernels read faster (llama.cpp's default). Repacked weights cannot be
    /// read back, so [`Model::save`](crate::Model::save) needs a model loaded with this off.
    pub repack_weights: bool,
    /// GGUF metadata entries to override, by key (at most 127 bytes each).
    pub metadata_overrides: Vec<(String, MetadataValue)>,
}

/// [`ModelParams::fit_margin`]'s default: 1 GiB.
pub const DEFAULT_FIT_MARGIN: u64 = 1 << 30;

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams {
            load_mode: LoadMode::Auto,
            gpu_layers: GpuLayers::Fit,
            fit_context: ContextParams::default(),
            fit_margin: DEFAULT_FIT_MARGIN,
            split_mode: SplitMode::Layer,
            main_gpu: 0,
            devices: None,
            rpc_servers: Vec::new(),
            tensor_split: Vec::new(),
            vocab_only: false,
            check_tensors: false,
            repack_weights: true,
            metadata_overrides: Vec::new(),
        }
    }
}

impl ModelParams {
    setters! {
        /// Sets [`load_mode`](field@ModelParams::load_mode).
        load_mode: LoadMode => load_mode;
        /// Sets [`gpu_layers`](field@ModelParams::gpu_layers).
        gpu_layers: GpuLayers => gpu_layers;
        /// Sets [`fit_context`](field@ModelParams::fit_context).
        fit_context: ContextParams => fit_context;
        /// Sets [`fit_margin`](field@ModelParams::fit_margin).
        fit_margin: u64 => fit_margin;
        /// Sets [`split_mode`](field@ModelParams::split_mode).
        split_mode: SplitMode => split_mode;
        /// Sets [`main_gpu`](field@ModelParams::main_gpu).
        main_gpu: i32 => main_gpu;
        /// Sets [`vocab_only`](field@ModelParams::vocab_only).
        vocab_only: bool => vocab_only;
        /// Sets [`check_tensors`](field@ModelParams::check_tensors).
        check_tensors: bool => check_tensors;
        /// Sets [`repack_weights`](field@ModelParams::repack_weights).
        repack_weights: bool => repack_weights;
    }

    /// Sets [`gpu_layers`](field@ModelParams::gpu_layers) to a count as
    /// llama.cpp's `n_gpu_layers` reads it: negative means all.
    #[must_use]
    pub fn n_gpu_layers(mut self, n: i32) -> Self {
        self.gpu_layers = u32::try_from(n).map_or(GpuLayers::All, GpuLayers::Count);
        self
    }

    /// Sets [`devices`](field@ModelParams::devices) to `Some` of these
    /// devices (assign the field `None` to go back to all devices).
    #[must_use]
    pub fn devices(mut self, devices: impl IntoIterator<Item = Device>) -> Self {
        self.devices = Some(devices.into_iter().collect());
        self
    }

    /// Sets [`rpc_servers`](field@ModelParams::rpc_servers) (`host:port`
    /// each), replacing the list.
    #[must_use]
    pub fn rpc_servers(mut self, servers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.rpc_servers = servers.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`tensor_split`](field@ModelParams::tensor_split).
    #[must_use]
    pub fn tensor_split(mut self, ratios: impl IntoIterator<Item = f32>) -> Self {
        self.tensor_split = ratios.into_iter().collect();
        self
    }

    /// Sets [`metadata_overrides`](field@ModelParams::metadata_overrides),
    /// replacing the list; [`metadata_override`](Self::metadata_override)
    /// adds one entry.
    #[must_use]
    pub fn metadata_overrides(mut self, overrides: impl IntoIterator<Item = (String, MetadataValue)>) -> Self {
        self.metadata_overrides = overrides.into_iter().collect();
        self
    }

    /// Adds one entry to
    /// [`metadata_overrides`](field@ModelParams::metadata_overrides).
    #[must_use]
    pub fn metadata_override(mut self, key: impl Into<String>, value: MetadataValue) -> Self {
        self.metadata_overrides.push((key.into(), value));
        self
    }
}

impl ModelParams {
    /// [`tensor_split`](field@Self::tensor_split) as llama.cpp reads it:
    /// `llama_max_devices()` entries, or `None` for its default.
    pub(super) fn tensor_split_raw(&self) -> Result<Option<Vec<f32>>> {
        if self.tensor_split.is_empty() {
            return Ok(None);
        }
        // SAFETY: a constant of the library.
        let max = unsafe { sys::llama_max_devices() };
        if self.tensor_split.len() > max {
            return Err(Error::InvalidParameter {
                name: "tensor_split",
                message: format!("has {} entries; llama.cpp takes at most {max} devices", self.tensor_split.len()),
            });
        }
        if self.tensor_split.iter().any(|r| !r.is_finite() || *r < 0.0) || self.tensor_split.iter().all(|r| *r == 0.0) {
            return Err(Error::InvalidParameter {
                name: "tensor_split",
                message: format!("{:?}: the ratios must be finite, not negative, and not all zero", self.tensor_split),
            });
        }
        let mut split = self.tensor_split.clone();
        split.resize(max, 0.0);
        Ok(Some(split))
    }
}

/// An override value as llama.cpp renders metadata (`gguf_kv_to_str`:
/// `std::to_string` for numbers, `true`/`false` for booleans).
pub(super) fn render_override(value: &MetadataValue) -> String {
    match value {
        MetadataValue::Int(v) => v.to_string(),
        MetadataValue::Float(v) => format!("{v:.6}"),
        MetadataValue::Bool(v) => v.to_string(),
        MetadataValue::Str(v) => v.clone(),
    }
}

pub(super) fn build_overrides(list: &[(String, MetadataValue)]) -> Result<Vec<sys::llama_model_kv_override>> {
    let mut out = Vec::with_capacity(list.len() + 1);
    for (key, value) in list {
        // SAFETY: an all-zero override is a valid value of this plain C struct.
        let mut o: sys::llama_model_kv_override = unsafe { std::mem::zeroed() };
        copy_c_string(&mut o.key, key, "metadata override key")?;
        use sys::llama_model_kv_override_type as t;
        match value {
            MetadataValue::Int(v) => {
                o.tag = t::LLAMA_KV_OVERRIDE_TYPE_INT;
                o.__bindgen_anon_1.val_i64 = *v;
            }
            MetadataValue::Float(v) => {
                o.tag = t::LLAMA_KV_OVERRIDE_TYPE_FLOAT;
                o.__bindgen_anon_1.val_f64 = *v;
            }
            MetadataValue::Bool(v) => {
                o.tag = t::LLAMA_KV_OVERRIDE_TYPE_BOOL;
                o.__bindgen_anon_1.val_bool = *v;
            }
            MetadataValue::Str(v) => {
                o.tag = t::LLAMA_KV_OVERRIDE_TYPE_STR;
                // SAFETY: writing the string member of the union; the tag
                // says which member is live.
                let dst = unsafe { &mut o.__bindgen_anon_1.val_str };
                copy_c_string(dst, v, "metadata override string")?;
            }
        }
        out.push(o);
    }
    // The terminator: an entry whose key is empty.
    // SAFETY: as above.
    out.push(unsafe { std::mem::zeroed() });
    Ok(out)
}

fn copy_c_string(dst: &mut [c_char], src: &str, what: &str) -> Result<()> {
    if src.len() >= dst.len() || src.as_bytes().contains(&0) || src.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} `{src}` must be 1..{} bytes without NUL", dst.len() - 1)));
    }
    for (d, s) in dst.iter_mut().zip(src.bytes()) {
        *d = s as c_char;
    }
    dst[src.len()] = 0;
    Ok(())
}
