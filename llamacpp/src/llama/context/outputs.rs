//! The outputs of the last pass: which batch tokens have rows, and the
//! logits and embeddings read from them.

use super::{Context, Produced};
use crate::error::{Error, Result};
use crate::llama::batch::Batch;
use crate::llama::types::SeqId;
use crate::sys;
// Defined in the leaf module `types` (errors name it too); kept here at
// its old path.
pub use crate::llama::types::Output;

impl Context<'_> {
    /// Records the outputs of a decode through the KV cache: the tokens
    /// that asked for logits, or every token while embeddings are on. An
    /// encoder-only model (T5 encoder) runs its encoder graph there, which
    /// computes no logits.
    pub(super) fn record_outputs(&mut self, batch: &Batch, ok: bool) {
        self.invalidate_outputs();
        if !ok {
            return;
        }
        let all = self.embeddings;
        for i in 0..batch.len() {
            if all || batch.has_logits(i) {
                self.output_rows.push(self.n_outputs);
                self.n_outputs += 1;
            } else {
                self.output_rows.push(-1);
            }
        }
        self.produced = Produced {
            logits: self.model.has_decoder(),
            token_embeddings: self.embeddings && self.per_token_embeddings,
            pooled: self.embeddings && !self.per_token_embeddings,
        };
    }

    /// Records the outputs of llama.cpp's encoder path (`encode`, or
    /// `decode` on a context without memory, which llama.cpp forwards to
    /// it): every token is an output, whatever the batch asked for. Its
    /// graph computes logits only for the memory-less diffusion models
    /// (an encoder's or an embedding model's graph ends at the hidden
    /// state); embeddings only while they are on.
    pub(super) fn record_encoder_outputs(&mut self, batch: &Batch, ok: bool) {
        self.invalidate_outputs();
        if !ok {
            return;
        }
        self.output_rows.extend(0..batch.len() as i32);
        self.n_outputs = batch.len() as i32;
        self.produced = Produced {
            logits: !self.model.has_encoder() && self.model.is_diffusion(),
            token_embeddings: self.embeddings && self.per_token_embeddings,
            pooled: self.embeddings && !self.per_token_embeddings,
        };
    }

    /// Maps `at` to a valid argument for llama.cpp's `_ith` getters
    /// (which count negative indices from the last output).
    pub(crate) fn output_index(&self, at: Output) -> Result<i32> {
        let ok = match at {
            Output::Index(i) => self.output_rows.get(i).is_some_and(|&row| row >= 0),
            Output::Last => self.n_outputs > 0,
        };
        match at {
            _ if !ok => Err(Error::NoOutput(at)),
            // `output_rows` is as long as the last batch, so `i` fits an i32.
            Output::Index(i) => Ok(i as i32),
            Output::Last => Ok(-1),
        }
    }

    /// The logits (one per vocabulary token) of an output of the last
    /// decode: [`Output::Last`], or the batch token [`Output::Index`]`(i)`
    /// (a `usize` converts into it).
    /// The slice borrows the context, so it cannot outlive the next decode.
    ///
    /// # Errors
    /// [`Error::NoOutput`] if that token did not request logits, or the
    /// last pass computed none (an [`Context::encode`], or a decode of a
    /// context without a KV cache, of a model other than a diffusion one).
    #[doc(alias = "llama_get_logits_ith")]
    pub fn logits(&mut self, at: impl Into<Output>) -> Result<&[f32]> {
        self.check_reachable()?;
        let at = at.into();
        let i = self.output_index(at)?;
        if !self.produced.logits {
            return Err(Error::NoOutput(at));
        }
        // SAFETY: `i` names an output of the last pass, which wrote logits,
        // so llama.cpp returns a row of n_vocab floats that stays valid
        // until the next call that takes `&mut self`, which the returned
        // borrow prevents.
        let ptr = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if ptr.is_null() {
            return Err(Error::NoOutput(at));
        }
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, self.n_vocab as usize) })
    }

    /// The embedding of an output of the last decode (as in
    /// [`Context::logits`]), `n_embd_out` floats. Needs embeddings on during that
    /// decode and [`Pooling::None`](crate::Pooling::None) (or a model whose default is no
    /// pooling): with pooling, llama.cpp computes only the per-sequence
    /// embeddings of [`Context::sequence_embeddings`].
    ///
    /// # Errors
    /// [`Error::NoOutput`] if there is no such output, embeddings were off
    /// during the last decode (turning them on afterwards does not compute
    /// any), or the context pools them.
    #[doc(alias = "llama_get_embeddings_ith")]
    pub fn embeddings(&mut self, at: impl Into<Output>) -> Result<&[f32]> {
        self.check_reachable()?;
        let at = at.into();
        let i = self.output_index(at)?;
        if !self.produced.token_embeddings {
            return Err(Error::NoOutput(at));
        }
        // SAFETY: as in `logits`: the last pass ran with embeddings on, so
        // the buffer exists and holds a row of n_embd_out floats for `i`.
        let ptr = unsafe { sys::llama_get_embeddings_ith(self.ptr.as_ptr(), i) };
        if ptr.is_null() {
            return Err(Error::NoOutput(at));
        }
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, self.model.n_embd_out()) })
    }

    /// The pooled embedding of a sequence after the last decode (pooling
    /// other than `None`): `n_embd_out` floats, or `n_cls_out` for `Rank`.
    ///
    /// # Errors
    /// [`Error::InvalidSeqId`]; [`Error::NoSequenceOutput`] without pooled output
    /// of `seq` from the last decode (embeddings off during it, the
    /// sequence not in it, or the cache cleared or loaded since).
    #[doc(alias = "llama_get_embeddings_seq")]
    pub fn sequence_embeddings(&mut self, seq: SeqId) -> Result<&[f32]> {
        self.check_reachable()?;
        self.check_seq(seq)?;
        if !self.produced.pooled {
            return Err(Error::NoSequenceOutput(seq));
        }
        // SAFETY: a valid sequence id; the result is NULL or a row valid
        // until the next decode, which the borrow prevents.
        let (ptr, rank) = unsafe {
            (
                sys::llama_get_embeddings_seq(self.ptr.as_ptr(), seq),
                sys::llama_pooling_type(self.ptr.as_ptr()) == sys::llama_pooling_type::LLAMA_POOLING_TYPE_RANK,
            )
        };
        if ptr.is_null() {
            return Err(Error::NoSequenceOutput(seq));
        }
        let len = if rank {
            // SAFETY: a pure read; only reached for RANK pooling, i.e. a
            // classifier model.
            unsafe { sys::llama_model_n_cls_out(self.model.as_ptr()) as usize }
        } else {
            self.model.n_embd_out()
        };
        // SAFETY: see above.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// Forgets the outputs of the last pass (after anything that makes
    /// them stale: a failed pass, a cache clear or state load).
    pub(crate) fn invalidate_outputs(&mut self) {
        self.output_rows.clear();
        self.n_outputs = 0;
        self.produced = Produced::default();
    }
}
