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

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::llama::context::{Context, Output};
use crate::llama::ffi::check_shim;
use crate::llama::stack::{DeepStack, REGEX_STACK_PER_BYTE, with_stack};
use crate::llama::thread::SendPtr;
use crate::llama::types::Token;
use crate::llama::vocab::Vocab;
use crate::sampling::constraint::Guide;
use crate::sys;

mod from_logits;
mod scan;
mod stack_estimate;

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

mod budget;
mod chain;
mod custom;
mod params;

pub(crate) use budget::BudgetSampler;
pub use budget::ReasoningBudget;
pub use chain::SamplerChain;
use chain::VocabId;
pub use custom::{Candidates, CustomSampler, TokenData};
use custom::{PENDING_PANIC, resume_pending_panic, resume_pending_panic_in_drop};
pub use params::{MAX_TOP_LOGPROBS, SamplingParams};

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
    /// The stack the chain's grammars need (see `crate::llama::stack`).
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
    /// The llguidance constraint masking every pick (see
    /// [`SamplerChain::constraint`]).
    guide: Option<Guide>,
    /// Reused row of masked logits for a constrained pick.
    masked: Vec<f32>,
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
        crate::llama::backend::clear_last_error();
        let mut raw = std::ptr::null_mut();
        let code = init(&mut raw);
        check_shim(code, function).map_err(|e| Error::Grammar(e.to_string()))?;
        if raw.is_null() {
            return Err(Error::Grammar(crate::llama::backend::last_error_or("the grammar does not parse")));
        }
        Ok(SendPtr(raw))
    })??;
    Ok(raw.get())
}

/// Whether the grammar sampler `grammar` allows `token` next: its `apply`
/// on a one-candidate list (cheap, unlike masking the whole vocabulary).
/// Runs on the caller's stack, which must be the grammar's (see `deep`).
fn grammar_allows(grammar: SendPtr<*mut sys::llama_sampler>, token: Token) -> Result<bool> {
    let mut one = TokenData { id: token.0, logit: 0.0, p: 0.0 };
    let mut cur = sys::llama_token_data_array { data: &mut one, size: 1, selected: -1, sorted: false };
    // SAFETY: a live grammar sampler of a chain the caller owns, and a
    // one-element array on this stack; the shim catches exceptions.
    let code = unsafe { sys::shim::llama_rs_sampler_apply(grammar.get(), &mut cur) };
    check_shim(code, "llama_sampler_apply").map_err(|e| Error::Grammar(e.to_string()))?;
    Ok(one.logit != f32::NEG_INFINITY)
}

/// Runs `f` with `needed` bytes of stack on `helper` (see `crate::llama::stack`).
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

// SAFETY: see `SamplerChain`; the llguidance guide is `Send` itself
// (asserted at compile time in `crate::constraint`). Not Sync: sampling
// mutates RNG state and the chain's scratch buffer.
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
            guide: None,
            masked: Vec::new(),
            _vocab: PhantomData,
        }
    }

    /// The stack that calls into the chain need now.
    fn stack_needed(&self) -> usize {
        let lazy = if self.lazy_patterns { self.lazy_bytes.saturating_mul(REGEX_STACK_PER_BYTE) } else { 0 };
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

    /// Samples the next token from an output of the last decode
    /// ([`Output::Last`], or the batch index [`Output::Index`], which a
    /// `usize` converts into), and accepts it into the chain's state.
    ///
    /// # Errors
    /// [`Error::NoOutput`] if `at` has no logits; [`Error::Grammar`] if a
    /// grammar allows no candidate, or the chain failed to accept a token
    /// earlier and was not [reset](Sampler::reset) since;
    /// [`Error::Exception`] if a sampler threw.
    #[doc(alias = "llama_sampler_sample")]
    pub fn sample(&mut self, ctx: &mut Context<'_>, at: impl Into<Output>) -> Result<Token> {
        self.sample_with_path(ctx, at).map(|(t, _)| t)
    }

    /// [`Sampler::sample`], also telling which implementation ran: for
    /// tests and benchmarks of the shortcuts.
    ///
    /// # Errors
    /// As [`Sampler::sample`].
    #[doc(hidden)]
    pub fn sample_with_path(&mut self, ctx: &mut Context<'_>, at: impl Into<Output>) -> Result<(Token, SamplePath)> {
        self.check_not_failed()?;
        if let Some(vocab) = self.vocab
            && vocab.ptr != ctx.model().vocab().as_ptr()
        {
            return Err(Error::WrongModel("the sampler (built with another model's vocabulary)"));
        }
        let logits = ctx.logits(at)?;
        self.select_and_accept(logits)
    }

    /// [`Sampler::sample`] from a row of logits the caller holds (one per
    /// token of `vocab`), e.g. copied out of a context so that sampling can
    /// run on another thread while the context decodes again: the engine
    /// samples requests with a grammar that way.
    ///
    /// # Errors
    /// [`Error::WrongModel`] if the chain was built with another vocabulary
    /// or `logits` is not one per token of `vocab`; otherwise as
    /// [`Sampler::sample`].
    pub fn sample_logits(&mut self, vocab: &Vocab, logits: &[f32]) -> Result<Token> {
        self.check_not_failed()?;
        if self.vocab.is_some_and(|v| v.ptr != vocab.as_ptr()) || logits.len() != vocab.n_tokens() {
            return Err(Error::WrongModel("the sampler or the logits (another model's vocabulary)"));
        }
        self.select_and_accept(logits).map(|(t, _)| t)
    }

    /// The number of tokens the chain's llguidance constraint allows next
    /// (computing its mask, which the next sample then reuses); `None`
    /// without a constraint. For benchmarks of the mask alone.
    ///
    /// # Errors
    /// [`Error::Grammar`] as a sample would report it.
    #[doc(hidden)]
    pub fn constraint_mask_len(&mut self) -> Result<Option<usize>> {
        match &mut self.guide {
            Some(guide) => Ok(Some(guide.mask()?.num_set())),
            None => Ok(None),
        }
    }

    /// A constraint that writes JSON ([`Constraint::writes_json`](crate::constraint::Constraint::writes_json))
    /// should end its text within `budget` more tokens (`None`: no budget). In the last quarter of the budget
    /// (at least the last [`MIN_CLOSING_TOKENS`](crate::constraint::MIN_CLOSING_TOKENS)),
    /// the constraint steers toward closing: it allows only the tokens
    /// that end the open string, close an object or array, or end the
    /// document, where it allows any of them (the rule in full:
    /// docs/json-output.md). Generation (`Session`,
    /// the engine) sets this from `max_tokens`; a chain without such a
    /// constraint ignores it.
    pub fn close_within(&mut self, budget: Option<usize>) {
        if let Some(guide) = &mut self.guide {
            guide.close_within(budget);
        }
    }

    /// Whether the chain holds a grammar (whose masks can cost far more
    /// than the rest of a sample).
    pub fn has_grammar(&self) -> bool {
        self.kinds.contains(&Kind::Grammar) || self.guide.is_some()
    }

    fn select_and_accept(&mut self, logits: &[f32]) -> Result<(Token, SamplePath)> {
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
        if let Some(guide) = &mut self.guide
            && !guide.allows(token)?
        {
            return Err(Error::Grammar(format!("token {token} is not allowed by the constraint here")));
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
        result?;
        if let Some(guide) = &mut self.guide
            && let Err(e) = guide.consume(token)
        {
            self.failed = Some(e.to_string());
            return Err(e);
        }
        Ok(())
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
        let guide_reset = self.guide.as_mut().map_or(Ok(()), Guide::reset);
        self.failed = match (done, guide_reset) {
            (Ok(()), Ok(())) => None,
            (Err(e), _) | (_, Err(e)) => Some(format!("reset failed: {e}")),
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
            sampler.guide = self.guide.as_ref().map(Guide::deep_clone);
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
