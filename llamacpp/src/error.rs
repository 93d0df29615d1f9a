//! The crate's one error type and the helpers that turn C results into it.

use std::path::PathBuf;

use crate::llama::types::{FinishReason, Output, SeqId};

/// Everything that can go wrong in this crate.
///
/// Misuse that llama.cpp would answer with an abort (`GGML_ASSERT`) or a C++
/// exception is caught in Rust first and reported here instead.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model file could not be loaded.
    #[error("cannot load model {path}: {reason}")]
    ModelLoad {
        /// The file that failed.
        path: PathBuf,
        /// Why, as far as llama.cpp said.
        reason: String,
    },
    /// A multimodal projector (`mmproj` GGUF, feature `mtmd`) could not be
    /// loaded: not a projector, an unknown projector type, missing
    /// tensors, an output width other than its text model's, a device that
    /// cannot hold it.
    #[error("cannot load projector {path}: {reason}")]
    ProjectorLoad {
        /// The file that failed.
        path: PathBuf,
        /// Why, as far as libmtmd said.
        reason: String,
    },
    /// An image or audio input that cannot be used (feature `mtmd`): empty,
    /// too large, not decodable (truncated, corrupt, another format), of a
    /// kind the projector does not take, or a prompt whose media markers
    /// and media do not match; the text says which.
    #[error("media input: {0}")]
    Media(String),
    /// The progress callback asked to stop loading.
    #[error("model loading was cancelled by the progress callback")]
    LoadCancelled,
    /// `llama_init_from_model` refused the parameters.
    #[error("cannot create a context: {0}")]
    ContextCreate(String),
    /// An argument is outside what llama.cpp accepts, in a way no more
    /// specific variant names (a combination of settings, a model that
    /// cannot do what was asked); the text says what.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A setting outside its range: `name` is the parameter as this crate
    /// spells it (`n_seq_max`, `n_threads`, `temperature`, `top_p`,
    /// `max_tokens`, `max_running`, …), `message` what it must be and was.
    #[error("invalid {name}: {message}")]
    InvalidParameter {
        /// The parameter.
        name: &'static str,
        /// What it must be, and what it was.
        message: String,
    },
    /// A generation or request with a prompt of no tokens.
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    /// A prompt with more tokens than one sequence can hold (the context's
    /// [`n_ctx_seq`](crate::Context::n_ctx_seq), or an engine request's
    /// `max_context`).
    #[error("the prompt has {tokens} tokens but a sequence holds at most {limit}")]
    PromptTooLong {
        /// The prompt's tokens.
        tokens: usize,
        /// The most a sequence holds.
        limit: usize,
    },
    /// An index outside its collection (a batch token, a candidate).
    #[error("{what} index {index} is out of 0..{len}")]
    OutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index.
        index: usize,
        /// The collection's length.
        len: usize,
    },
    /// A token id outside `0..n_vocab`.
    #[error("token id {token} is outside the vocabulary (0..{n_vocab})")]
    InvalidToken {
        /// The offending id.
        token: i32,
        /// The vocabulary size.
        n_vocab: i32,
    },
    /// A sequence id outside `0..n_seq_max`.
    #[error("sequence id {seq} is outside 0..{n_seq_max}")]
    InvalidSeqId {
        /// The offending id.
        seq: i32,
        /// The context's number of sequences.
        n_seq_max: u32,
    },
    /// A batch has no room for another token.
    #[error("the batch is full ({capacity} tokens)")]
    BatchFull {
        /// The batch's capacity.
        capacity: usize,
    },
    /// A batch this crate refused before llama.cpp saw it (empty, larger
    /// than `n_batch`, a position that does not continue its sequence, …):
    /// see [`Context::decode`](crate::Context::decode).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// `llama_decode` returned 1: no KV cache slot for the batch. The cache
    /// is unchanged; free space (`seq_rm`) or decode a smaller batch.
    #[error("no KV cache slot for the batch (llama_decode returned 1)")]
    NoKvSlot,
    /// `llama_decode` returned 2: the abort callback stopped it. Micro-batches
    /// that were already processed stay in the cache.
    #[error("decoding was aborted by the abort callback")]
    Aborted,
    /// `llama_decode` returned -1: llama.cpp rejected a batch that passed
    /// this crate's checks.
    #[error("llama.cpp rejected the batch (llama_decode returned -1)")]
    BatchRejected,
    /// `llama_decode` returned -2: memory or output buffer allocation failed.
    #[error("allocation failed while decoding (llama_decode returned -2)")]
    AllocationFailed,
    /// `llama_decode` returned -3 (compute failure) or another negative code.
    #[error("decoding failed (llama_decode returned {0})")]
    ComputeFailed(i32),
    /// The last decode computed no such output: the batch token did not
    /// ask for logits ([`Logits::Yes`](crate::Logits::Yes)), the index is
    /// outside the batch, the pass produced none of that kind, or the
    /// outputs were forgotten since (a failed pass, a cache clear).
    #[error("{0} of the last decode has no output: ask for logits when adding the token")]
    NoOutput(Output),
    /// The last decode computed no pooled embedding of this sequence
    /// (embeddings off, the sequence not in the batch, or the cache
    /// cleared or loaded since).
    #[error("sequence {0} has no pooled embedding from the last decode")]
    NoSequenceOutput(SeqId),
    /// The KV cache of this context cannot shift positions (`llama_memory_can_shift`).
    #[error("the KV cache of this context cannot shift positions")]
    CannotShift,
    /// Speculative decoding ([`Speculation`](crate::speculative::Speculation))
    /// needs a cache that can drop a sequence's last positions; this
    /// context's cannot (the text says why).
    #[error("speculative decoding is not possible here: {0}")]
    CannotSpeculate(&'static str),
    /// Generation needs another position but the sequence already fills
    /// the context (see [`Overflow`](crate::generate::Overflow)).
    #[error("the context is full ({n_ctx} tokens per sequence)")]
    ContextFull {
        /// The context length of a sequence.
        n_ctx: u32,
    },
    /// `llama_model_quantize` failed (an unsupported or already quantized
    /// input without `allow_requantize`, a tensor it cannot convert, …).
    #[error("cannot quantize {path}: {reason}")]
    Quantize {
        /// The input model.
        path: PathBuf,
        /// Why, as far as llama.cpp said.
        reason: String,
    },
    /// A C++ exception was thrown inside llama.cpp and caught by the shim.
    #[error("llama.cpp threw an exception in {function}: {message}")]
    Exception {
        /// The C function that threw.
        function: &'static str,
        /// The exception's message.
        message: String,
    },
    /// A GBNF grammar failed to parse, or a token it forbids was accepted.
    #[error("grammar error: {0}")]
    Grammar(String),
    /// A sampler of the chain removed every candidate token.
    #[error("a sampler removed every candidate token")]
    NoCandidates,
    /// A sampler chain that does not end in a token-selecting sampler.
    #[error("a sampler chain must end with a token-selecting sampler (greedy, dist, mirostat, adaptive-p)")]
    NoSelector,
    /// Saving or restoring state failed; `kind` says how.
    #[error("state error: {message}")]
    State {
        /// What went wrong.
        kind: StateError,
        /// The details.
        message: String,
    },
    /// A chat template is unknown, does not parse, or failed to render.
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    /// The chat template itself refused the conversation: it called
    /// `raise_exception` (a system message where the model has no system
    /// role, roles that do not alternate, …). The message is the template's.
    #[error("the chat template refused the conversation: {0}")]
    ChatTemplateRaised(String),
    /// A JSON answer (`Conversation::reply_json`, feature `schemars`)
    /// ended before its document did: the token limit or the context cut
    /// it short.
    #[error("the JSON answer was cut short after {tokens} tokens ({reason}): raise max_tokens or the context size")]
    JsonCutShort {
        /// Tokens generated.
        tokens: usize,
        /// Why generation ended.
        reason: FinishReason,
    },
    /// A complete JSON answer that does not deserialize into the type
    /// asked for (serde's message).
    #[error("the JSON answer does not fit the type: {0}")]
    JsonAnswer(String),
    /// Chat text that cannot be kept apart from the template's markup
    /// ([`ChatFormat::tokenize`](crate::ChatFormat::tokenize)): an object
    /// key, a `role` or a `type` that holds or touches a control token's
    /// text, or a template that cuts apart a text holding some.
    #[error("chat text cannot be kept plain: {0}")]
    ChatMarkup(String),
    /// A JSON schema uses something the grammar converter cannot express
    /// exactly (rather than a grammar that would accept invalid output).
    #[error("JSON schema at {pointer}: {message}")]
    JsonSchema {
        /// The JSON pointer of the offending part of the schema (`""` is the root).
        pointer: String,
        /// What is wrong or unsupported, naming the keyword.
        message: String,
    },
    /// A LoRA adapter or control vector was rejected.
    #[error("adapter error: {0}")]
    Adapter(String),
    /// An input so large that llama.cpp's processing of it would exhaust
    /// memory or the stack (see [`Vocab::tokenize`](crate::Vocab::tokenize)
    /// and grammars).
    #[error("{what} is too large (limit {limit})")]
    InputTooLarge {
        /// What was too large.
        what: &'static str,
        /// The limit, in the unit of `what` (bytes, tokens, levels).
        limit: usize,
    },
    /// An object made for one model was used with another (a sampler
    /// holding vocabulary ids, a generation session, saved state).
    #[error("{0} belongs to another model or context")]
    WrongModel(&'static str),
    /// A decode or encode threw inside llama.cpp, which can leave the
    /// context's compute scheduler half-reserved: the context refuses to
    /// run again. Drop it and create a new one.
    #[error("the context is unusable after llama.cpp threw in {function}: {message}")]
    Poisoned {
        /// The C function that threw.
        function: &'static str,
        /// The exception's message.
        message: String,
    },
    /// A memory allocation in Rust (sized from the input) failed.
    #[error("cannot allocate {bytes} bytes")]
    OutOfMemory {
        /// The size requested.
        bytes: usize,
    },
    /// The engine's waiting queue is full: try again later (an HTTP
    /// server answers 429).
    #[error("the engine's queue is full ({capacity} requests waiting)")]
    QueueFull {
        /// The most requests that may wait.
        capacity: usize,
    },
    /// The engine has stopped (shut down, or its worker failed) and takes
    /// no more requests.
    #[error("the engine has stopped: {0}")]
    EngineStopped(String),
    /// No configuration of a [`Planner::fit`](crate::plan::Planner::fit)
    /// stays within the budget of `device` (a device name, `Host`, or
    /// `total`): `detail` names the part that does not fit (the weights
    /// alone, or weights + KV + compute at the smallest configuration).
    #[error("does not fit on {device}: {detail}")]
    DoesNotFit {
        /// The device (or `total`) whose budget is exceeded.
        device: String,
        /// Bytes the smallest configuration needs there.
        needed: u64,
        /// The budget there.
        budget: u64,
        /// What does not fit, in words.
        detail: String,
    },
    /// What was asked is outside what this crate models (the memory
    /// formulas of [`plan::analytic`](crate::plan::analytic) for some
    /// architectures); the text says what.
    #[error("not supported: {0}")]
    Unsupported(String),

    /// An RPC server (`llamacpp::rpc`, feature `rpc`) cannot be used: the endpoint is
    /// not `host:port`, it does not resolve, refuses the connection, stays
    /// silent past the timeout, is not an RPC server or speaks another
    /// protocol version; or a worker cannot serve there; or a worker was
    /// lost during a call (then every later call on the models and
    /// contexts that use it returns this too).
    #[error("RPC server {endpoint}: {message}")]
    Rpc {
        /// The endpoint, as given.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// A string argument contains a NUL byte.
    #[error("string contains a NUL byte: {0}")]
    Nul(#[from] std::ffi::NulError),
    /// An I/O error, with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// How saving or restoring state failed ([`Error::State`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateError {
    /// The data or file is not a state of this model and context
    /// configuration (another model, other sizes or settings), it is
    /// corrupt, or the path is not a file. Data that reached llama.cpp may
    /// have left the cache cleared (llama.cpp clears it on a failed read).
    Mismatch,
    /// A state file holds more tokens than the context has room for.
    TooLarge,
    /// What llama.cpp cannot do for this model or configuration (restoring
    /// one sequence of a hybrid model with several sequences; dropping the
    /// last token of a recurrent cache).
    Unsupported,
    /// llama.cpp failed to write or read the state.
    Failed,
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn state(kind: StateError, message: impl Into<String>) -> Error {
        Error::State { kind, message: message.into() }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }
}

/// Grows `v` to hold `additional` more elements, or returns
/// [`Error::OutOfMemory`] instead of aborting the process when the size
/// (which comes from the caller's input) cannot be allocated.
pub(crate) fn try_reserve<T>(v: &mut Vec<T>, additional: usize) -> Result<()> {
    v.try_reserve(additional)
        .map_err(|_| Error::OutOfMemory { bytes: additional.saturating_mul(std::mem::size_of::<T>()) })
}
