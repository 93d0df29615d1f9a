//! Decoding a media chunk's embeddings (feature `mtmd`): the checks
//! [`Context::decode`] makes, around libmtmd's helper, which builds the
//! embedding batch, positions it (M-RoPE included) and switches the
//! attention to non-causal for the chunks that need it.

use super::Context;
use crate::error::{Error, Result};
use crate::llama::ffi::{check_decode, check_shim};
use crate::llama::types::{Pos, SeqId};
use crate::sys;

/// A media chunk ready to decode.
pub(crate) struct EncodedChunk {
    pub(crate) projector: *mut sys::mtmd::mtmd_context,
    pub(crate) chunk: *const sys::mtmd::mtmd_input_chunk,
    /// The projector's output of its last encode: `n_embd_inp × n_tokens`.
    pub(crate) embd: *mut f32,
    pub(crate) n_tokens: usize,
    /// The chunk is attended to all at once (one micro-batch).
    pub(crate) non_causal: bool,
}

impl Context<'_> {
    /// Decodes `media` into sequence `seq` from position `n_past`; returns
    /// the position after it.
    ///
    /// # Safety
    /// `media.projector` is a live projector of this context's model,
    /// `media.chunk` a media chunk of a live list, and `media.embd` holds
    /// its embeddings (`n_embd_inp × n_tokens` floats).
    pub(crate) unsafe fn decode_media(&mut self, media: &EncodedChunk, n_past: Pos, seq: SeqId) -> Result<Pos> {
        self.check_not_poisoned()?;
        self.check_reachable()?;
        self.check_seq(seq)?;
        if self.calls.is_remote() {
            return Err(Error::Unsupported("media input for a model with layers on RPC workers".into()));
        }
        // Embeddings go into a decoder's KV cache: a context without one
        // would run them through llama_encode, and an encoder-decoder
        // model's decoder needs an encoder output first (both assert).
        if !self.has_memory || self.model.has_encoder() {
            return Err(Error::Unsupported(
                "media input needs a decoder-only model with a KV cache (not an encoder or encoder-decoder model)"
                    .into(),
            ));
        }
        if media.n_tokens == 0 {
            return Err(Error::InvalidBatch("the media chunk has no tokens".into()));
        }
        // SAFETY: a read of a setting of the live context.
        let causal = unsafe { sys::llama_get_causal_attn(self.ptr.as_ptr()) };
        // llama.cpp asserts that a non-causal batch fits in one micro-batch:
        // the chunk's own attention, or the context's (as `validate` checks
        // for token batches).
        let non_causal = media.non_causal || self.non_causal || !causal;
        if non_causal && media.n_tokens > self.n_ubatch as usize {
            return Err(Error::InvalidBatch(format!(
                "the {} tokens of a media input are attended to at once (by the model or the context): they must fit \
                 in one micro-batch (n_ubatch {}; set ContextParams::n_ubatch and n_batch to at least {})",
                media.n_tokens, self.n_ubatch, media.n_tokens
            )));
        }
        let n_batch = if non_causal { media.n_tokens } else { self.n_batch as usize };
        let n_batch = i32::try_from(n_batch).map_err(|_| Error::InvalidBatch("media chunk too large".into()))?;
        let (this, model) = self.model_for();
        let adapters = model.adapters_read();
        let (mut new_past, mut code) = (n_past, 0);
        // SAFETY: the caller's contract for the projector, chunk and
        // embeddings; the context is live and ours (`&mut self`), the
        // sequence id is in range, a non-causal chunk fits in one
        // micro-batch (checked above), and the shim catches exceptions.
        let shim = unsafe {
            sys::mtmd::llama_rs_mtmd_decode_media_chunk(
                media.projector,
                this.ptr.as_ptr(),
                media.chunk,
                media.embd,
                n_past,
                seq,
                n_batch,
                &mut new_past,
                &mut code,
            )
        };
        drop(adapters);
        // The helper asks for no outputs: whatever the last pass left is gone.
        self.invalidate_outputs();
        let result = check_shim(shim, "mtmd_helper_decode_image_chunk").and_then(|()| match code {
            -1 => Err(Error::InvalidArgument("not a media chunk".into())),
            code => check_decode(code),
        });
        self.poison_on_exception(&result);
        result.map(|()| new_past)
    }
}
