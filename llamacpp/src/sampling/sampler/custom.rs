//! Samplers written in Rust: the candidate list they see and the C
//! trampolines llama.cpp calls them through.

use std::cell::RefCell;
use std::ffi::{CString, c_char};

use crate::error::{Error, Result};
use crate::llama::ffi;
use crate::llama::types::Token;
use crate::sys;

/// One candidate token: id, logit and (after softmax-based samplers) its
/// probability. Same layout as `llama_token_data`.
pub type TokenData = sys::llama_token_data;

/// The candidate list a [`CustomSampler`] works on.
#[derive(Debug)]
pub struct Candidates<'a> {
    raw: &'a mut sys::llama_token_data_array,
}

impl Candidates<'_> {
    /// The candidates.
    pub fn data(&self) -> &[TokenData] {
        if self.raw.size == 0 || self.raw.data.is_null() {
            return &[];
        }
        // SAFETY: llama.cpp hands the sampler `size` valid entries for the
        // duration of the call, which `self` does not outlive.
        unsafe { std::slice::from_raw_parts(self.raw.data, self.raw.size) }
    }

    /// The candidates, mutable (to change logits).
    pub fn data_mut(&mut self) -> &mut [TokenData] {
        if self.raw.size == 0 || self.raw.data.is_null() {
            return &mut [];
        }
        // SAFETY: as in `data`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.raw.data, self.raw.size) }
    }

    /// Keeps only the first `len` candidates.
    pub fn truncate(&mut self, len: usize) {
        self.raw.size = self.raw.size.min(len);
    }

    /// Whether the candidates are sorted by descending logit.
    pub fn is_sorted(&self) -> bool {
        self.raw.sorted
    }

    /// Declares whether the candidates are sorted by descending logit,
    /// which later samplers rely on. A claim of `true` is checked (one pass
    /// over the candidates) and ignored when false; returns the flag now in
    /// effect.
    pub fn set_sorted(&mut self, sorted: bool) -> bool {
        self.raw.sorted = sorted && self.data().windows(2).all(|w| w[0].logit >= w[1].logit);
        self.raw.sorted
    }

    /// The index of the selected candidate, if a sampler selected one.
    pub fn selected(&self) -> Option<usize> {
        usize::try_from(self.raw.selected).ok().filter(|&i| i < self.raw.size)
    }

    /// Selects candidate `index` (an index into [`Candidates::data`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `index` is out of range.
    pub fn select(&mut self, index: usize) -> Result<()> {
        if index >= self.raw.size {
            return Err(Error::OutOfRange { what: "candidate", index, len: self.raw.size });
        }
        self.raw.selected = index as i64;
        Ok(())
    }
}

/// A sampler written in Rust, added to a chain with [`SamplerChain::custom`](super::SamplerChain::custom).
///
/// Panics inside these methods are caught at the C boundary and resumed
/// once llama.cpp has returned.
pub trait CustomSampler: Send + 'static {
    /// A short name.
    fn name(&self) -> &str {
        "rust"
    }
    /// Filters or reweights the candidates; a selecting sampler also calls
    /// [`Candidates::select`].
    fn apply(&mut self, candidates: &mut Candidates<'_>);
    /// Called with every token the chain accepts.
    fn accept(&mut self, _token: Token) {}
    /// Forgets all state.
    fn reset(&mut self) {}
    /// Whether [`CustomSampler::apply`] always selects a token, so that the
    /// sampler may end a chain.
    fn selects(&self) -> bool {
        false
    }
    /// A copy for [`Sampler::try_clone`](super::Sampler::try_clone).
    fn clone_sampler(&self) -> Box<dyn CustomSampler>;
}

struct CustomState {
    sampler: Box<dyn CustomSampler>,
    name: CString,
}

thread_local! {
    /// A panic caught in a custom sampler callback on this thread, resumed
    /// by the Rust code that made the C call.
    pub(super) static PENDING_PANIC: RefCell<Option<ffi::Panic>> = const { RefCell::new(None) };
}

fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    ffi::catch(f).unwrap_or_else(|panic| {
        PENDING_PANIC.with(|p| ffi::keep_first(&mut p.borrow_mut(), panic));
        default
    })
}

pub(super) fn resume_pending_panic() {
    ffi::resume(PENDING_PANIC.with(|p| p.borrow_mut().take()));
}

/// # Safety
/// `smpl` must be a sampler created by `custom_sampler_new`.
unsafe fn custom_state<'a>(smpl: *const sys::llama_sampler) -> &'a mut CustomState {
    // SAFETY: our samplers' ctx is a leaked `Box<CustomState>` that lives
    // until `custom_free`; llama.cpp never calls into a sampler concurrently
    // (samplers are not thread-safe and our `Sampler` is !Sync).
    unsafe { &mut *(*smpl).ctx.cast::<CustomState>() }
}

unsafe extern "C" fn custom_name(smpl: *const sys::llama_sampler) -> *const c_char {
    // SAFETY: called by llama.cpp on one of our custom samplers.
    unsafe { custom_state(smpl) }.name.as_ptr()
}

unsafe extern "C" fn custom_accept(smpl: *mut sys::llama_sampler, token: sys::llama_token) {
    // SAFETY: called by llama.cpp on one of our custom samplers.
    let state = unsafe { custom_state(smpl) };
    guard((), || state.sampler.accept(Token(token)));
}

unsafe extern "C" fn custom_apply(smpl: *mut sys::llama_sampler, cur_p: *mut sys::llama_token_data_array) {
    // SAFETY: called by llama.cpp on one of our custom samplers with a
    // valid candidate array for the duration of the call.
    let (state, raw) = unsafe { (custom_state(smpl), &mut *cur_p) };
    guard((), || state.sampler.apply(&mut Candidates { raw }));
}

unsafe extern "C" fn custom_reset(smpl: *mut sys::llama_sampler) {
    // SAFETY: called by llama.cpp on one of our custom samplers.
    let state = unsafe { custom_state(smpl) };
    guard((), || state.sampler.reset());
}

unsafe extern "C" fn custom_clone(smpl: *const sys::llama_sampler) -> *mut sys::llama_sampler {
    // SAFETY: called by llama.cpp on one of our custom samplers.
    let state = unsafe { custom_state(smpl) };
    // The copy's `name` is user code too: guarded with the clone.
    let copy = guard(None, || {
        let sampler = state.sampler.clone_sampler();
        let name = sampler_name(&*sampler);
        Some((sampler, name))
    });
    match copy {
        // SAFETY: creating a new custom sampler has no preconditions.
        Some((sampler, name)) => unsafe { custom_sampler_new(sampler, name) },
        // llama.cpp cannot handle NULL here: give an inert copy and let
        // the resumed panic report the failure.
        // SAFETY: as above.
        None => unsafe { custom_sampler_new(Box::new(Inert), CString::default()) },
    }
}

unsafe extern "C" fn custom_free(smpl: *mut sys::llama_sampler) {
    // SAFETY: llama.cpp calls free once, after which the ctx is never used.
    let state = unsafe { Box::from_raw((*smpl).ctx.cast::<CustomState>()) };
    guard((), move || drop(state));
}

/// The one interface table of all Rust samplers; llama.cpp keeps a pointer
/// to it, so it must be a `static`.
static CUSTOM_IFACE: sys::llama_sampler_i = sys::llama_sampler_i {
    name: Some(custom_name),
    accept: Some(custom_accept),
    apply: Some(custom_apply),
    reset: Some(custom_reset),
    clone: Some(custom_clone),
    free: Some(custom_free),
    backend_init: None,
    backend_accept: None,
    backend_apply: None,
    backend_set_input: None,
    backend_reset: None,
    copy_state: None,
};

pub(super) struct Inert;
impl CustomSampler for Inert {
    fn apply(&mut self, _: &mut Candidates<'_>) {}
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(Inert)
    }
}

/// A sampler's name as llama.cpp reads it (NUL bytes dropped). Calls
/// user code: from a C callback, call it under `guard`.
pub(super) fn sampler_name(sampler: &dyn CustomSampler) -> CString {
    CString::new(sampler.name().replace('\0', "")).unwrap_or_default()
}

/// # Safety
/// None beyond FFI: the returned sampler must be freed by llama.cpp.
pub(super) unsafe fn custom_sampler_new(sampler: Box<dyn CustomSampler>, name: CString) -> *mut sys::llama_sampler {
    let state = Box::into_raw(Box::new(CustomState { sampler, name }));
    // SAFETY: the interface is a `static`; the state pointer stays valid
    // until llama.cpp calls `custom_free`. llama_sampler_init only stores
    // the two pointers.
    unsafe { sys::llama_sampler_init((&raw const CUSTOM_IFACE).cast_mut(), state.cast()) }
}

/// Resumes a panic that a custom sampler's destructor raised while
/// llama.cpp freed it, unless this thread is already unwinding (a second
/// panic would abort).
pub(super) fn resume_pending_panic_in_drop() {
    if std::thread::panicking() {
        PENDING_PANIC.with(|p| p.borrow_mut().take());
    } else {
        resume_pending_panic();
    }
}
