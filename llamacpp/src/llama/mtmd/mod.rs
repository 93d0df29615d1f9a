//! Images and audio in (feature `mtmd`): a multimodal projector (`mmproj`
//! GGUF) loaded beside its text [`Model`], media decoded into [`Media`],
//! prompts of text and media tokenized into a [`MediaPrompt`] and
//! evaluated into a [`Context`], after which generation goes on as for
//! text.
//!
//! ```no_run
//! # fn main() -> Result<(), llamacpp::Error> {
//! use llamacpp::mtmd::{Media, Projector, ProjectorParams};
//! use llamacpp::{AddBos, ContextParams, Model, ModelParams, Output, Sampler, Special};
//!
//! let model = Model::load("gemma-3-4b-it-q4_k_m.gguf", &ModelParams::default())?;
//! let mut projector = Projector::load(&model, "mmproj-gemma-3-4b-it-f16.gguf", &ProjectorParams::default())?;
//! let image = Media::from_file(&projector, "photo.jpg")?;
//! let text = format!("<start_of_turn>user\n{} What is in this picture?<end_of_turn>\n<start_of_turn>model\n", projector.marker());
//! let prompt = projector.tokenize(&text, &[&image], AddBos::Yes, Special::Markup)?;
//! let mut ctx = model.new_context(&ContextParams::default().n_ctx(4096))?;
//! projector.eval(&mut ctx, &prompt, 0)?;
//! let next = Sampler::greedy().sample(&mut ctx, Output::Last)?;
//! # Ok(()) }
//! ```
//!
//! What is checked before libmtmd runs (never an abort from safe code): a
//! projector file whose metadata has a key of another type than libmtmd
//! reads it as, a projector whose output width is not the text model's
//! input width, a
//! prompt whose markers and media do not match in number, an empty or
//! oversized image, bytes that do not decode, a prompt that does not fit
//! the sequence, an image the model attends to at once that does not fit
//! one micro-batch: each is an [`Error`].

mod media;
mod preflight;
mod prompt;

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

pub use media::{MAX_AUDIO_SAMPLES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, MAX_MEDIA_BYTES, MIN_AUDIO_SAMPLES, Media};
pub use prompt::{Chunk, ChunkKind, MediaPrompt};

use crate::error::{Error, Result};
use crate::llama::backend;
use crate::llama::context::{Context, FlashAttention};
use crate::llama::ffi::check_shim;
use crate::llama::model::Model;
use crate::llama::stack::with_stack;
use crate::llama::thread::SendPtr;
use crate::llama::types::{Pos, SeqId};
use crate::llama::vocab::{AddBos, Special};
use crate::sys;

/// The most tokens [`ProjectorParams::image_min_tokens`] and
/// [`ProjectorParams::image_max_tokens`] may ask for (libmtmd multiplies
/// them by the patch area in 32-bit arithmetic).
pub const MAX_IMAGE_TOKENS: u32 = 65_536;

/// How a [`Projector`] is loaded and run.
///
/// Defaults: on the GPU where the build has one, as many threads as the
/// machine has, a warm-up encode at load (so the first image is not slow
/// and a projector too large for the device fails at load), flash
/// attention where llama.cpp chooses it, the projector's own limits on
/// image tokens.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct ProjectorParams {
    pub(crate) use_gpu: bool,
    pub(crate) n_threads: Option<i32>,
    pub(crate) warmup: bool,
    pub(crate) flash_attention: FlashAttention,
    pub(crate) image_min_tokens: Option<u32>,
    pub(crate) image_max_tokens: Option<u32>,
}

impl Default for ProjectorParams {
    fn default() -> Self {
        ProjectorParams {
            use_gpu: true,
            n_threads: None,
            warmup: true,
            flash_attention: FlashAttention::Auto,
            image_min_tokens: None,
            image_max_tokens: None,
        }
    }
}

impl ProjectorParams {
    setters! {
        /// Run the projector on the GPU where the build has one.
        use_gpu: bool => use_gpu;
        /// CPU threads of the encoder.
        n_threads: i32 => n_threads (Some);
        /// Encode a dummy image at load.
        warmup: bool => warmup;
        /// Flash attention in the encoder.
        flash_attention: FlashAttention => flash_attention;
        /// The fewest tokens an image becomes (vision models with dynamic
        /// resolution only).
        image_min_tokens: u32 => image_min_tokens (Some);
        /// The most tokens an image becomes (vision models with dynamic
        /// resolution only).
        image_max_tokens: u32 => image_max_tokens (Some);
    }
}

/// A multimodal projector: the vision (or audio) encoder of a model,
/// loaded from its `mmproj` GGUF beside the text [`Model`] it belongs to,
/// which it borrows.
#[derive(Debug)]
pub struct Projector<'m> {
    ptr: NonNull<sys::mtmd::mtmd_context>,
    model: &'m Model,
    /// Unique in the process (an address could be reused after a drop):
    /// the prompts it tokenizes carry it.
    id: u64,
}

/// The next [`Projector`]'s id.
static NEXT_PROJECTOR_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

// SAFETY: an `mtmd_context` has no thread affinity, like the llama_context
// it feeds (llama-cpp-c-api.md §1.17): its clip contexts own ggml backends,
// a scheduler and buffers that whichever thread computes uses (llama-server
// creates it while loading and encodes on its task thread). It is not Sync:
// encoding goes through `&mut self`.
unsafe impl Send for Projector<'_> {}

impl Drop for Projector<'_> {
    fn drop(&mut self) {
        // SAFETY: the projector is ours and freed once.
        unsafe { sys::mtmd::mtmd_free(self.ptr.as_ptr()) }
    }
}

impl<'m> Projector<'m> {
    /// Loads the projector at `path` for `model`.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a thread count outside 1..=512 or
    /// image token limits outside 1..=[`MAX_IMAGE_TOKENS`] (or a minimum
    /// over the maximum); [`Error::InvalidArgument`] for a model without a
    /// vocabulary; [`Error::Io`] for a file that cannot be read; [`Error::ProjectorLoad`]
    /// when libmtmd refuses it (not a projector, an unknown projector type,
    /// missing tensors, a metadata key stored with another type than
    /// libmtmd reads it as, an output width other than the model's input
    /// width, a device that cannot hold it); [`Error::Nul`] for a path with
    /// a NUL byte.
    #[doc(alias = "mtmd_init_from_file")]
    pub fn load(model: &'m Model, path: impl AsRef<Path>, params: &ProjectorParams) -> Result<Projector<'m>> {
        backend::init();
        let path = path.as_ref();
        let c_path = crate::llama::model::check_gguf_file(path)?;
        let fail = |reason: String| Error::ProjectorLoad { path: path.to_owned(), reason };
        // clip asserts on a scalar key of another type than it reads.
        preflight::check(&c_path).map_err(fail)?;
        // libmtmd tokenizes with the model's vocabulary (and some projectors
        // look tokens up at load): llama.cpp asserts that there is one.
        model.vocab().check_has_tokenizer()?;
        let n_threads = params.n_threads.unwrap_or_else(crate::llama::context::default_threads);
        crate::llama::context::check_threads(n_threads, n_threads)?;
        // clip multiplies these by the patch area in `int`.
        let tokens = |name: &'static str, n: Option<u32>| match n {
            None => Ok(-1),
            Some(n @ 1..=MAX_IMAGE_TOKENS) => Ok(n as i32),
            Some(n) => {
                Err(Error::InvalidParameter { name, message: format!("must be 1..={MAX_IMAGE_TOKENS}, got {n}") })
            }
        };
        let (min_tokens, max_tokens) = (
            tokens("image_min_tokens", params.image_min_tokens)?,
            tokens("image_max_tokens", params.image_max_tokens)?,
        );
        if min_tokens > 0 && max_tokens > 0 && min_tokens > max_tokens {
            return Err(Error::InvalidParameter {
                name: "image_min_tokens",
                message: format!("{min_tokens} is more than image_max_tokens {max_tokens}"),
            });
        }
        let flash = match params.flash_attention {
            FlashAttention::Auto => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_AUTO,
            FlashAttention::On => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttention::Off => sys::llama_flash_attn_type::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        backend::clear_last_error();
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `c_path` is a NUL-terminated path, the model is live for
        // `'m` (the projector keeps its pointer and is dropped before it),
        // and the shim catches exceptions.
        let code = unsafe {
            sys::mtmd::llama_rs_mtmd_init(
                c_path.as_ptr(),
                model.as_ptr(),
                params.use_gpu,
                n_threads,
                params.warmup,
                flash,
                min_tokens,
                max_tokens,
                &mut ptr,
            )
        };
        if code != sys::shim::OK {
            // SAFETY: the shim's message of this thread's last exception.
            let message = unsafe { crate::llama::ffi::owned_lossy(sys::shim::llama_rs_last_exception()) };
            return Err(fail(message.trim().to_owned()));
        }
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(fail(backend::last_error_or("libmtmd could not load it (see the llama.cpp log)")));
        };
        let id = NEXT_PROJECTOR_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Projector { ptr, model, id })
    }

    /// The raw pointer, for libmtmd calls this crate does not wrap. Calls
    /// through it must keep what the safe methods check.
    pub fn as_ptr(&self) -> *mut sys::mtmd::mtmd_context {
        self.ptr.as_ptr()
    }

    /// The text model this projector belongs to.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Whether the projector takes images.
    #[doc(alias = "mtmd_support_vision")]
    pub fn supports_vision(&self) -> bool {
        // SAFETY: the projector is live.
        unsafe { sys::mtmd::mtmd_support_vision(self.ptr.as_ptr()) }
    }

    /// Whether the projector takes audio.
    #[doc(alias = "mtmd_support_audio")]
    pub fn supports_audio(&self) -> bool {
        // SAFETY: the projector is live.
        unsafe { sys::mtmd::mtmd_support_audio(self.ptr.as_ptr()) }
    }

    /// The sample rate audio must have (Hz), if the projector takes audio.
    #[doc(alias = "mtmd_get_audio_sample_rate")]
    pub fn audio_sample_rate(&self) -> Option<u32> {
        // SAFETY: the projector is live.
        let rate = unsafe { sys::mtmd::mtmd_get_audio_sample_rate(self.ptr.as_ptr()) };
        u32::try_from(rate).ok().filter(|&r| r > 0)
    }

    /// Whether the text model takes M-RoPE positions (Qwen-VL): an image
    /// then takes fewer positions than tokens.
    #[doc(alias = "mtmd_decode_use_mrope")]
    pub fn uses_mrope(&self) -> bool {
        // SAFETY: the projector is live.
        unsafe { sys::mtmd::mtmd_decode_use_mrope(self.ptr.as_ptr()) }
    }

    /// The text that marks where a medium goes in a prompt
    /// (`<__media__>`).
    #[doc(alias = "mtmd_get_marker")]
    pub fn marker(&self) -> &str {
        // SAFETY: the projector is live; its marker lives as long as it.
        unsafe { crate::llama::ffi::borrowed_str(sys::mtmd::mtmd_get_marker(self.ptr.as_ptr())) }
            .unwrap_or("<__media__>")
    }

    /// Tokenizes `text`, each of whose markers ([`Projector::marker`])
    /// takes the next of `media`, in order; the projector adds the
    /// model's image delimiters around each (Gemma 3's
    /// `<start_of_image>`, for example). `special` says whether control
    /// tokens written in `text` are control tokens (a rendered chat
    /// template) or plain text (untrusted input).
    ///
    /// # Errors
    /// [`Error::Media`] when the number of markers is not the number of
    /// media, for audio given to a projector without audio (or an image
    /// to one without vision), or when libmtmd cannot preprocess a medium;
    /// [`Error::Nul`] for a NUL byte in `text`; [`Error::InputTooLarge`]
    /// as for [`Vocab::tokenize`](crate::Vocab::tokenize).
    #[doc(alias = "mtmd_tokenize")]
    pub fn tokenize(&self, text: &str, media: &[&Media], add_bos: AddBos, special: Special) -> Result<MediaPrompt> {
        let markers = text.matches(self.marker()).count();
        if markers != media.len() {
            return Err(Error::Media(format!(
                "the prompt has {markers} media markers ({}) for {} media",
                self.marker(),
                media.len()
            )));
        }
        for m in media {
            if m.is_audio() && !self.supports_audio() {
                return Err(Error::Media("this projector takes no audio".into()));
            }
            if !m.is_audio() && !self.supports_vision() {
                return Err(Error::Media("this projector takes no images".into()));
            }
        }
        let c_text = CString::new(text)?;
        // SAFETY: a new, empty list, owned by the prompt from here on.
        let list =
            NonNull::new(unsafe { sys::mtmd::mtmd_input_chunks_init() }).ok_or(Error::OutOfMemory { bytes: 0 })?;
        let mut prompt = MediaPrompt::new(list, self.id);
        let bitmaps: Vec<*const sys::mtmd::mtmd_bitmap> = media.iter().map(|m| m.as_ptr()).collect();
        let stack = self.model.vocab().tokenize_stack(text.len());
        let call = SendPtr((self.ptr.as_ptr(), prompt.as_mut_ptr(), c_text.as_ptr(), bitmaps.as_ptr()));
        let (add_bos, parse_special) = (add_bos == AddBos::Yes, special == Special::Markup);
        let (len, n) = (text.len(), bitmaps.len());
        with_stack("the text to tokenize", stack, move || {
            let call = call;
            let (ctx, out, text, bitmaps) = call.0;
            let mut code = 0;
            backend::clear_last_error();
            // SAFETY: the projector and list are live (the caller waits for
            // this call), `text` is NUL-terminated at `len` with no NUL
            // inside (CString), `bitmaps` holds `n` live bitmaps; the shim
            // catches exceptions. mtmd_tokenize takes a shared projector.
            let shim = unsafe {
                sys::mtmd::llama_rs_mtmd_tokenize(ctx, out, text, len, add_bos, parse_special, bitmaps, n, &mut code)
            };
            // The exception and the logged error are kept by the thread
            // that ran the call (a helper thread for a long text).
            check_shim(shim, "mtmd_tokenize")?;
            match code {
                0 => Ok(()),
                1 => Err(Error::Media(format!("the prompt's media markers do not match its {n} media"))),
                _ => Err(Error::Media(backend::last_error_or("libmtmd could not preprocess the media"))),
            }
        })??;
        Ok(prompt)
    }

    /// Evaluates `prompt` into sequence `seq` of `ctx`, after the
    /// sequence's last cached position (or from 0): text chunks as
    /// [`Context::eval`] does, media chunks encoded by the projector and
    /// their embeddings decoded (with non-causal attention within an image
    /// where the model wants it). When the prompt ends with text, the
    /// logits of its last token are ready for sampling
    /// ([`Output::Last`](crate::Output::Last)); after a medium, none are.
    ///
    /// # Errors
    /// [`Error::WrongModel`] for a context of another model or a prompt
    /// another projector tokenized; [`Error::ContextFull`] when the
    /// prompt's positions do not fit the sequence (checked before anything
    /// is evaluated); [`Error::InvalidBatch`] for an image the model
    /// attends to at once that does not fit `n_ubatch`; [`Error::Media`]
    /// when the encoder fails; otherwise as [`Context::decode`]. When a
    /// chunk fails, the chunks before it stay in the cache.
    pub fn eval(&mut self, ctx: &mut Context<'m>, prompt: &MediaPrompt, seq: SeqId) -> Result<()> {
        if !std::ptr::eq(ctx.model(), self.model) {
            return Err(Error::WrongModel("the context"));
        }
        if prompt.projector != self.id {
            return Err(Error::WrongModel("the media prompt"));
        }
        ctx.check_seq(seq)?;
        let start = ctx.seq_pos_max(seq)?.map_or(0, |p| p as usize + 1);
        let n_ctx = ctx.n_ctx_seq();
        if start.saturating_add(prompt.n_pos()) > n_ctx as usize {
            return Err(Error::ContextFull { n_ctx });
        }
        let mut n_past = start as Pos;
        for chunk in prompt.chunks() {
            match chunk.kind() {
                ChunkKind::Text => {
                    if chunk.tokens().is_empty() {
                        continue;
                    }
                    // From `n_past`, as libmtmd's helper does: after an
                    // M-RoPE image it is not the cache's last position + 1.
                    ctx.eval_from(chunk.tokens(), seq, n_past as usize)?;
                    n_past += chunk.tokens().len() as Pos;
                }
                ChunkKind::Image | ChunkKind::Audio => n_past = self.eval_media_chunk(ctx, &chunk, n_past, seq)?,
            }
        }
        Ok(())
    }

    /// Encodes a media chunk of a prompt this projector tokenized and
    /// decodes it into `seq` of `ctx` from `n_past`; returns the position
    /// after it. The caller has checked that the positions fit.
    pub(crate) fn eval_media_chunk(
        &mut self,
        ctx: &mut Context<'_>,
        chunk: &Chunk<'_>,
        n_past: Pos,
        seq: SeqId,
    ) -> Result<Pos> {
        if !std::ptr::eq(ctx.model(), self.model) {
            return Err(Error::WrongModel("the context"));
        }
        let embd = self.encode(chunk, self.model.n_embd_inp())?;
        // SAFETY: the chunk is queried from a live prompt.
        let non_causal = unsafe { sys::mtmd::mtmd_decode_use_non_causal(self.ptr.as_ptr(), chunk.as_ptr()) };
        let media = crate::llama::context::EncodedChunk {
            projector: self.ptr.as_ptr(),
            chunk: chunk.as_ptr(),
            embd,
            n_tokens: chunk.n_tokens(),
            non_causal,
        };
        // SAFETY: the projector belongs to the context's model (checked
        // above), the chunk is of a live prompt (the caller's borrow), and
        // `embd` is its last encode, of this chunk: `n_embd × n_tokens`
        // floats, where n_embd is the model's input width (libmtmd refuses
        // at load a projector whose output width differs).
        unsafe { ctx.decode_media(&media, n_past, seq) }
    }

    /// Whether the model attends to all of `chunk` at once (it must then
    /// fit one micro-batch).
    #[doc(alias = "mtmd_decode_use_non_causal")]
    pub fn is_non_causal(&self, chunk: &Chunk<'_>) -> bool {
        // SAFETY: the projector is live and the chunk is of a live prompt.
        unsafe { sys::mtmd::mtmd_decode_use_non_causal(self.ptr.as_ptr(), chunk.as_ptr()) }
    }

    /// Runs the encoder on a media chunk; returns its output (`n_embd ×
    /// n_tokens` floats, valid until the next encode).
    fn encode(&mut self, chunk: &Chunk<'_>, n_embd: usize) -> Result<*mut f32> {
        if chunk.kind() == ChunkKind::Text {
            return Err(Error::InvalidArgument("a text chunk has nothing to encode".into()));
        }
        let mut code = 0;
        backend::clear_last_error();
        // SAFETY: the projector is ours (`&mut self`), the chunk is of a live
        // prompt; the shim catches exceptions.
        let shim = unsafe { sys::mtmd::llama_rs_mtmd_encode_chunk(self.ptr.as_ptr(), chunk.as_ptr(), &mut code) };
        check_shim(shim, "mtmd_encode_chunk")?;
        if code != 0 {
            return Err(Error::Media(backend::last_error_or("the projector could not encode the medium")));
        }
        // SAFETY: the projector is live; after a successful encode its
        // output holds the chunk's embeddings.
        let embd = unsafe { sys::mtmd::mtmd_get_output_embd(self.ptr.as_ptr()) };
        if embd.is_null() || n_embd == 0 {
            return Err(Error::Media("the projector produced no embeddings".into()));
        }
        Ok(embd)
    }
}
