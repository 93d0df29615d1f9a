//! The builder of sampler chains.

use std::ffi::{CString, c_char};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::thread::SendPtr;
use crate::llama::types::Token;
use crate::llama::vocab::Vocab;
use crate::sampling::constraint::{Constraint, Guide};
use crate::sys;

use super::custom::{CustomSampler, custom_sampler_new, resume_pending_panic_in_drop, sampler_name};
use super::{Kind, MAX_PENALTY_WINDOW, Sampler, init_grammar, stack_estimate};

/// Builds a [`Sampler`] chain, sampler by sampler, in order.
///
/// ```
/// # fn main() -> Result<(), llamacpp::Error> {
/// let sampler = llamacpp::SamplerChain::new().top_k(40).top_p(0.95, 1).temp(0.8).dist(42).build()?;
/// # Ok(()) }
/// ```
pub struct SamplerChain<'m> {
    chain: NonNull<sys::llama_sampler>,
    kinds: Vec<Kind>,
    vocab: Option<VocabId>,
    /// The stack that creating and advancing the chain's grammars needs
    /// (see `crate::llama::stack`).
    grammar_stack: usize,
    /// The chain has a lazy grammar with trigger patterns: every accepted
    /// token's text is matched against them while it waits.
    lazy_patterns: bool,
    /// Mask with the grammars before every pick (see `Sampler::select`).
    grammar_first: bool,
    /// The first error of a fallible step, reported by `build`.
    error: Option<Error>,
    /// The llguidance constraint of [`SamplerChain::constraint`].
    guide: Option<Guide>,
    _vocab: PhantomData<&'m Vocab>,
}

/// The vocabulary a chain's samplers were built with (grammar, DRY,
/// infill, logit bias, mirostat): they hold its token ids or read its
/// texts, so the chain may only sample from contexts of that model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct VocabId {
    pub(super) ptr: *const sys::llama_vocab,
    pub(super) n_tokens: i32,
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
// immutable, thread-safe vocab data. The llguidance guide is `Send` itself
// (asserted at compile time in `crate::constraint`).
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
        crate::llama::backend::init();
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
            error: None,
            guide: None,
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
        self.push_mut(raw, kind);
        self
    }

    fn push_mut(&mut self, raw: *mut sys::llama_sampler, kind: Kind) {
        if raw.is_null() {
            return;
        }
        // SAFETY: `chain` is a chain we own and `raw` a fresh sampler owned
        // by nobody; the chain takes ownership and frees it.
        unsafe { sys::llama_sampler_chain_add(self.chain.as_ptr(), raw) };
        self.kinds.push(kind);
    }

    /// Runs a step that can fail, unless an earlier one failed: the first
    /// error is kept for [`SamplerChain::build`], so the builder chains
    /// without a `?` after every step.
    fn step(mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Self {
        if self.error.is_none()
            && let Err(e) = f(&mut self)
        {
            self.error = Some(e);
        }
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
    /// Reported by [`SamplerChain::build`]: [`Error::InvalidParameter`] unless `m >= 2` and `tau`, `eta` are
    /// finite (otherwise llama.cpp's estimate is NaN from the start). Put
    /// no sampler that can leave a single candidate (e.g. `top_k(1)`) in
    /// front of it: its estimate is then 0/0 as well.
    #[doc(alias = "llama_sampler_init_mirostat")]
    #[must_use]
    pub fn mirostat(self, vocab: &Vocab, seed: u32, tau: f32, eta: f32, m: i32) -> Self {
        self.step(|chain| chain.try_mirostat(vocab, seed, tau, eta, m))
    }

    fn try_mirostat(&mut self, vocab: &Vocab, seed: u32, tau: f32, eta: f32, m: i32) -> Result<()> {
        self.bind_vocab(vocab)?;
        if m < 2 || !tau.is_finite() || !eta.is_finite() {
            return Err(Error::InvalidParameter {
                name: "mirostat",
                message: format!("needs m >= 2 and finite tau and eta (got m {m}, tau {tau}, eta {eta})"),
            });
        }
        // SAFETY: copies its arguments; the vocab size is only a number.
        let raw = unsafe { sys::llama_sampler_init_mirostat(vocab.n_tokens() as i32, seed, tau, eta, m) };
        self.push_mut(raw, Kind::Other { selects: true });
        Ok(())
    }

    /// Repetition penalties over the last `last_n` accepted tokens (at most
    /// 2^20; llama.cpp allocates the window up front); `-1` is all of them
    /// (the largest window, 2^20). A chain skips it when `last_n` is 0 or
    /// below -1, or all three penalties are neutral.
    #[doc(alias = "llama_sampler_init_penalties")]
    #[must_use]
    pub fn penalties(self, last_n: i32, repeat: f32, frequency: f32, presence: f32) -> Self {
        if last_n == 0 || last_n < -1 || (repeat == 1.0 && frequency == 0.0 && presence == 0.0) {
            return self;
        }
        let last_n = if last_n == -1 { MAX_PENALTY_WINDOW } else { last_n.min(MAX_PENALTY_WINDOW) };
        // SAFETY: copies its arguments (n_vocab is unused by this sampler);
        // the window is bounded, so its allocation cannot throw.
        let raw = unsafe { sys::llama_sampler_init_penalties(0, last_n, repeat, frequency, presence) };
        self.push(raw, Kind::Other { selects: false })
    }

    /// Adds `bias` to the logit of each listed token.
    ///
    /// # Errors
    /// Reported by [`SamplerChain::build`]: [`Error::InvalidToken`] for a token outside the vocabulary.
    #[doc(alias = "llama_sampler_init_logit_bias")]
    #[must_use]
    pub fn logit_bias(self, vocab: &Vocab, biases: &[(Token, f32)]) -> Self {
        self.step(|chain| chain.try_logit_bias(vocab, biases))
    }

    fn try_logit_bias(&mut self, vocab: &Vocab, biases: &[(Token, f32)]) -> Result<()> {
        self.bind_vocab(vocab)?;
        let raw_biases = biases
            .iter()
            .map(|&(t, bias)| vocab.check(t).map(|t| sys::llama_logit_bias { token: t.0, bias }))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: the biases are copied; every token is inside the vocab.
        let raw = unsafe {
            sys::llama_sampler_init_logit_bias(vocab.n_tokens() as i32, raw_biases.len() as i32, raw_biases.as_ptr())
        };
        self.push_mut(raw, Kind::Other { selects: false });
        Ok(())
    }

    /// DRY ("don't repeat yourself") penalty over the last `last_n` tokens
    /// (at most 2^20; 0 or negative disables it). The vocabulary is only
    /// read while building (to tokenize the sequence breakers).
    #[doc(alias = "llama_sampler_init_dry")]
    #[must_use]
    pub fn dry(
        self,
        vocab: &Vocab,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        last_n: i32,
        sequence_breakers: &[&str],
    ) -> Self {
        self.step(|chain| chain.try_dry(vocab, multiplier, base, allowed_length, last_n, sequence_breakers))
    }

    fn try_dry(
        &mut self,
        vocab: &Vocab,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        last_n: i32,
        sequence_breakers: &[&str],
    ) -> Result<()> {
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
        self.push_mut(raw, Kind::Other { selects: false });
        Ok(())
    }

    /// Fill-in-the-middle post-processing. Keeps a pointer to the vocab.
    ///
    /// # Errors
    /// Reported by [`SamplerChain::build`]: [`Error::InvalidArgument`] for a model without a vocabulary (the
    /// sampler renders tokens as text, where llama.cpp would abort).
    #[doc(alias = "llama_sampler_init_infill")]
    #[must_use]
    pub fn infill(self, vocab: &'m Vocab) -> Self {
        self.step(|chain| chain.try_infill(vocab))
    }

    fn try_infill(&mut self, vocab: &'m Vocab) -> Result<()> {
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        // SAFETY: the vocab outlives the chain ('m).
        let raw = unsafe { sys::llama_sampler_init_infill(vocab.as_ptr()) };
        self.push_mut(raw, Kind::Other { selects: false });
        Ok(())
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
    /// Reported by [`SamplerChain::build`]: [`Error::Grammar`] if the grammar does not parse, or repeats in a
    /// way llama.cpp cannot handle: `{m,n}` with `n < m` (its parser never
    /// returns), a repetition operator applied to another (`x++`: each
    /// multiplies the parse stacks kept on every token).
    #[doc(alias = "llama_sampler_init_grammar")]
    #[must_use]
    pub fn grammar(self, vocab: &'m Vocab, gbnf: &str, root: &str) -> Self {
        self.step(|chain| chain.try_grammar(vocab, gbnf, root))
    }

    fn try_grammar(&mut self, vocab: &'m Vocab, gbnf: &str, root: &str) -> Result<()> {
        self.check_no_constraint()?;
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        let (g, r) = (CString::new(gbnf)?, CString::new(root)?);
        let stack = stack_estimate::grammar_stack(gbnf).map_err(Error::Grammar)?;
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
        self.push_mut(raw, Kind::Grammar);
        Ok(())
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
    /// Reported by [`SamplerChain::build`]: [`Error::Grammar`] if the grammar or a pattern does not parse, the
    /// grammar repeats as [`SamplerChain::grammar`] refuses, or a pattern
    /// applies a quantifier to a quantifier (`a+*`: exponential
    /// backtracking in libstdc++'s matcher);
    /// [`Error::InvalidToken`] for a trigger token outside the vocabulary.
    #[doc(alias = "llama_sampler_init_grammar_lazy_patterns")]
    #[must_use]
    pub fn grammar_lazy(
        self,
        vocab: &'m Vocab,
        gbnf: &str,
        root: &str,
        trigger_patterns: &[&str],
        trigger_tokens: &[Token],
    ) -> Self {
        self.step(|chain| chain.try_grammar_lazy(vocab, gbnf, root, trigger_patterns, trigger_tokens))
    }

    fn try_grammar_lazy(
        &mut self,
        vocab: &'m Vocab,
        gbnf: &str,
        root: &str,
        trigger_patterns: &[&str],
        trigger_tokens: &[Token],
    ) -> Result<()> {
        self.check_no_constraint()?;
        vocab.check_has_tokenizer()?;
        self.bind_vocab(vocab)?;
        for &t in trigger_tokens {
            vocab.check(t)?;
        }
        let (g, r) = (CString::new(gbnf)?, CString::new(root)?);
        let patterns = trigger_patterns.iter().map(|s| CString::new(*s)).collect::<Result<Vec<_>, _>>()?;
        for pattern in trigger_patterns {
            stack_estimate::check_pattern(pattern).map_err(Error::Grammar)?;
        }
        let stack = stack_estimate::grammar_stack(gbnf)
            .map_err(Error::Grammar)?
            .max(stack_estimate::patterns_stack(trigger_patterns));
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
        self.push_mut(raw, Kind::Grammar);
        Ok(())
    }

    /// Constrains every pick to what `constraint` allows next (a JSON
    /// Schema, regex or Lark grammar, through llguidance): before the
    /// chain's first sampler runs, wherever in the chain this is called,
    /// every token the constraint forbids is removed, so the chain picks
    /// from the exactly constrained distribution. The model's token table
    /// is built on its first constraint and shared after.
    ///
    /// # Errors
    /// Reported by [`SamplerChain::build`]: [`Error::Grammar`] if the
    /// constraint does not compile (its message names the problem: an
    /// unsupported keyword, a regex that does not parse, ...), the chain
    /// already has a constraint or a GBNF grammar, or the model has no
    /// vocabulary.
    #[must_use]
    pub fn constraint(self, model: &'m Model, constraint: &Constraint) -> Self {
        self.step(|chain| {
            if chain.guide.is_some() || chain.kinds.contains(&Kind::Grammar) {
                return Err(Error::Grammar("a chain takes one constraint or grammar".into()));
            }
            chain.bind_vocab(model.vocab())?;
            chain.guide = Some(Guide::new(crate::sampling::constraint::TokenTable::of(model)?, constraint)?);
            Ok(())
        })
    }

    /// [`SamplerChain::constraint`] with the constraint compiled already
    /// (the engine compiles it at submit, on the caller's thread).
    pub(crate) fn compiled_constraint(self, model: &'m Model, guide: Guide) -> Self {
        self.step(|chain| {
            if chain.guide.is_some() || chain.kinds.contains(&Kind::Grammar) {
                return Err(Error::Grammar("a chain takes one constraint or grammar".into()));
            }
            chain.bind_vocab(model.vocab())?;
            chain.guide = Some(guide);
            Ok(())
        })
    }

    fn check_no_constraint(&self) -> Result<()> {
        match self.guide {
            Some(_) => Err(Error::Grammar("a chain takes one constraint or grammar".into())),
            None => Ok(()),
        }
    }

    /// Adds a sampler written in Rust.
    #[doc(alias = "llama_sampler_init")]
    #[must_use]
    pub fn custom(self, sampler: impl CustomSampler) -> Self {
        let selects = sampler.selects();
        let name = sampler_name(&sampler);
        // SAFETY: creates a sampler that the chain will own and free.
        let raw = unsafe { custom_sampler_new(Box::new(sampler), name) };
        self.push(raw, Kind::Other { selects })
    }

    /// Finishes the chain.
    ///
    /// # Errors
    /// The first error of a fallible step (grammar, logit bias, DRY,
    /// infill, mirostat: each documents its own), whose sampler was not
    /// added; otherwise [`Error::NoSelector`] unless the last sampler selects a token
    /// (greedy, dist, mirostat, mirostat v2, adaptive-p, or a custom sampler
    /// whose `selects()` is true).
    pub fn build(mut self) -> Result<Sampler<'m>> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if !self.kinds.last().is_some_and(|k| k.selects()) {
            return Err(Error::NoSelector);
        }
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: moving the fields out of a value that will not be dropped.
        let kinds = unsafe { std::ptr::read(&this.kinds) };
        // SAFETY: as above.
        let guide = unsafe { std::ptr::read(&this.guide) };
        let mut sampler = Sampler::from_parts(this.chain, kinds);
        sampler.guide = guide;
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
