//! Running the model: decode, encode and the chunked `eval`, with the
//! checks around each pass (poisoned contexts, lost RPC workers).

use super::Context;
use crate::error::{Error, Result};
use crate::llama::batch::{Batch, Logits};
use crate::llama::ffi::{check_decode, check_shim};
use crate::llama::types::{Pos, SeqId, Token};
use crate::sys;

impl Context<'_> {
    /// Runs llama_decode (or, `encode`, llama_encode) on `batch` through
    /// the shim: here, or on the RPC call thread when the model has layers
    /// on workers (then a worker lost during the call is [`Error::Rpc`] and
    /// the context is unusable).
    ///
    /// # Safety
    /// `batch` must be valid for this context (see `decode`).
    unsafe fn call_pass(&mut self, batch: &Batch, code: &mut i32, encode: bool) -> Result<std::os::raw::c_int> {
        if self.calls.is_remote() {
            let call = crate::llama::thread::SendPtr((self.ptr.as_ptr(), batch.raw()));
            let what = if encode { "encoding" } else { "decoding" };
            let (shim, result) = self.calls.run(self.model.remote(), what, true, move || {
                let call = call;
                let mut code = 0;
                // SAFETY: as for the direct call below; the batch's arrays
                // outlive the call (the caller waits for it, and once it is
                // abandoned it never reads them again: it is blocked in
                // llama.cpp for good).
                let shim = unsafe {
                    if encode {
                        sys::shim::llama_rs_rpc_encode(call.0.0, call.0.1, &mut code)
                    } else {
                        sys::shim::llama_rs_rpc_decode(call.0.0, call.0.1, &mut code)
                    }
                };
                (shim, code)
            })?;
            *code = result;
            return Ok(shim);
        }
        // SAFETY: the caller's contract (see `decode`, `encode`).
        Ok(unsafe {
            if encode {
                sys::shim::llama_rs_encode(self.ptr.as_ptr(), batch.raw(), code)
            } else {
                sys::shim::llama_rs_decode(self.ptr.as_ptr(), batch.raw(), code)
            }
        })
    }

    /// A pass that did not run (its RPC worker was lost) leaves no outputs:
    /// the last pass's rows must not be read through a dead connection.
    fn forget_outputs_on_err<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.invalidate_outputs();
        }
        result
    }

    /// Whether [`Context::check_reachable`] fails: every call into llama.cpp that
    /// can reach a worker is refused then (synchronizing would wait for a
    /// dead connection for good, and an abandoned call may still hold the
    /// context).
    pub(super) fn is_cut_off(&self) -> bool {
        self.check_reachable().is_err()
    }

    /// `Err` when a call into llama.cpp could not reach what it needs: the
    /// model lost an RPC worker (the call would wait on the dead
    /// connection), or a call of this context was abandoned.
    pub(crate) fn check_reachable(&self) -> Result<()> {
        self.calls.check(self.model.remote())
    }

    /// Refuses to run a context whose last decode or encode threw.
    pub(super) fn check_not_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            None => Ok(()),
            Some((function, message)) => Err(Error::Poisoned { function, message: message.clone() }),
        }
    }

    /// Poisons the context if `result` is a caught C++ exception.
    pub(super) fn poison_on_exception(&mut self, result: &Result<()>) {
        if let Err(Error::Exception { function, message }) = result {
            self.poisoned = Some((function, message.clone()));
        }
    }

    /// Runs the model on a batch, adding its tokens to the KV cache and
    /// computing the outputs it asks for.
    ///
    /// # Errors
    /// Before llama.cpp runs: [`Error::InvalidBatch`] (empty, larger than
    /// `n_batch`, non-causal and larger than `n_ubatch`, a position outside
    /// `0..i32::MAX` or one that does not continue its sequence, several
    /// sequences per token without
    /// `kv_unified`, pooled embeddings of a sequence that llama.cpp would
    /// split over micro-batches), [`Error::InvalidToken`],
    /// [`Error::InvalidSeqId`].
    /// From llama.cpp's return code: [`Error::NoKvSlot`] (1),
    /// [`Error::Aborted`] (2), [`Error::BatchRejected`] (-1),
    /// [`Error::AllocationFailed`] (-2), [`Error::ComputeFailed`] (-3);
    /// [`Error::Exception`] if it threw.
    /// [`Error::InvalidArgument`] for an encoder-decoder model (T5) before
    /// the first successful [`Context::encode`]: its decoder attends to the
    /// encoder output, and llama.cpp aborts without one.
    ///
    /// A context without a KV cache (BERT-like models) runs the batch
    /// through the encoder instead: every token is then an output, and
    /// only diffusion models compute logits.
    #[doc(alias = "llama_decode")]
    pub fn decode(&mut self, batch: &Batch) -> Result<()> {
        self.check_not_poisoned()?;
        self.check_reachable()?;
        if self.needs_encoder_output && !self.encoded {
            return Err(Error::InvalidArgument(
                "this encoder-decoder model decodes against the encoder output: call encode first".into(),
            ));
        }
        self.validate(batch)?;
        let mut code = 0;
        let (this, model) = self.model_for();
        let adapters = model.adapters_read();
        // SAFETY: the batch was validated against this context above (sizes,
        // token and sequence ids, positions), its arrays hold `len` entries,
        // an encoder-decoder model has an encoder output to attend to, and
        // the shim catches exceptions. A graph re-reserve reads the model's
        // LoRA set, which the read lock keeps from changing meanwhile.
        let shim = unsafe { this.call_pass(batch, &mut code, false) };
        drop(adapters);
        let shim = self.forget_outputs_on_err(shim)?;
        let result = check_shim(shim, "llama_decode").and_then(|()| check_decode(code));
        self.poison_on_exception(&result);
        if self.has_memory {
            self.record_outputs(batch, result.is_ok());
        } else {
            self.record_encoder_outputs(batch, result.is_ok());
        }
        result
    }

    /// Appends `tokens` to sequence `seq` at its next position (after its
    /// last cached token, or at 0), decoding them in batches of at most
    /// [`n_batch`](Context::n_batch) tokens with logits for the last token
    /// only: read them with [`Context::logits`]`(Output::Last)`, or sample
    /// with `Sampler::sample(&mut ctx, Output::Last)`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// use llamacpp::{AddBos, ContextParams, Model, ModelParams, Output, Sampler};
    /// let model = Model::load("model.gguf", &ModelParams::default())?;
    /// let mut ctx = model.new_context(&ContextParams::default())?;
    /// ctx.eval(&model.vocab().tokenize("The capital of France is", AddBos::Yes)?, 0)?;
    /// let next = Sampler::greedy().sample(&mut ctx, Output::Last)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBatch`] for no tokens; [`Error::InvalidSeqId`];
    /// [`Error::ContextFull`] when the sequence has no room for all of
    /// them ([`Context::n_ctx_seq`]; checked before anything is decoded);
    /// otherwise as [`Context::decode`]. When a batch fails, the batches
    /// before it stay in the cache ([`Context::seq_pos_max`] says where it
    /// ends): the check compares positions, so a cache whose cells hold
    /// other sequences too (`kv_unified`) can still run out of cells
    /// ([`Error::NoKvSlot`]) after some batches. With pooled embeddings on,
    /// each batch is pooled by itself: evaluate a text for its pooled
    /// embedding in one batch (`llamacpp::embed` does).
    pub fn eval(&mut self, tokens: &[Token], seq: SeqId) -> Result<()> {
        self.check_seq(seq)?;
        if tokens.is_empty() {
            return Err(Error::InvalidBatch("there are no tokens to evaluate".into()));
        }
        let start = self.seq_pos_max(seq)?.map_or(0, |p| p as usize + 1);
        self.eval_from(tokens, seq, start)
    }

    /// [`Context::eval`] from position `start` (after an M-RoPE image,
    /// the next text position is not the cache's last position + 1).
    pub(crate) fn eval_from(&mut self, tokens: &[Token], seq: SeqId, start: usize) -> Result<()> {
        self.check_seq(seq)?;
        if tokens.is_empty() {
            return Err(Error::InvalidBatch("there are no tokens to evaluate".into()));
        }
        let n_ctx = self.n_ctx_seq();
        if start.saturating_add(tokens.len()) > n_ctx as usize {
            return Err(Error::ContextFull { n_ctx });
        }
        let n_batch = self.n_batch as usize;
        let mut batch = Batch::new(n_batch.min(tokens.len()), 1);
        let n_chunks = tokens.len().div_ceil(n_batch);
        for (k, chunk) in tokens.chunks(n_batch).enumerate() {
            batch.clear();
            let logits = if k + 1 == n_chunks { Logits::Yes } else { Logits::No };
            // `start + k * n_batch` < n_ctx_seq, which is a u32.
            batch.push_sequence(chunk, (start + k * n_batch) as Pos, seq, logits)?;
            self.decode(&batch)?;
        }
        Ok(())
    }

    /// Runs the encoder of an encoder-decoder model (or of an embedding
    /// model without a KV cache, such as BERT) on a batch.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a decoder-only model (use
    /// [`Context::decode`]: llama.cpp's encoder path builds a graph that
    /// reads the KV cache without preparing it, and crashes); otherwise as
    /// [`Context::decode`], and the batch must fit in one micro-batch.
    ///
    /// Every token of the batch is an output. The encoder computes no
    /// logits (except a diffusion model's); its per-token output is
    /// readable through [`Context::embeddings`] while embeddings are on.
    /// llama.cpp checks the batch's positions against the KV cache even
    /// here: clear the decoder's sequences before encoding a new input.
    #[doc(alias = "llama_encode")]
    pub fn encode(&mut self, batch: &Batch) -> Result<()> {
        self.check_not_poisoned()?;
        self.check_reachable()?;
        if !self.model.has_encoder() && self.has_memory {
            return Err(Error::InvalidArgument(
                "encode needs a model with an encoder (T5-like) or without a KV cache (BERT-like); \
                 decoder-only models use decode"
                    .into(),
            ));
        }
        self.validate(batch)?;
        if batch.len() > self.n_ubatch as usize {
            return Err(Error::InvalidBatch(format!(
                "an encoder batch must fit in one micro-batch: {} tokens > n_ubatch {}",
                batch.len(),
                self.n_ubatch
            )));
        }
        let mut code = 0;
        let (this, model) = self.model_for();
        let adapters = model.adapters_read();
        // SAFETY: as in `decode`, plus the micro-batch bound checked above.
        let shim = unsafe { this.call_pass(batch, &mut code, true) };
        drop(adapters);
        let shim = self.forget_outputs_on_err(shim)?;
        let result = check_shim(shim, "llama_encode").and_then(|()| check_decode(code));
        self.poison_on_exception(&result);
        self.record_encoder_outputs(batch, result.is_ok());
        // llama.cpp stores the encoder output only at the very end of a
        // successful encode; a failed one keeps the previous output.
        self.encoded |= result.is_ok();
        result
    }
}
