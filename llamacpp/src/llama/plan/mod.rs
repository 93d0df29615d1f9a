//! Know the memory before you load: what a model and a context will
//! allocate, per buffer type and device, computed by llama.cpp itself.
//!
//! A [`Planner`] loads a model's metadata with llama.cpp's `no_alloc`
//! ("only load metadata and simulate memory allocations"): every tensor is
//! created and placed on the buffer type it would get; no weight is read
//! or allocated. [`Planner::plan`] then creates a context the same way and
//! reads `llama_get_memory_breakdown`, the accounting llama.cpp keeps of
//! what it allocates. (Even then llama.cpp really allocates some small
//! things: the cells' bookkeeping, about 48 bytes per cell, the output
//! buffer, and a recurrent model's state; a plan's cost so grows a little
//! with `n_ctx`.)
//!
//! * **weights** (`model`): the tensors of each buffer type. On a CPU these
//!   are the `CPU` buffer and `CPU_REPACK`, the quantized weights llama.cpp
//!   rearranges for its kernels;
//! * **KV cache** (`context`): the K and V tensors of every layer (or the
//!   recurrent state of a recurrent model);
//! * **compute**: the scheduler's buffers for the largest graph, sized by
//!   reserving the graph of one full micro-batch (`n_ubatch` tokens). For
//!   small models with large vocabularies it is the largest dynamic part:
//!   Gemma 3 270M's 262,144-entry logits of a 512-token micro-batch alone
//!   are 512 MiB in f32.
//!
//! A live [`Context`](crate::Context) reports the same breakdown of what
//! it really allocated ([`Context::memory_breakdown`](crate::Context::memory_breakdown)),
//! so a plan can be checked against reality. Not in either: the output
//! buffer (logits and embeddings of the outputs a decode asks for:
//! `n_vocab × 4` bytes per output row, grown as needed), the memory-mapped
//! file pages of a model loaded with `mmap` (counted as its `CPU` weights
//! buffer), and the allocator's own overhead.
//!
//! [`analytic`] explains the same figures from the GGUF metadata alone,
//! and [`Planner::fit`] finds the largest context or the most sequences
//! that fit a memory budget.

use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::llama::backend;
use crate::llama::context::{ContextParams, KvType};
use crate::llama::model::{Model, ModelParams};
use crate::sys;

pub mod analytic;
mod fit;
mod size;

pub(crate) use fit::fit_layers;
pub use fit::{Fit, FitGoal, LayerFit, MemoryBudget};
pub use size::parse_size;

/// One buffer type's share of the memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferMemory {
    /// The buffer type's name, as llama.cpp logs it (`CPU`, `CPU_REPACK`,
    /// `CUDA0`, `CUDA_Host`, …).
    pub buffer: String,
    /// The device it belongs to: [`HOST`] for every buffer in host memory
    /// (RAM: the CPU device's buffers, `CPU_REPACK` included, and a GPU
    /// backend's pinned host buffers), otherwise the device's name
    /// (`CUDA0`, `RPC0[…]`, …).
    pub device: String,
    /// Bytes of model weights.
    pub weights: u64,
    /// Bytes of the KV cache (or recurrent state).
    pub kv: u64,
    /// Bytes of compute buffers.
    pub compute: u64,
}

impl BufferMemory {
    fn default_named(name: &str) -> BufferMemory {
        BufferMemory { buffer: name.to_owned(), device: name.to_owned(), weights: 0, kv: 0, compute: 0 }
    }

    /// Weights + KV + compute.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.compute
    }
}

/// The device name under which [`BufferMemory::device`] groups host memory.
pub const HOST: &str = "Host";

/// Memory by buffer type, as llama.cpp accounts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    /// One entry per buffer type, in llama.cpp's order.
    pub buffers: Vec<BufferMemory>,
}

impl MemoryBreakdown {
    /// Bytes of weights over all buffers.
    pub fn weights(&self) -> u64 {
        self.buffers.iter().map(|b| b.weights).sum()
    }

    /// Bytes of KV cache over all buffers.
    pub fn kv(&self) -> u64 {
        self.buffers.iter().map(|b| b.kv).sum()
    }

    /// Bytes of compute buffers over all buffers.
    pub fn compute(&self) -> u64 {
        self.buffers.iter().map(|b| b.compute).sum()
    }

    /// Everything.
    pub fn total(&self) -> u64 {
        self.buffers.iter().map(BufferMemory::total).sum()
    }

    /// The buffers summed per device ([`HOST`] for host memory), in order
    /// of first appearance; `buffer` names the buffers joined by `+`.
    pub fn devices(&self) -> Vec<BufferMemory> {
        let mut out: Vec<BufferMemory> = Vec::new();
        for b in &self.buffers {
            match out.iter_mut().find(|d| d.device == b.device) {
                Some(d) => {
                    d.buffer.push('+');
                    d.buffer.push_str(&b.buffer);
                    d.weights += b.weights;
                    d.kv += b.kv;
                    d.compute += b.compute;
                }
                None => out.push(b.clone()),
            }
        }
        out
    }

    /// The entry of buffer type `name`, if there is one.
    pub fn buffer(&self, name: &str) -> Option<&BufferMemory> {
        self.buffers.iter().find(|b| b.buffer == name)
    }

    /// Reads `llama_get_memory_breakdown` of a live context.
    ///
    /// # Safety
    /// `ctx` must be a live context.
    pub(crate) unsafe fn of_context(ctx: *const sys::llama_context) -> Result<MemoryBreakdown> {
        let empty = sys::shim::llama_rs_buffer_memory { buft: std::ptr::null_mut(), model: 0, context: 0, compute: 0 };
        let mut entries = vec![empty; 8];
        loop {
            let mut count = 0usize;
            // SAFETY: `ctx` is live (the caller's promise); `entries` has
            // room for `entries.len()` entries, which is what we pass.
            let code = unsafe {
                sys::shim::llama_rs_get_memory_breakdown(ctx, entries.as_mut_ptr(), entries.len(), &mut count)
            };
            crate::llama::ffi::check_shim(code, "llama_get_memory_breakdown")?;
            if count > entries.len() {
                entries = vec![empty; count];
                continue;
            }
            entries.truncate(count);
            break;
        }
        let buffers = entries
            .iter()
            .map(|e| {
                // SAFETY: the buffer types llama.cpp returned are static
                // objects of their backends (they live as long as the
                // process); their names are static strings.
                unsafe {
                    let buffer = crate::llama::ffi::owned_lossy(sys::ggml_backend_buft_name(e.buft));
                    let dev = sys::ggml_backend_buft_get_device(e.buft);
                    let on_cpu = !dev.is_null()
                        && sys::ggml_backend_dev_type(dev) == sys::ggml_backend_dev_type::GGML_BACKEND_DEVICE_TYPE_CPU;
                    // The CPU device's own buffers (CPU_REPACK is not
                    // "host" to ggml, its layout is private) are RAM too.
                    let device = if on_cpu || sys::ggml_backend_buft_is_host(e.buft) {
                        HOST.to_owned()
                    } else if dev.is_null() {
                        buffer.clone()
                    } else {
                        crate::llama::ffi::owned_lossy(sys::ggml_backend_dev_name(dev))
                    };
                    BufferMemory {
                        buffer,
                        device,
                        weights: e.model as u64,
                        kv: e.context as u64,
                        compute: e.compute as u64,
                    }
                }
            })
            .collect();
        Ok(MemoryBreakdown { buffers })
    }
}

/// What a context with given parameters would allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The context size llama.cpp settles on (`llama_n_ctx`: padded up to a
    /// multiple of 256, and to a multiple of the sequences without
    /// `kv_unified`).
    pub n_ctx: u32,
    /// Cells per sequence (`llama_n_ctx_seq`).
    pub n_ctx_seq: u32,
    /// Sequences.
    pub n_seq_max: u32,
    /// The micro-batch the compute buffers are sized for (`llama_n_ubatch`).
    pub n_ubatch: u32,
    /// K cache type.
    pub type_k: KvType,
    /// V cache type.
    pub type_v: KvType,
    /// The memory, per buffer type.
    pub memory: MemoryBreakdown,
}

/// Plans memory for one model file: its metadata loaded once with
/// `no_alloc`, then any number of [`plan`](Planner::plan)s (3 to 9 ms each
/// for the default model on the CI machine, up to 32,768 cells).
#[derive(Debug)]
pub struct Planner {
    model: Model,
    path: PathBuf,
}

impl Planner {
    /// Loads the metadata of the model at `path` (its tensors are placed
    /// as `params` place them; no weight is read or allocated).
    ///
    /// # Errors
    /// The errors of [`Model::load`]: [`Error::Io`] for a missing file,
    /// [`Error::ModelLoad`] for a directory, an empty, truncated or
    /// non-GGUF file or a model llama.cpp does not know.
    #[doc(alias = "no_alloc")]
    pub fn new(path: impl AsRef<Path>, params: &ModelParams) -> Result<Planner> {
        let path = path.as_ref();
        Ok(Planner { model: Model::load_simulated(&[path], params)?, path: path.to_owned() })
    }

    /// A planner for the files and parameters `model` was loaded from
    /// (their metadata is read again).
    ///
    /// # Errors
    /// As [`Planner::new`] (the file may have changed since).
    pub fn for_model(model: &Model) -> Result<Planner> {
        let source = model.source();
        let paths: Vec<&Path> = source.paths.iter().map(PathBuf::as_path).collect();
        Planner::from_paths(&paths, &source.params)
    }

    /// A planner for a model's files (the first holds the metadata).
    pub(crate) fn from_paths(paths: &[&Path], params: &ModelParams) -> Result<Planner> {
        Ok(Planner { model: Model::load_simulated(paths, params)?, path: paths[0].to_owned() })
    }

    /// The model file (the first split of a split model).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The layers the plans put on the devices: the count the model's
    /// parameters asked for, or the one their fit chose (as
    /// [`Model::n_gpu_layers`]).
    pub fn n_gpu_layers(&self) -> usize {
        self.model.n_gpu_layers()
    }

    /// The model's training context length (what `n_ctx` 0 means).
    pub fn n_ctx_train(&self) -> u32 {
        self.model.n_ctx_train()
    }

    /// What a context with `params` would allocate, by llama.cpp's own
    /// accounting.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] and [`Error::InvalidArgument`] for
    /// parameters [`Context::new`](crate::Context::new) refuses; [`Error::ContextCreate`] when llama.cpp refuses them (e.g.
    /// a quantized V cache without flash attention).
    #[doc(alias = "llama_get_memory_breakdown")]
    pub fn plan(&self, params: &ContextParams) -> Result<MemoryPlan> {
        backend::init();
        let raw = params.to_raw(&self.model)?;
        backend::clear_last_error();
        let adapters = self.model.adapters_read();
        // SAFETY: a live (no_alloc) model and parameters built by
        // `to_raw` from the defaults with valid values. With no_alloc
        // llama.cpp creates the KV tensors on dummy buffers and only
        // measures the compute graph. No abort callback: nothing runs.
        let ptr = unsafe { sys::llama_init_from_model(self.model.as_ptr(), raw) };
        drop(adapters);
        let ctx = NonNull::new(ptr)
            .map(SimulatedContext)
            .ok_or_else(|| Error::ContextCreate(backend::last_error_or("llama_init_from_model returned NULL")))?;
        let c = ctx.0.as_ptr();
        // SAFETY: `c` is live until `ctx` drops; these read its settings.
        let (n_ctx, n_ctx_seq, n_seq_max, n_ubatch) =
            unsafe { (sys::llama_n_ctx(c), sys::llama_n_ctx_seq(c), sys::llama_n_seq_max(c), sys::llama_n_ubatch(c)) };
        // SAFETY: as above.
        let mut memory = unsafe { MemoryBreakdown::of_context(c)? };
        memory.add_allocation_padding();
        Ok(MemoryPlan { n_ctx, n_ctx_seq, n_seq_max, n_ubatch, type_k: params.type_k, type_v: params.type_v, memory })
    }

    /// The model's shape from its GGUF metadata, for the formulas of
    /// [`analytic`].
    ///
    /// # Errors
    /// As [`analytic::ModelShape::read`].
    pub fn shape(&self) -> Result<analytic::ModelShape> {
        analytic::ModelShape::read(&self.path)
    }
}

/// Bytes ggml-vulkan's pinned host buffers allocate beyond what they are
/// asked for (ggml-vulkan.cpp, `ggml_backend_vk_host_buffer_type_alloc_buffer`:
/// `size += 32; // Behave like the CPU buffer type`). A no_alloc plan
/// measures what is asked; a live context's breakdown reports the buffer.
const VULKAN_HOST_PADDING: u64 = 32;

impl MemoryBreakdown {
    /// What allocating the planned buffers adds beyond their measured
    /// sizes: Vulkan's pinned host buffers pad each allocation, and a
    /// model and its context make one of each kind per buffer type (the
    /// weights of the layers left on the host land there when others are
    /// offloaded from a file read into memory; the compute buffer always).
    fn add_allocation_padding(&mut self) {
        for buffer in &mut self.buffers {
            if buffer.buffer == "Vulkan_Host" {
                if buffer.weights > 0 {
                    buffer.weights += VULKAN_HOST_PADDING;
                }
                if buffer.compute > 0 {
                    buffer.compute += VULKAN_HOST_PADDING;
                }
            }
        }
    }
}

/// A context created over a no_alloc model, freed on drop; never decoded.
struct SimulatedContext(NonNull<sys::llama_context>);

impl Drop for SimulatedContext {
    fn drop(&mut self) {
        // SAFETY: we own the context and nothing else refers to it.
        unsafe { sys::llama_free(self.0.as_ptr()) }
    }
}

impl crate::llama::context::Context<'_> {
    /// What this context and its model allocated, per buffer type: the
    /// live counterpart of [`Planner::plan`].
    ///
    /// # Errors
    /// [`Error::Exception`] if llama.cpp throws.
    #[doc(alias = "llama_get_memory_breakdown")]
    pub fn memory_breakdown(&mut self) -> Result<MemoryBreakdown> {
        self.check_reachable()?;
        let ptr = self.as_ptr();
        // SAFETY: our own live context.
        unsafe { MemoryBreakdown::of_context(ptr) }
    }
}
