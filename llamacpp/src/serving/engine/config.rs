//! The engine's settings: pool, step budget, limits.

use crate::error::{Error, Result};
use crate::llama::context::{ContextParams, FlashAttention, KvType};
use crate::sampling::speculative::Speculation;

/// How the engine is set up; a builder.
///
/// Defaults: a pool of 4096 KV cells, a step budget of 512 tokens
/// (`n_batch` = `n_ubatch` = 512) of which at most 128 prefill prompts
/// while streams are generating, up to 16 generating sequences and 16
/// cached prefixes holding at most half the pool, 256 waiting requests, 16
/// cells reserved per admitted request, F16 KV cache, the machine's thread
/// count, 5 ms of waiting per step for grammar samples (`grammar_wait`),
/// no speculative decoding (drafts cut to what pays when it is on).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The context's settings; the engine sets its sequences, the unified
    /// KV cache and the full-size sliding-window cache itself
    /// ([`EngineConfig::context_params`]).
    pub(crate) context: ContextParams,
    pub(crate) prefill_cap: Option<u32>,
    pub(crate) max_running: u32,
    pub(crate) max_cached_prefixes: u32,
    pub(crate) prefix_cache_share: f32,
    pub(crate) max_queue: usize,
    pub(crate) admission_reserve: usize,
    pub(crate) prefix_block: usize,
    pub(crate) memory_budget: Option<crate::llama::plan::MemoryBudget>,
    pub(crate) grammar_wait: std::time::Duration,
    pub(crate) speculation: Option<Speculation>,
    pub(crate) draft_by_cost: bool,
    /// The projector, for requests with images or audio (feature `mtmd`).
    pub(crate) media: super::media::MediaConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            context: ContextParams::default().n_ctx(4096).n_batch(512).n_ubatch(512),
            prefill_cap: None,
            max_running: 16,
            max_cached_prefixes: 16,
            prefix_cache_share: 0.5,
            max_queue: 256,
            admission_reserve: 16,
            prefix_block: 16,
            memory_budget: None,
            grammar_wait: std::time::Duration::from_millis(5),
            speculation: None,
            draft_by_cost: true,
            media: super::media::MediaConfig::default(),
        }
    }
}

impl EngineConfig {
    /// The context an engine with this configuration creates: `n_ctx`
    /// cells shared by `max_running + max_cached_prefixes` sequences
    /// (`kv_unified`), full-size sliding-window cache. Pass it to
    /// [`ModelParams::fit_context`](crate::ModelParams::fit_context), so
    /// that the layers offloaded by default leave room for it (a memory
    /// budget may give the engine fewer cells than `n_ctx`, never more).
    pub fn context_params(&self) -> ContextParams {
        let n_seq = self.max_running + self.max_cached_prefixes;
        let c = &self.context;
        c.clone().n_ubatch(c.n_ubatch.min(c.n_batch)).n_seq_max(n_seq).kv_unified(true).swa_full(true)
    }

    /// The context's settings at once (rope, offload, the KV types apart,
    /// …): the ones below are shorthands for the commonest. The engine sets
    /// the sequences, the unified KV cache and the full-size sliding-window
    /// cache itself.
    #[must_use]
    pub fn context(mut self, params: ContextParams) -> Self {
        self.context = params;
        self
    }

    /// KV cells shared by all sequences (the context's `n_ctx`;
    /// llama.cpp pads it up to a multiple of 256).
    #[must_use]
    pub fn n_ctx(mut self, n: u32) -> Self {
        self.context.n_ctx = n;
        self
    }

    /// Most tokens per step: the one `llama_decode` of every step (the
    /// context's `n_batch`).
    #[must_use]
    pub fn n_batch(mut self, n: u32) -> Self {
        self.context.n_batch = n;
        self
    }

    /// Most tokens per compute pass (the context's `n_ubatch`).
    #[must_use]
    pub fn n_ubatch(mut self, n: u32) -> Self {
        self.context.n_ubatch = n;
        self
    }

    /// Threads for decoding and prefill (default: the machine's).
    #[must_use]
    pub fn n_threads(mut self, n: i32) -> Self {
        self.context = self.context.n_threads(n).n_threads_batch(n);
        self
    }

    /// Element type of the KV cache (K and V).
    #[must_use]
    pub fn kv_type(mut self, kind: KvType) -> Self {
        self.context = self.context.kv_type(kind);
        self
    }

    /// Flash attention (a quantized V cache needs it).
    #[must_use]
    pub fn flash_attention(mut self, flash: FlashAttention) -> Self {
        self.context.flash_attention = flash;
        self
    }

    setters! {
        /// Most tokens of one prompt per step while any sequence is
        /// generating, or a prompt of at most this many tokens prefills
        /// beside a longer one (default: a quarter of `n_batch`; `n_batch`
        /// turns the cap off). Several prompts waiting together still fill
        /// the step.
        /// It bounds how long running streams wait for a step during a long
        /// prefill, and how long a short prompt arriving meanwhile waits
        /// for its first token, at some cost in the long prefill's time
        /// (measured in `docs/performance.md`: with 128 of 512, a
        /// 4,000-token prompt beside one stream took 1.25× llama-server's
        /// time, with 256 1.12×, while short requests got their first token
        /// in 0.15× and 0.28× of llama-server's time).
        prefill_cap: u32 => prefill_cap (Some);
        /// Most sequences admitted at once (generating or prefilling).
        max_running: u32 => max_running;
        /// Most finished sequences kept as cached prefixes (0: no prefix
        /// cache; prompts still share the cells of running sequences).
        max_cached_prefixes: u32 => max_cached_prefixes;
        /// Largest share of the pool's cells cached prefixes may hold.
        prefix_cache_share: f32 => prefix_cache_share;
        /// Most submitted requests waiting for their first admission; more
        /// are refused with [`Error::QueueFull`]. (Preempted requests wait
        /// too, beyond this bound: they were admitted before.)
        max_queue: usize => max_queue;
        /// Free cells a request needs beyond its uncached prompt to be
        /// admitted, so that it can generate a little before the pool
        /// must make room.
        admission_reserve: usize => admission_reserve;
        /// Bytes of memory the engine may take over every device together
        /// (weights, KV pool and compute buffers, as llama.cpp allocates
        /// them): the pool then gets the most cells that fit, found by
        /// [`Planner::fit`](crate::plan::Planner::fit) on the model's file
        /// at [`Engine::start`](super::Engine::start), instead of `n_ctx`.
        /// With layers on GPUs, [`EngineConfig::device_budget`] limits
        /// each device instead.
        memory_budget: u64 => memory_budget (|bytes| Some(crate::llama::plan::MemoryBudget::total(bytes)));
        /// [`EngineConfig::memory_budget`] per device: a limit on each
        /// device the budget names (a GPU's memory, [`HOST`](crate::plan::HOST)
        /// for RAM) and, optionally, in total.
        device_budget: crate::llama::plan::MemoryBudget => memory_budget (Some);
        /// Requests with a grammar are sampled off the step, on a helper
        /// thread, from a copy of their logits (a grammar's mask can cost
        /// far more than a decode); a step waits at most this long after
        /// sending such a sample out, and only for a request whose previous
        /// sample came back within it. This bounds what one request's
        /// grammar adds to every other request's step (default 5 ms); a
        /// grammar that takes longer costs only its own request steps.
        grammar_wait: std::time::Duration => grammar_wait;
        /// Speculative decoding for every request that does not say
        /// otherwise ([`Request::speculation`](super::Request::speculation)):
        /// drafts from each sequence's own text, verified in the step (see
        /// [`crate::speculative`]). Draft tokens take what the step's budget
        /// leaves after every stream's token and the prefill chunks (at
        /// most `prefill_cap` of them while a prompt prefills), and only
        /// cells the pool has free: they never delay another stream's
        /// token or push anything out. Requests sampled off the step (with
        /// a grammar or constraint) do not draft. Default: off.
        speculation: Speculation => speculation (Some);
        /// Whether a draft is cut to the length that pays for itself
        /// (default true): the engine fits each step's time as a fixed
        /// part plus a part per row and drafts a token only while its
        /// chance of being accepted, times what a token costs without
        /// drafts, beats the row it adds (see `docs/speculative.md`).
        /// Where rows cost as much as tokens (many streams on a few CPU
        /// cores) drafting then stops. False drafts as long as the step's
        /// budget and the drafter allow.
        draft_by_cost: bool => draft_by_cost;
    }

    pub(crate) fn check(&self) -> Result<()> {
        let bad = |name: &'static str, message: String| Err(Error::InvalidParameter { name, message });
        if self.max_running == 0 {
            return bad("max_running", "must be at least 1".into());
        }
        let n_seq = self.max_running as u64 + self.max_cached_prefixes as u64;
        let most = crate::llama::context::max_sequences() as u64;
        if n_seq > most {
            return bad(
                "max_cached_prefixes",
                format!("max_running + max_cached_prefixes = {n_seq} exceeds the {most} sequences a context can have"),
            );
        }
        if self.max_running > self.context.n_batch {
            return bad(
                "max_running",
                format!(
                    "{} exceeds n_batch {}: every generating sequence needs a token of each step",
                    self.max_running, self.context.n_batch
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.prefix_cache_share) {
            return bad("prefix_cache_share", format!("must be in [0, 1], got {}", self.prefix_cache_share));
        }
        if let Some(spec) = &self.speculation {
            spec.validate()?;
        }
        if self.prefill_cap == Some(0) {
            return bad("prefill_cap", "must be at least 1".into());
        }
        if n_seq > u64::from(self.context.n_batch) {
            return bad(
                "n_batch",
                format!(
                    "max_running + max_cached_prefixes = {n_seq} sequences exceed n_batch {} (llama.cpp needs n_batch >= its sequences)",
                    self.context.n_batch
                ),
            );
        }
        if self.admission_reserve > self.context.n_ctx as usize {
            return bad(
                "admission_reserve",
                format!("{} exceeds the pool of {} cells", self.admission_reserve, self.context.n_ctx),
            );
        }
        Ok(())
    }
}
