//! Loading: checks before llama.cpp reads a file, the progress callback,
//! and the `Model` built from what the loader returned.

use std::ffi::{CString, c_char, c_void};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::RwLock;

use super::params::{build_overrides, render_override};
use super::{Model, ModelParams, Remote, Source, preflight};
use crate::error::{Error, Result};
use crate::llama::backend;
use crate::llama::extensions::Extensions;
use crate::llama::ffi::{self, path_to_cstring};
use crate::llama::vocab::Vocab;
use crate::sys;

struct Progress<'f> {
    callback: &'f mut dyn FnMut(f32) -> bool,
    panic: Option<ffi::Panic>,
    cancelled: bool,
}

unsafe extern "C" fn progress_trampoline(progress: f32, user_data: *mut c_void) -> bool {
    // SAFETY: `user_data` is the `Progress` that `load_impl` keeps alive on
    // its stack for the whole (synchronous) load call.
    let state = unsafe { &mut *user_data.cast::<Progress<'_>>() };
    if state.panic.is_some() || state.cancelled {
        return false;
    }
    match ffi::catch(|| (state.callback)(progress)) {
        Ok(keep_going) => {
            state.cancelled = !keep_going;
            keep_going
        }
        Err(panic) => {
            ffi::keep_first(&mut state.panic, panic);
            false
        }
    }
}

unsafe extern "C" fn silent_progress(_progress: f32, _user_data: *mut c_void) -> bool {
    true // replaces llama.cpp's default, which prints dots
}

/// Checks what llama.cpp would otherwise report only as NULL.
/// Checks a GGUF model file the way [`Model::load`] does before handing
/// it to another llama.cpp reader (the quantizer), returning its C path.
pub(crate) fn check_gguf_file(path: &Path) -> Result<CString> {
    check_model_file(path)?;
    let c_path = path_to_cstring(path)?;
    preflight::check(path, &c_path, &[], false)?;
    Ok(c_path)
}

fn check_model_file(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let reason = if meta.is_dir() {
        "it is a directory, not a GGUF file"
    } else if meta.len() == 0 {
        "the file is empty"
    } else if meta.len() < 8 {
        "the file is too short to be a GGUF file"
    } else {
        return Ok(());
    };
    Err(Error::ModelLoad { path: path.to_owned(), reason: reason.to_owned() })
}

impl Model {
    /// Loads a GGUF file. A file named `<name>-00001-of-0000N.gguf` pulls in
    /// the other splits.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read, [`Error::ModelLoad`] if it is
    /// a directory, empty, truncated, corrupt or not a model llama.cpp knows.
    #[doc(alias = "llama_model_load_from_file")]
    pub fn load(path: impl AsRef<Path>, params: &ModelParams) -> Result<Model> {
        Self::load_impl(&[path.as_ref()], params, None, false)
    }

    /// Like [`Model::load`], calling `progress` with a fraction in 0..=1 as
    /// loading advances. Returning `false` cancels the load
    /// ([`Error::LoadCancelled`]). A panic in `progress` cancels the load and
    /// is resumed once llama.cpp has returned.
    ///
    /// # Errors
    /// As [`Model::load`], plus [`Error::LoadCancelled`].
    pub fn load_with_progress(
        path: impl AsRef<Path>,
        params: &ModelParams,
        mut progress: impl FnMut(f32) -> bool,
    ) -> Result<Model> {
        Self::load_impl(&[path.as_ref()], params, Some(&mut progress), false)
    }

    /// Loads a model stored as several split files, given in order.
    ///
    /// # Errors
    /// As [`Model::load`]; [`Error::InvalidArgument`] for an empty list.
    #[doc(alias = "llama_model_load_from_splits")]
    pub fn load_splits<P: AsRef<Path>>(paths: &[P], params: &ModelParams) -> Result<Model> {
        if paths.is_empty() {
            return Err(Error::InvalidArgument("load_splits needs at least one path".into()));
        }
        let paths: Vec<&Path> = paths.iter().map(AsRef::as_ref).collect();
        Self::load_impl(&paths, params, None, false)
    }

    /// Loads the metadata of a model with llama.cpp's `no_alloc`: tensors
    /// are created and placed on their buffer types, no weight is allocated
    /// or read. Such a model only serves the memory plan
    /// ([`crate::plan::Planner`]); contexts over it refuse to be created.
    pub(crate) fn load_simulated(paths: &[&Path], params: &ModelParams) -> Result<Model> {
        let params = params.clone().vocab_only(false);
        Self::load_impl(paths, &params, None, true)
    }

    /// `simulate`: load with `no_alloc` (see [`Model::load_simulated`]).
    fn load_impl(
        paths: &[&Path],
        params: &ModelParams,
        progress: Option<&mut dyn FnMut(f32) -> bool>,
        simulate: bool,
    ) -> Result<Model> {
        backend::init();
        for path in paths {
            check_model_file(path)?;
        }
        let c_paths = paths.iter().map(|p| path_to_cstring(p)).collect::<Result<Vec<_>, _>>()?;
        // The first file holds the metadata (of split models, too).
        preflight::check(paths[0], &c_paths[0], &params.metadata_overrides, params.vocab_only)?;
        // The count decided once, and kept in the model's source (a
        // planner for the loaded model must not fit again: the model's
        // own weights now take the free memory).
        let n_gpu_layers = if params.vocab_only { 0 } else { super::offload::n_gpu_layers(paths, params)? };
        let params = &params.clone().n_gpu_layers(n_gpu_layers);

        // SAFETY: returns a plain struct of defaults.
        let mut raw = unsafe { sys::llama_model_default_params() };
        raw.load_mode = params.load_mode.raw();
        raw.n_gpu_layers = n_gpu_layers;
        raw.split_mode = params.split_mode.raw();
        raw.main_gpu = params.main_gpu;
        raw.vocab_only = params.vocab_only;
        raw.check_tensors = params.check_tensors;
        raw.use_extra_bufts = params.repack_weights;
        if simulate {
            // llama.cpp's memory-fit pass does the same (common/fit.cpp):
            // with no_alloc nothing may be mapped (llama_model::load_tensors
            // asserts !no_alloc on its mmap path).
            raw.no_alloc = true;
            raw.load_mode = sys::llama_load_mode::LLAMA_LOAD_MODE_NONE;
        }

        // Pointer inputs only need to live for the load call (§1.2).
        let (remote_devices, remote) = Remote::prepare(params)?;
        let mut devices: Vec<sys::ggml_backend_dev_t> = Vec::new();
        if let Some(list) = params.devices.as_ref().or(remote_devices.as_ref()) {
            devices.extend(list.iter().map(|d| d.raw));
            devices.push(std::ptr::null_mut());
            raw.devices = devices.as_mut_ptr();
        }
        let tensor_split = params.tensor_split_raw()?;
        if let Some(split) = &tensor_split {
            raw.tensor_split = split.as_ptr();
        }
        let overrides = build_overrides(&params.metadata_overrides)?;
        if !params.metadata_overrides.is_empty() {
            raw.kv_overrides = overrides.as_ptr();
        }

        let with_progress = progress.is_some();
        let mut keep_loading = |_: f32| true;
        let mut state;
        match progress {
            Some(callback) => {
                state = Progress { callback, panic: None, cancelled: false };
                raw.progress_callback = Some(progress_trampoline);
                raw.progress_callback_user_data = (&raw mut state).cast();
            }
            None => {
                raw.progress_callback = Some(silent_progress);
                state = Progress { callback: &mut keep_loading, panic: None, cancelled: false };
            }
        }

        backend::clear_last_error();
        if remote.is_remote() && with_progress {
            // The guarded load runs on another thread, where the callback
            // (a borrowed, non-`Send` closure) cannot go.
            return Err(Error::Unsupported(
                "a progress callback while loading onto RPC workers: use Model::load".into(),
            ));
        }
        if remote.is_remote() {
            // The load runs on another thread: no user data for the
            // progress callback (silent_progress reads none).
            raw.progress_callback_user_data = std::ptr::null_mut();
        }
        // Loading onto RPC workers sends the offloaded weights to them:
        // guarded, so that a worker that dies meanwhile is an error (the
        // load thread then stays blocked in llama.cpp, with what it holds).
        // A local load runs here.
        let owned = crate::llama::thread::SendPtr((raw, c_paths, devices, overrides, tensor_split));
        let ptr = remote.run_once("loading the model", true, move || {
            let owned = owned;
            let (raw, c_paths, ..) = &owned.0;
            let ptr = if c_paths.len() == 1 {
                // SAFETY: the path is NUL-terminated; `raw` came from the
                // defaults with valid enum values; the closure owns every
                // array `raw` points into, and the progress state it may
                // point to (`state`) outlives the call (a local load runs
                // before `run_once` returns; a remote one has none).
                unsafe { sys::llama_model_load_from_file(c_paths[0].as_ptr(), *raw) }
            } else {
                let mut ptrs: Vec<*const c_char> = c_paths.iter().map(|c| c.as_ptr()).collect();
                // SAFETY: as above; `ptrs` holds `ptrs.len()` valid C strings.
                unsafe { sys::llama_model_load_from_splits(ptrs.as_mut_ptr(), ptrs.len(), *raw) }
            };
            ptr as usize
        })? as *mut sys::llama_model;
        if ptr.is_null()
            && let Some(err) = remote.lost_during("loading the model")
        {
            // llama.cpp could not connect to a worker that died just then
            // (the guard turned its abort into a failed load).
            return Err(err);
        }
        if state.panic.is_some() {
            if let Some(p) = NonNull::new(ptr) {
                // SAFETY: a model we own and have not shared.
                unsafe { sys::llama_model_free(p.as_ptr()) };
            }
            ffi::resume(state.panic.take());
        }
        Self::loaded(ptr, paths, params, simulate, state.cancelled, remote)
    }

    /// The [`Model`] of what llama.cpp's loader returned (NULL: why not).
    fn loaded(
        ptr: *mut sys::llama_model,
        paths: &[&Path],
        params: &ModelParams,
        simulate: bool,
        cancelled: bool,
        remote: Remote,
    ) -> Result<Model> {
        let Some(ptr) = NonNull::new(ptr) else {
            if cancelled {
                return Err(Error::LoadCancelled);
            }
            return Err(Error::ModelLoad {
                path: paths[0].to_owned(),
                reason: backend::last_error_or("llama.cpp could not load it (see the llama.cpp log)"),
            });
        };
        // SAFETY: `ptr` is a live model; the vocab pointer it returns lives
        // as long as the model (it points into the model).
        let vocab = unsafe { Vocab::from_raw(sys::llama_model_get_vocab(ptr.as_ptr())) };
        let overridden = params.metadata_overrides.iter().map(|(k, v)| (k.clone(), render_override(v))).collect();
        let mut model = Model {
            ptr,
            vocab,
            vocab_only: params.vocab_only,
            simulated: simulate,
            source: Source { paths: paths.iter().map(|p| p.to_path_buf()).collect(), params: params.clone() },
            repacked: params.repack_weights,
            overridden,
            adapters: RwLock::new(()),
            extensions: Extensions::default(),
            remote,
        };
        let pre = model.metadata("tokenizer.ggml.pre");
        model.vocab.set_pre_tokenizer(pre.as_deref());
        Ok(model)
    }
}
