//! Sampler chains: turning a logits row into the next token.
//!
//! A [`Sampler`] is always a llama.cpp sampler chain. Build one with
//! [`SamplerChain`] (or [`Sampler::greedy`]); building checks that the
//! chain ends with a token-selecting sampler, which llama.cpp would
//! otherwise only notice with an abort inside `llama_sampler_sample`.
//!
//! [`Sampler::sample`] runs the chain itself rather than through
//! `llama_sampler_sample`, and takes two shortcuts where they give exactly
//! the same token: a greedy chain is an argmax over the logits row, and a
//! chain that starts with top-k first selects the `k` best logits and runs
//! the rest of the chain on those only, instead of materialising all
//! `n_vocab` candidates (262,144 for Gemma 3) on every token.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::context::Context;
use crate::error::{Error, Result, check_shim};
use crate::stack::{DeepStack, SendPtr, with_stack};
use crate::sys;
use crate::vocab::{Token, Vocab};

mod deep;
mod scan;
mod select;

pub(crate) use deep::REGEX_STACK_PER_BYTE;

/// The longest penalty window accepted (llama.cpp allocates it up front,
/// and a huge one throws `bad_alloc` through the C API).
const MAX_PENALTY_WINDOW: i32 = 1 << 20;

/// What this crate knows about one sampler of a chain.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Greedy,
    TopK(i32),
    Grammar,
    /// Any other built-in or custom sampler; `selects` if it picks a token.
    Other {
        selects: bool,
    },
}

impl Kind {
    fn selects(self) -> bool {
        matches!(self, Kind::Greedy | Kind::Other { selects: true })
    }
}

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
    /// [`Error::InvalidArgument`] if `index` is out of range.
    pub fn select(&mut self, index: usize) -> Result<()> {
        if index >= self.raw.size {
            return Err(Error::InvalidArgument(format!("candidate {index} out of 0..{}", self.raw.size)));
        }
        self.raw.selected = index as i64;
        Ok(())
    }
}

/// A sampler written in Rust, added to a chain with [`SamplerChain::custom`].
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
    /// A copy for [`Sampler::try_clone`].
    fn clone_sampler(&self) -> Box<dyn CustomSampler>;
}

struct CustomState {
    sampler: Box<dyn CustomSampler>,
    name: CString,
}

thread_local! {
    /// A panic caught in a custom sampler callback on this thread, resumed
    /// by the Rust code that made the C call.
    static PENDING_PANIC: RefCell<Option<Box<dyn Any + Send>>> = const { RefCell::new(None) };
}

fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            PENDING_PANIC.with(|p| {
                p.borrow_mut().get_or_insert(payload);
            });
            default
        }
    }
}

fn resume_pending_panic() {
    if let Some(payload) = PENDING_PANIC.with(|p| p.borrow_mut().take()) {
        std::panic::resume_unwind(payload);
    }
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
    let copy = guard(None, || Some(state.sampler.clone_sampler()));
    match copy {
        // SAFETY: creating a new custom sampler has no preconditions.
        Some(sampler) => unsafe { custom_sampler_new(sampler) },
        // llama.cpp cannot handle NULL here: give an inert copy and let
        // the resumed panic report the failure.
        // SAFETY: as above.
        None => unsafe { custom_sampler_new(Box::new(Inert)) },
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

struct Inert;
impl CustomSampler for Inert {
    fn apply(&mut self, _: &mut Candidates<'_>) {}
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(Inert)
    }
}

/// # Safety
/// None beyond FFI: the returned sampler must be freed by llama.cpp.
unsafe fn custom_sampler_new(sampler: Box<dyn CustomSampler>) -> *mut sys::llama_sampler {
    let name = CString::new(sampler.name().replace('\0', "")).unwrap_or_default();
    let state = Box::into_raw(Box::new(CustomState { sampler, name }));
    // SAFETY: the interface is a `static`; the state pointer stays valid
    // until llama.cpp calls `custom_free`. llama_sampler_init only stores
    // the two pointers.
    unsafe { sys::llama_sampler_init((&raw const CUSTOM_IFACE).cast_mut(), state.cast()) }
}

/// Builds a [`Sampler`] chain, sampler by sampler, in order.
///
/// ```
/// # fn main() -> Result<(), llama::Error> {
/// let sampler = llama::SamplerChain::new().top_k(40).top_p(0.95, 1).temp(0.8).dist(42).build()?;
/// # Ok(()) }
/// ```
pub struct SamplerChain<'m> {
    chain: NonNull<sys::llama_sampler>,
    kinds: Vec<Kind>,
    vocab: Option<VocabId>,
    /// The stack that creating and advancing the chain's grammars needs
    /// (see `crate::stack`).
    grammar_stack: usize,
    /// The chain has a lazy grammar with trigger patterns: every accepted
    /// token's text is matched against them while it waits.
    lazy_patterns: bool,
    /// Mask with the grammars before every pick (see `Sampler::select`).
    grammar_first: bool,
    _vocab: PhantomData<&'m Vocab>,
}

/// The vocabulary a chain's samplers were built with (grammar, DRY,
/// infill, logit bias, mirostat): they hold its token ids or read its
/// texts, so the chain may only sample from contexts of that model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct VocabId {
    ptr: *const sys::llama_vocab,
    n_tokens: i32,
}

impl VocabId {
    fn of(vocab: &Vocab) -> VocabId {
        VocabId { ptr: vocab.as_ptr(), n_tokens: vocab.n_tokens() as i32 }
    }
}

impl fmt::Debug for SamplerChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SamplerChain").field("samplers", &self.kinds.len()).finish()
    }
}

// SAFETY: the chain is exclusively owned; llama.cpp samplers have no thread
// affinity (llama-cpp-c-api.md §1.17: "llama_sampler is Send, !Sync"), and
// custom samplers are `Send`. Samplers that hold a vocab pointer read only
// immutable, thread-safe vocab data.
unsafe impl Send for SamplerChain<'_> {}

impl Default for SamplerChain<'_> {
    fn default() -> Self {
        Self::new()
    }
}

macro_rules! chain_methods {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) => $init:ident($($expr:expr),*), $kind:expr;)*) => {$(
        $(#[$doc])*
        #[doc = concat!("\n\nWraps `", stringify!($init), "`.")]
        #[must_use]
        pub fn $name(self, $($arg: $ty),*) -> Self {
            // SAFETY: the constructor copies its arguments and returns a
            // fresh sampler (never NULL for these built-ins).
            let raw = unsafe { sys::$init($($expr),*) };
            self.push(raw, $kind)
        }
    )*};
}

impl<'m> SamplerChain<'m> {
    /// An empty chain.
    #[doc(alias = "llama_sampler_chain_init")]
    pub fn new() -> Self {
        crate::backend::init();
        // SAFETY: returns default chain parameters.
        let mut params = unsafe { sys::llama_sampler_chain_default_params() };
        params.no_perf = true;
        // SAFETY: creates a new, empty chain we own.
        let chain = unsafe { sys::llama_sampler_chain_init(params) };
        SamplerChain {
            chain: NonNull::new(chain).expect("llama_sampler_chain_init never returns NULL"),
            kinds: Vec::new(),
            vocab: None,
            grammar_stack: 0,
            lazy_patterns: false,
            grammar_first: false,
            _vocab: PhantomData,
        }
    }

    /// How the chain's grammars constrain each pick. `false` (the default,
    /// as llama.cpp's `common_sampler`): pick without the grammars, keep
    /// the token if every grammar allows it (checking one candidate), and
    /// only otherwise pick again with the grammars masking the vocabulary,
    /// typically 100 times cheaper per token (masking 262,144 candidates
    /// costs 45–140 ms, `cargo bench --bench grammar`). For a greedy chain
    /// the token is the same either way; for a random one, an allowed token
    /// keeps its unconstrained probability of being picked first. `true`:
    /// always mask first, so a random pick follows the constrained
    /// distribution exactly.
    #[must_use]
    pub fn grammar_first(mut self, on: bool) -> Self {
        self.grammar_first = on;
        self
    }

    /// Records that the next sampler is built with `vocab`. All of a
    /// chain's vocabulary-bound samplers must share one vocabulary.
    fn bind_vocab(&mut self, vocab: &Vocab) -> Result<()> {
        let id = VocabId::of(vocab);
        match self.vocab {
            Some(bound) if bound != id => Err(Error::WrongModel("a sampler of this chain")),
            _ => {
                self.vocab = Some(id);
                Ok(())
            }
        }
    }

    fn push(mut self, raw: *mut sys::llama_sampler, kind: Kind) -> Self {
        if raw.is_null() {
            return self;
        }
        // SAFETY: `chain` is a chain we own and `raw` a fresh sampler owned
        // by nobody; the chain takes ownership and frees it.
        unsafe { sys::llama_sampler_chain_add(self.chain.as_ptr(), raw) };
        self.kinds.push(kind);
        self
    }

    chain_methods! {
        /// Picks the most likely token.
        greedy() => llama_sampler_init_greedy(), Kind::Greedy;
        /// Picks a token at random by probability; `u32::MAX` seeds from the clock.
        dist(seed: u32) => llama_sampler_init_dist(seed), Kind::Other { selects: true };
        /// Keeps the `k` most likely tokens (`k <= 0`: no-op).
        top_k(k: i32) => llama_sampler_init_top_k(k), Kind::TopK(k);
        /// Nucleus sampling: keeps the smallest set with probability ≥ `p`.
        top_p(p: f32, min_keep: usize) => llama_sampler_init_top_p(p, min_keep), Kind::Other { selects: false };
        /// Keeps tokens with probability ≥ `p` × the best one's.
        min_p(p: f32, min_keep: usize) => llama_sampler_init_min_p(p, min_keep), Kind::Other { selects: false };
        /// Locally typical sampling.
        typical(p: f32, min_keep: usize) => llama_sampler_init_typical(p, min_keep), Kind::Other { selects: false };
        /// Divides logits by `t` (`t <= 0` keeps only the best token).
        temp(t: f32) => llama_sampler_init_temp(t), Kind::Other { selects: false };
        /// Dynamic (entropy-based) temperature.
        temp_ext(t: f32, delta: f32, exponent: f32) => llama_sampler_init_temp_ext(t, delta, exponent), Kind::Other { selects: false };
        /// Exclude Top Choices: sometimes removes the most likely tokens.
        xtc(p: f32, t: f32, min_keep: usize, seed: u32) => llama_sampler_init_xtc(p, t, min_keep, seed), Kind::Other { selects: false };
        /// Keeps tokens within `n` standard deviations of the best logit.
        top_n_sigma(n: f32) => llama_sampler_init_top_n_sigma(n), Kind::Other { selects: false };
        /// Mirostat 2.0 (selects a token).
        mirostat_v2(seed: u32, tau: f32, eta: f32) => llama_sampler_init_mirostat_v2(seed, tau, eta), Kind::Other { selects: true };
        /// Adaptive-p (selects a token; must be last).
        adaptive_p(target: f32, decay: f32, seed: u32) => llama_sampler_init_adaptive_p(target, decay, seed), Kind::Other { selects: true };
    }

    /// Mirostat 1.0 (selects a token).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `m >= 2` and `tau`, `eta` are
    /// finite (otherwise llama.cpp's estimate is NaN from the start). Put
    /// no sampler that can leave a single candidate (e.g. `top_k(1)`) in
    /// front of it: its estimate is then 0/0 as well.
    #[doc(alias = "llama_sampler_init_mirostat")]
    pub fn mirostat(mut self, vocab: &Vocab, seed: u32, tau: f32, eta: f32, m: i32) -> Result<Self> {
        self.bind_vocab(vocab)?;
        if m < 2 || !tau.is_finite() || !eta.is_finite() {
            return Err(Error::InvalidArgument(format!(
                "mirostat needs m >= 2 and finite tau and eta (got m {m}, tau {tau}, eta {eta})"
            )));
        }
        // SAFETY: copies its arguments; the vocab size is only a number.
        let raw = unsafe { sys::llama_sampler_init_mirostat(vocab.n_tokens() as i32, seed, tau, eta, m) };
        Ok(self.push(raw, Kind::Other { selects: true }))
    }

    /// Repetition penalties over the last `last_n` accepted tokens (at most
    /// 2^20; llama.cpp allocates the window up front). A chain skips it
    /// when `last_n <= 0` (llama.cpp clamps negative values to 0, which
    /// disables it) or all three penalties are neutral.
    #[doc(alias = "llama_sampler_init_penalties")]
    #[must_use]
    pub fn penalties(self, last_n: i32, repeat: f32, frequency: f32, presence: f32) -> Self {
        if last_n <= 0 || (repeat == 1.0 && frequency == 0.0 && presence == 0.0) {
            return self;
        }
        let last_n = last_n.min(MAX_PENALTY_WINDOW);
        // SAFETY: copies its arguments (n_vocab is unused by this sampler);
        // the window is bounded, so its allocation cannot throw.
        let raw = unsafe { sys::llama_sampler_init_penalties(0, last_n, repeat, frequency, presence) };
        self.push(raw, Kind::Other { selects: false })
    }

    /// Adds `bias` to the logit of each listed token.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for a token outside the vocabulary.
    #[doc(alias = "llama_sampler_init_logit_bias")]
    pub fn logit_bias(mut self, vocab: &Vocab, biases: &[(Token, f32)]) -> Result<Self> {
        self.bind_vocab(vocab)?;
        let raw_biases = biases
            .iter()
            .map(|&(t, bias)| vocab.check(t).map(|t| sys::llama_logit_bias { token: t.0, bias }))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: the biases are copied; every token is inside the vocab.
        let raw = unsafe {
            sys::llama_sampler_init_logit_bias(vocab.n_tokens() as i32, raw_biases.len() as i32, raw_biases.as_ptr())
        };
        Ok(self.push(raw, Kind::Other { selects: false }))
    }

    /// DRY ("don't repeat yourself") penalty over the last `last_n` tokens
    /// (at most 2^20; 0 or negative disables it). The vocabulary is only
    /// read while building (to tokenize the sequence breakers).
    #[doc(alias = "llama_sampler_init_dry")]
    pub fn dry(
        mut self,
        vocab: &Vocab,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        last_n: i32,
        sequence_breakers: &[&str],
    ) -> Result<Self> {
        self.bind_vocab(vocab)?;
        let breakers = sequence_breakers.iter().map(|s| CString::new(*s)).collect::<Result<Vec<_>, _>>()?;
        let mut ptrs: Vec<*const c_char> = breakers.iter().map(|s| s.as_ptr()).collect();
        let last_n = last_n.min(MAX_PENALTY_WINDOW);
        // SAFETY: the vocab is live for the call and not kept; the strings
        // are copied.
        let raw = unsafe {
            sys::llama_sampler_init_dry(
                vocab.as_ptr(),
                multiplier,
                base,
                allowed_length,
                last_n,
                ptrs.as_mut_ptr(),
                ptrs.len(),
            )
        };
        Ok(self.push(raw, Kind::Other { selects: false }))
    }

    /// Fill-in-the-middle post-processing. Keeps a pointer to the vocab.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a model without a vocabulary (the
    /// sampler renders tokens as text, where llama.cpp would abort).
    #[doc(alias = "llama_sampler_init_infill")]
    pub fn infill(mut self, vocab: &'m Vocab) -> Result<Self> {
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        // SAFETY: the vocab outlives the chain ('m).
        let raw = unsafe { sys::llama_sampler_init_infill(vocab.as_ptr()) };
        Ok(self.push(raw, Kind::Other { selects: false }))
    }

    /// Constrains output to a GBNF grammar starting at rule `root`. Keeps a
    /// pointer to the vocab.
    ///
    /// llama.cpp's grammar code recurses once per nesting level and along
    /// chains of rules, so a deeply nested grammar runs (here and on every
    /// token it constrains) on a helper thread with a stack sized for it
    /// instead of overflowing the caller's.
    ///
    /// # Errors
    /// [`Error::Grammar`] if the grammar does not parse, or repeats in a
    /// way llama.cpp cannot handle: `{m,n}` with `n < m` (its parser never
    /// returns), a repetition operator applied to another (`x++`: each
    /// multiplies the parse stacks kept on every token).
    #[doc(alias = "llama_sampler_init_grammar")]
    pub fn grammar(mut self, vocab: &'m Vocab, gbnf: &str, root: &str) -> Result<Self> {
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        let (g, r) = (CString::new(gbnf)?, CString::new(root)?);
        let stack = deep::grammar_stack(gbnf).map_err(Error::Grammar)?;
        let vocab_ptr = SendPtr(vocab.as_ptr().cast_mut());
        let raw = init_grammar(stack, "llama_sampler_init_grammar", move |raw| {
            // SAFETY: NUL-terminated strings; the vocab outlives the chain
            // (and this call, which the scoped thread does not outlive);
            // the shim catches exceptions.
            unsafe {
                sys::shim::llama_rs_sampler_init_grammar(vocab_ptr.get().cast_const(), g.as_ptr(), r.as_ptr(), raw)
            }
        })?;
        self.grammar_stack = self.grammar_stack.max(stack);
        Ok(self.push(raw, Kind::Grammar))
    }

    /// A grammar that only starts constraining once a trigger appears: a
    /// regex over the generated text (`trigger_patterns`, matched from the
    /// start) or one of `trigger_tokens`.
    ///
    /// While the grammar waits for its trigger, llama.cpp matches each
    /// pattern against all text generated so far, on every token: the cost
    /// grows with that text (quadratic over a generation), and so does the
    /// matcher's recursion, which runs on a helper thread with a stack
    /// sized for the text once it grows past a few hundred bytes. Prefer
    /// trigger tokens, or patterns anchored to short text.
    ///
    /// # Errors
    /// [`Error::Grammar`] if the grammar or a pattern does not parse, the
    /// grammar repeats as [`SamplerChain::grammar`] refuses, or a pattern
    /// applies a quantifier to a quantifier (`a+*`: exponential
    /// backtracking in libstdc++'s matcher);
    /// [`Error::InvalidToken`] for a trigger token outside the vocabulary.
    #[doc(alias = "llama_sampler_init_grammar_lazy_patterns")]
    pub fn grammar_lazy(
        mut self,
        vocab: &'m Vocab,
        gbnf: &str,
        root: &str,
        trigger_patterns: &[&str],
        trigger_tokens: &[Token],
    ) -> Result<Self> {
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        for &t in trigger_tokens {
            vocab.check(t)?;
        }
        let (g, r) = (CString::new(gbnf)?, CString::new(root)?);
        let patterns = trigger_patterns.iter().map(|s| CString::new(*s)).collect::<Result<Vec<_>, _>>()?;
        for pattern in trigger_patterns {
            deep::check_pattern(pattern).map_err(Error::Grammar)?;
        }
        let stack = deep::grammar_stack(gbnf).map_err(Error::Grammar)?.max(deep::patterns_stack(trigger_patterns));
        let vocab_ptr = SendPtr(vocab.as_ptr().cast_mut());
        let raw = init_grammar(stack, "llama_sampler_init_grammar_lazy_patterns", move |raw| {
            let mut ptrs: Vec<*const c_char> = patterns.iter().map(|s| s.as_ptr()).collect();
            // SAFETY: NUL-terminated strings and arrays of the given
            // lengths, all copied; the vocab outlives the chain; the shim
            // catches exceptions (an invalid regex throws).
            unsafe {
                sys::shim::llama_rs_sampler_init_grammar_lazy_patterns(
                    vocab_ptr.get().cast_const(),
                    g.as_ptr(),
                    r.as_ptr(),
                    ptrs.as_mut_ptr(),
                    ptrs.len(),
                    trigger_tokens.as_ptr().cast(),
                    trigger_tokens.len(),
                    raw,
                )
            }
        })?;
        self.grammar_stack = self.grammar_stack.max(stack);
        self.lazy_patterns |= !trigger_patterns.is_empty();
        Ok(self.push(raw, Kind::Grammar))
    }

    /// Adds a sampler written in Rust.
    #[doc(alias = "llama_sampler_init")]
    #[must_use]
    pub fn custom(self, sampler: impl CustomSampler) -> Self {
        let selects = sampler.selects();
        // SAFETY: creates a sampler that the chain will own and free.
        let raw = unsafe { custom_sampler_new(Box::new(sampler)) };
        self.push(raw, Kind::Other { selects })
    }

    /// Finishes the chain.
    ///
    /// # Errors
    /// [`Error::NoSelector`] unless the last sampler selects a token
    /// (greedy, dist, mirostat, mirostat v2, adaptive-p, or a custom sampler
    /// whose `selects()` is true).
    pub fn build(self) -> Result<Sampler<'m>> {
        if !self.kinds.last().is_some_and(|k| k.selects()) {
            return Err(Error::NoSelector);
        }
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: moving the fields out of a value that will not be dropped.
        let kinds = unsafe { std::ptr::read(&this.kinds) };
        let mut sampler = Sampler::from_parts(this.chain, kinds);
        sampler.vocab = this.vocab;
        sampler.grammar_stack = this.grammar_stack;
        sampler.lazy_patterns = this.lazy_patterns;
        sampler.grammar_first = this.grammar_first;
        Ok(sampler)
    }
}

impl Drop for SamplerChain<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the chain and, through it, every sampler in it.
        unsafe { sys::llama_sampler_free(self.chain.as_ptr()) }
        resume_pending_panic_in_drop();
    }
}

/// Resumes a panic that a custom sampler's destructor raised while
/// llama.cpp freed it, unless this thread is already unwinding (a second
/// panic would abort).
fn resume_pending_panic_in_drop() {
    if std::thread::panicking() {
        PENDING_PANIC.with(|p| p.borrow_mut().take());
    } else {
        resume_pending_panic();
    }
}

/// A complete sampler chain that turns logits into tokens.
///
/// Chains with a grammar, DRY or infill sampler keep a pointer to the
/// model's vocabulary and so borrow the model (`'m`).
pub struct Sampler<'m> {
    chain: NonNull<sys::llama_sampler>,
    kinds: Vec<Kind>,
    /// The chain's samplers and whether each has an `apply`: looked up once,
    /// since a built chain never changes.
    children: Vec<(NonNull<sys::llama_sampler>, bool)>,
    /// Set when accepting a token threw inside llama.cpp. A grammar is then
    /// left with no parse stack, and applying it would abort
    /// (`GGML_ASSERT(!stacks.empty())`), so the chain refuses to run until
    /// [`Sampler::reset`].
    failed: Option<String>,
    /// Reused candidate buffer: no allocation per token.
    scratch: Vec<TokenData>,
    /// Min-heap scratch for the top-k shortcut.
    heap: Vec<(f32, i32)>,
    /// The vocabulary the chain's samplers hold ids of, if any.
    vocab: Option<VocabId>,
    /// The stack the chain's grammars need (see `crate::stack`).
    grammar_stack: usize,
    /// A lazy grammar with trigger patterns is in the chain.
    lazy_patterns: bool,
    /// See [`SamplerChain::grammar_first`].
    grammar_first: bool,
    /// Bytes of text accepted since the last reset: an upper bound on what
    /// a lazy grammar's trigger patterns are matched against.
    lazy_bytes: usize,
    /// The helper thread that runs the chain when its grammars need more
    /// stack than a caller's thread can be assumed to have.
    deep: DeepStack,
    _vocab: PhantomData<&'m Vocab>,
}

/// Creates a grammar sampler through `init` (a shim call that writes the
/// sampler to its argument and returns the shim's code) on a stack of
/// `stack` bytes. Its errors are read on the thread that ran it: llama.cpp's
/// log and the shim's exception message are kept per thread.
fn init_grammar(
    stack: usize,
    function: &'static str,
    init: impl FnOnce(&mut *mut sys::llama_sampler) -> std::os::raw::c_int + Send,
) -> Result<*mut sys::llama_sampler> {
    let raw = with_stack("the grammar", stack, move || {
        crate::backend::clear_last_error();
        let mut raw = std::ptr::null_mut();
        let code = init(&mut raw);
        check_shim(code, function).map_err(|e| Error::Grammar(e.to_string()))?;
        if raw.is_null() {
            return Err(Error::Grammar(crate::backend::last_error_or("the grammar does not parse")));
        }
        Ok(SendPtr(raw))
    })??;
    Ok(raw.get())
}

/// Whether the grammar sampler `grammar` allows `token` next: its `apply`
/// on a one-candidate list (cheap, unlike masking the whole vocabulary).
/// Runs on the caller's stack, which must be the grammar's (see `deep`).
fn grammar_allows(grammar: SendPtr<sys::llama_sampler>, token: Token) -> Result<bool> {
    let mut one = TokenData { id: token.0, logit: 0.0, p: 0.0 };
    let mut cur = sys::llama_token_data_array { data: &mut one, size: 1, selected: -1, sorted: false };
    // SAFETY: a live grammar sampler of a chain the caller owns, and a
    // one-element array on this stack; the shim catches exceptions.
    let code = unsafe { sys::shim::llama_rs_sampler_apply(grammar.get(), &mut cur) };
    check_shim(code, "llama_sampler_apply").map_err(|e| Error::Grammar(e.to_string()))?;
    Ok(one.logit != f32::NEG_INFINITY)
}

/// Runs `f` with `needed` bytes of stack on `helper` (see `crate::stack`).
/// A panic of a custom sampler that `f` caught but did not resume is handed
/// back to this thread's pending slot, so the usual resume points see it.
fn deep<R: Send>(helper: &mut DeepStack, needed: usize, f: impl FnOnce() -> R + Send) -> Result<R> {
    let (r, panic) = helper.run("the grammar's recursion", needed, || {
        let r = f();
        (r, PENDING_PANIC.with(|p| p.borrow_mut().take()))
    })?;
    if let Some(payload) = panic {
        PENDING_PANIC.with(|p| {
            p.borrow_mut().get_or_insert(payload);
        });
    }
    Ok(r)
}

// SAFETY: see `SamplerChain`. Not Sync: sampling mutates RNG state and the
// chain's scratch buffer.
unsafe impl Send for Sampler<'_> {}

impl fmt::Debug for Sampler<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler").field("samplers", &self.kinds.len()).finish()
    }
}

/// Which way [`Sampler::sample`] went, for tests and benchmarks.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplePath {
    /// Argmax over the logits row.
    Greedy,
    /// Top-k preselection, rest of the chain on `k` candidates.
    TopK,
    /// All candidates through the whole chain.
    Full,
}

impl Sampler<'static> {
    /// A chain of one greedy sampler.
    pub fn greedy() -> Sampler<'static> {
        SamplerChain::new().greedy().build().unwrap_or_else(|_| unreachable!("greedy selects"))
    }

    /// A chain of one `dist` sampler with `seed`.
    pub fn dist(seed: u32) -> Sampler<'static> {
        SamplerChain::new().dist(seed).build().unwrap_or_else(|_| unreachable!("dist selects"))
    }
}

impl<'m> Sampler<'m> {
    fn from_parts(chain: NonNull<sys::llama_sampler>, kinds: Vec<Kind>) -> Sampler<'m> {
        // Every sampler added was non-NULL, so chain_get finds one per kind
        // (a NULL would only shorten the list, never misalign it).
        let children = (0..kinds.len())
            .map_while(|i| {
                // SAFETY: `i` is below the chain's length, so this is a child
                // the chain owns; it lives as long as the chain.
                let child = NonNull::new(unsafe { sys::llama_sampler_chain_get(chain.as_ptr(), i as i32) })?;
                // SAFETY: a live sampler always has an interface table.
                let has_apply = unsafe { (*child.as_ref().iface).apply.is_some() };
                Some((child, has_apply))
            })
            .collect();
        Sampler {
            chain,
            kinds,
            children,
            failed: None,
            scratch: Vec::new(),
            heap: Vec::new(),
            vocab: None,
            grammar_stack: 0,
            lazy_patterns: false,
            grammar_first: false,
            lazy_bytes: 0,
            deep: DeepStack::default(),
            _vocab: PhantomData,
        }
    }

    /// The stack that calls into the chain need now.
    fn stack_needed(&self) -> usize {
        let lazy = if self.lazy_patterns { self.lazy_bytes.saturating_mul(deep::REGEX_STACK_PER_BYTE) } else { 0 };
        self.grammar_stack.max(lazy)
    }

    /// Checks a token against the vocabulary the chain was built with (any
    /// non-negative id for a chain without one: its samplers index no
    /// table by id).
    fn check_token(&self, token: Token) -> Result<()> {
        let n_vocab = self.vocab.map_or(i32::MAX, |v| v.n_tokens);
        if token.0 < 0 || token.0 >= n_vocab {
            return Err(Error::InvalidToken { token: token.0, n_vocab });
        }
        Ok(())
    }

    /// The raw chain pointer, for calls this crate does not wrap. Samplers
    /// must not be added to or removed from the chain through it: this
    /// wrapper keeps pointers to the chain's members.
    pub fn as_ptr(&mut self) -> *mut sys::llama_sampler {
        self.chain.as_ptr()
    }

    /// The number of samplers in the chain.
    #[doc(alias = "llama_sampler_chain_n")]
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Always false: a built chain has at least its selecting sampler.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The seed of the chain's `dist` or mirostat sampler (`u32::MAX` when
    /// it has none; the seeds of XTC and adaptive-p are not reported).
    #[doc(alias = "llama_sampler_get_seed")]
    pub fn seed(&self) -> u32 {
        // SAFETY: reads the chain's seed.
        unsafe { sys::llama_sampler_get_seed(self.chain.as_ptr()) }
    }

    /// Samples the next token from output `idx` of the last decode (a batch
    /// index, or negative from the end: -1 is the last output), and accepts
    /// it into the chain's state.
    ///
    /// # Errors
    /// [`Error::NoOutput`] if `idx` has no logits; [`Error::Grammar`] if a
    /// grammar allows no candidate, or the chain failed to accept a token
    /// earlier and was not [reset](Sampler::reset) since;
    /// [`Error::Exception`] if a sampler threw.
    #[doc(alias = "llama_sampler_sample")]
    pub fn sample(&mut self, ctx: &mut Context<'_>, idx: i32) -> Result<Token> {
        self.sample_with_path(ctx, idx).map(|(t, _)| t)
    }

    /// [`Sampler::sample`], also telling which implementation ran: for
    /// tests and benchmarks of the shortcuts.
    ///
    /// # Errors
    /// As [`Sampler::sample`].
    #[doc(hidden)]
    pub fn sample_with_path(&mut self, ctx: &mut Context<'_>, idx: i32) -> Result<(Token, SamplePath)> {
        self.check_not_failed()?;
        if let Some(vocab) = self.vocab
            && vocab.ptr != ctx.model().vocab().as_ptr()
        {
            return Err(Error::WrongModel("the sampler (built with another model's vocabulary)"));
        }
        let logits = ctx.logits(idx)?;
        let needed = self.stack_needed();
        let (token, path, allowed) = if needed == 0 {
            self.select(logits)?
        } else {
            let mut helper = std::mem::take(&mut self.deep);
            let selected = deep(&mut helper, needed, || self.select(logits));
            self.deep = helper;
            selected??
        };
        // A sampler after the grammar (a custom one, logit bias, penalties,
        // temperature) can turn a masked logit finite again, and accepting
        // a token the grammar forbids throws, or aborts for an end token:
        // check it against each grammar first (one candidate, cheap),
        // unless the selection just did.
        if self.kinds.contains(&Kind::Grammar) && !allowed {
            self.accept(token)?;
        } else {
            self.accept_unchecked(token)?;
        }
        Ok((token, path))
    }

    /// Feeds a token into the chain's state (penalties, grammar, mirostat).
    /// [`Sampler::sample`] does this already for the token it returns.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for a negative id, or one outside the
    /// vocabulary the chain was built with (grammar, DRY, infill, logit
    /// bias, mirostat); [`Error::Grammar`] if a grammar in the chain
    /// forbids `token` (or it ends generation before the grammar is
    /// complete), where llama.cpp would throw or abort.
    #[doc(alias = "llama_sampler_accept")]
    pub fn accept(&mut self, token: Token) -> Result<()> {
        self.check_not_failed()?;
        self.check_token(token)?;
        for i in 0..self.kinds.len() {
            if self.kinds[i] == Kind::Grammar {
                self.check_grammar_allows(i, token)?;
            }
        }
        self.accept_unchecked(token)
    }

    /// The length of a token's text, which a lazy grammar appends to the
    /// text its patterns are matched against.
    fn piece_len(&self, token: Token) -> usize {
        let Some(vocab) = self.vocab else { return 0 };
        let mut n = 0;
        let mut buf = [0u8; 64];
        // SAFETY: the vocab outlives the chain ('m); `buf` has 64 writable
        // bytes (a longer piece is not copied: llama.cpp returns minus its
        // length); the shim catches the exception of an id outside the
        // vocabulary.
        let code = unsafe {
            sys::shim::llama_rs_token_to_piece(vocab.ptr, token.0, buf.as_mut_ptr().cast(), 64, 0, true, &mut n)
        };
        if code == sys::shim::OK { n.unsigned_abs() as usize } else { 0 }
    }

    /// Accepts a token known to pass every grammar of the chain.
    fn accept_unchecked(&mut self, token: Token) -> Result<()> {
        if self.lazy_patterns {
            self.lazy_bytes = self.lazy_bytes.saturating_add(self.piece_len(token));
        }
        let chain = SendPtr(self.chain.as_ptr());
        let needed = self.stack_needed();
        let result = deep(&mut self.deep, needed, move || {
            // SAFETY: a chain we own, used by this call alone; the shim
            // catches exceptions.
            let code = unsafe { sys::shim::llama_rs_sampler_accept(chain.get(), token.0) };
            check_shim(code, "llama_sampler_accept").map_err(|e| Error::Grammar(e.to_string()))
        })?;
        if let Err(Error::Grammar(why)) = &result {
            // E.g. a lazy grammar whose trigger replays text it rejects: the
            // grammar threw after emptying its stacks.
            self.failed = Some(why.clone());
        }
        resume_pending_panic();
        result
    }

    fn check_not_failed(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(Error::Grammar(format!("the sampler needs a reset() after a failed accept: {why}"))),
        }
    }

    /// Runs grammar child `i` on the single candidate `token`: the grammar
    /// masks it to -inf if it may not come next.
    fn check_grammar_allows(&mut self, i: usize, token: Token) -> Result<()> {
        let Some(&(child, _)) = self.children.get(i) else { return Ok(()) };
        let child = SendPtr(child.as_ptr());
        let allowed = deep(&mut self.deep, self.grammar_stack, move || grammar_allows(child, token))??;
        if !allowed {
            return Err(Error::Grammar(format!("token {token} is not allowed by the grammar here")));
        }
        Ok(())
    }

    /// Resets the chain's state (RNG seeds are kept, history is dropped; a
    /// grammar starts over), also after a failed [`Sampler::accept`].
    #[doc(alias = "llama_sampler_reset")]
    pub fn reset(&mut self) {
        let chain = SendPtr(self.chain.as_ptr());
        // Resetting a grammar parses its text again: that needs the
        // grammar's stack.
        let done = deep(&mut self.deep, self.grammar_stack, move || {
            // SAFETY: a chain we own, used by this call alone. Resetting a
            // grammar rebuilds it from its text, so a grammar left without
            // stacks works again.
            unsafe { sys::llama_sampler_reset(chain.get()) };
        });
        self.lazy_bytes = 0;
        self.failed = match done {
            Ok(()) => None,
            Err(e) => Some(format!("reset failed: {e}")),
        };
        resume_pending_panic();
    }

    /// A copy of the chain with its current state.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if llama.cpp returns no copy.
    #[doc(alias = "llama_sampler_clone")]
    pub fn try_clone(&self) -> Result<Sampler<'m>> {
        // SAFETY: a chain we own; every sampler in it (built-in or ours)
        // implements clone.
        let copy = unsafe { sys::llama_sampler_clone(self.chain.as_ptr()) };
        // Own the copy before resuming a panic, so that unwinding frees it.
        let copy = NonNull::new(copy).map(|chain| {
            let mut sampler = Sampler::from_parts(chain, self.kinds.clone());
            sampler.failed.clone_from(&self.failed);
            sampler.vocab = self.vocab;
            sampler.grammar_stack = self.grammar_stack;
            sampler.lazy_patterns = self.lazy_patterns;
            sampler.grammar_first = self.grammar_first;
            sampler.lazy_bytes = self.lazy_bytes;
            sampler
        });
        resume_pending_panic();
        copy.ok_or_else(|| Error::InvalidArgument("llama_sampler_clone failed".into()))
    }
}

impl Drop for Sampler<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the chain and every sampler in it.
        unsafe { sys::llama_sampler_free(self.chain.as_ptr()) };
        resume_pending_panic_in_drop();
    }
}
