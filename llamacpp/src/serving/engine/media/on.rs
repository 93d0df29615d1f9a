//! The engine's media with the `mtmd` feature.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::llama::context::Context;
use crate::llama::model::Model;
use crate::llama::mtmd::{Media, Projector, ProjectorParams};
use crate::llama::types::{SeqId, Token};
use crate::llama::vocab::{AddBos, Special, Vocab};
pub(crate) use crate::text::spliced::Spans;

/// The projector an engine loads ([`EngineConfig::projector`](crate::engine::EngineConfig::projector)).
#[derive(Clone, Debug, Default)]
pub(crate) struct MediaConfig {
    pub projector: Option<(PathBuf, ProjectorParams)>,
}

/// A request's media, in the order of their places in its prompt.
#[derive(Clone, Debug, Default)]
pub(crate) struct Attached(pub Vec<Arc<Media>>);

impl PartialEq for Attached {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|(a, b)| {
                a.id() == b.id() && a.is_audio() == b.is_audio() && (a.width(), a.height()) == (b.width(), b.height())
            })
    }
}

impl Attached {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// An engine's projector, shared by the submitting threads (which
/// tokenize media) and the worker (which encodes them).
pub(crate) struct EngineMedia {
    // Declared before `_model`: dropped first, while the model it
    // borrows is alive.
    projector: Mutex<Projector<'static>>,
    _model: Arc<Model>,
    marker: String,
    vision: bool,
    audio: bool,
}

impl std::fmt::Debug for EngineMedia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineMedia").field("vision", &self.vision).field("audio", &self.audio).finish()
    }
}

impl EngineMedia {
    /// Loads the configured projector for `model`, if there is one.
    pub fn load(model: &Arc<Model>, config: &MediaConfig) -> Result<Option<Arc<EngineMedia>>> {
        let Some((path, params)) = &config.projector else { return Ok(None) };
        // SAFETY: the `Model` lives in its `Arc`'s allocation, which does
        // not move, and `EngineMedia` holds a clone of that `Arc` in a
        // field dropped after the projector: the borrow outlives every use.
        let model_ref: &'static Model = unsafe { &*Arc::as_ptr(model) };
        let projector = Projector::load(model_ref, path, params)?;
        if projector.uses_mrope() {
            return Err(Error::Unsupported(
                "the engine does not take media of M-RoPE models (Qwen-VL) yet: use Projector::eval".into(),
            ));
        }
        Ok(Some(Arc::new(EngineMedia {
            marker: projector.marker().to_owned(),
            vision: projector.supports_vision(),
            audio: projector.supports_audio(),
            projector: Mutex::new(projector),
            _model: Arc::clone(model),
        })))
    }

    fn projector(&self) -> std::sync::MutexGuard<'_, Projector<'static>> {
        self.projector.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The text that marks a medium's place in a text prompt.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    pub fn supports_vision(&self) -> bool {
        self.vision
    }

    pub fn supports_audio(&self) -> bool {
        self.audio
    }

    /// [`Media::from_bytes`] with the engine's projector.
    pub fn media_from_bytes(&self, bytes: &[u8]) -> Result<Media> {
        Media::from_bytes(&self.projector(), bytes)
    }

    /// The tokens `medium` takes in a prompt: its embeddings and the
    /// model's delimiters around them.
    pub fn count(&self, medium: &Media) -> Result<usize> {
        let projector = self.projector();
        let prompt = projector.tokenize(projector.marker(), &[medium], AddBos::No, Special::Markup)?;
        Ok(prompt.n_tokens())
    }

    /// Tokenizes `text` whose markers say where `n` media go: its tokens
    /// (BOS as `add_bos` says, on the first piece only) and the places of
    /// the media among them.
    pub fn split_text(
        &self,
        vocab: &Vocab,
        text: &str,
        n: usize,
        add_bos: AddBos,
        special: Special,
    ) -> Result<(Vec<Token>, Vec<usize>)> {
        let markers = text.matches(self.marker.as_str()).count();
        if markers != n {
            return Err(Error::Media(format!(
                "the prompt has {markers} media markers ({}) for {n} media",
                self.marker
            )));
        }
        let (mut tokens, mut at, mut scratch) = (Vec::new(), Vec::with_capacity(n), Vec::new());
        for (i, piece) in text.split(self.marker.as_str()).enumerate() {
            if i > 0 {
                at.push(tokens.len());
            }
            let bos = if i == 0 { add_bos } else { AddBos::No };
            if !piece.is_empty() || bos == AddBos::Yes {
                vocab.tokenize_into(piece, bos, special, &mut scratch)?;
                tokens.extend_from_slice(&scratch);
            }
        }
        Ok((tokens, at))
    }

    /// `tokens` with `media` in the places `at`, and their runs
    /// ([`mtmd::splice`](crate::mtmd::splice) with the engine's projector).
    pub fn splice(
        &self,
        tokens: Vec<Token>,
        at: &[usize],
        media: &Attached,
        n_ubatch: usize,
    ) -> Result<(Vec<Token>, Spans)> {
        let media: Vec<&Media> = media.0.iter().map(|m| &**m).collect();
        crate::text::spliced::splice(&self.projector(), tokens, at, &media, n_ubatch)
    }

    /// Encodes the medium whose run starts at `pos` of `spans` and decodes
    /// it into `seq` of `ctx` from that position.
    pub fn decode(&self, ctx: &mut Context<'_>, spans: &Spans, pos: usize, seq: SeqId) -> Result<()> {
        spans.decode(&mut self.projector(), ctx, pos, seq)
    }
}

impl crate::serving::engine::EngineConfig {
    /// The multimodal projector (`mmproj` GGUF) the engine loads beside
    /// its model, for requests with images or audio
    /// ([`Request::media`](crate::engine::Request::media)). Default none:
    /// media are refused.
    #[must_use]
    pub fn projector(mut self, path: impl Into<PathBuf>, params: ProjectorParams) -> Self {
        self.media.projector = Some((path.into(), params));
        self
    }
}

impl crate::serving::engine::Request {
    /// A request for text with media: each of the text's markers
    /// ([`Engine::media_marker`](crate::engine::Engine::media_marker),
    /// `<__media__>`) takes the next of `media`, in order. Tokenized at
    /// submit as [`Request::text`](crate::engine::Request::text) is, each
    /// medium by the engine's projector (with the model's delimiters
    /// around it); the text must go on after the last medium.
    pub fn media(text: impl Into<String>, media: impl IntoIterator<Item = Media>) -> Self {
        crate::serving::engine::Request::text(text).with_media(media)
    }

    /// This request with `media` in the places its prompt has for them:
    /// the markers of a text prompt, or the image parts of a chat prompt
    /// ([`ChatPrompt::media_at`](crate::chat::ChatPrompt::media_at)).
    #[must_use]
    pub fn with_media(mut self, media: impl IntoIterator<Item = Media>) -> Self {
        self.media = Attached(media.into_iter().map(Arc::new).collect());
        self
    }

    /// [`Request::with_media`](crate::engine::Request::with_media) for media shared with other requests.
    #[must_use]
    pub fn with_shared_media(mut self, media: impl IntoIterator<Item = Arc<Media>>) -> Self {
        self.media = Attached(media.into_iter().collect());
        self
    }
}

impl crate::serving::engine::Engine {
    fn media(&self) -> Result<&EngineMedia> {
        self.handle.media.as_deref().ok_or_else(|| {
            Error::Unsupported("this engine has no projector for media (EngineConfig::projector)".into())
        })
    }

    /// Whether the engine takes images (its projector has vision).
    pub fn takes_images(&self) -> bool {
        self.media().is_ok_and(EngineMedia::supports_vision)
    }

    /// Whether the engine takes audio (its projector has audio).
    pub fn takes_audio(&self) -> bool {
        self.media().is_ok_and(EngineMedia::supports_audio)
    }

    /// The text that marks a medium's place in a text prompt (`None`
    /// without a projector).
    pub fn media_marker(&self) -> Option<&str> {
        self.media().ok().map(EngineMedia::marker)
    }

    /// The tokens `media` takes in a prompt (its embeddings and the
    /// model's delimiters around them), as a request counts it in
    /// [`Usage::prompt_tokens`](crate::engine::Usage).
    ///
    /// # Errors
    /// [`Error::Unsupported`] without a projector; [`Error::Media`] when the
    /// projector refuses it.
    pub fn media_tokens(&self, media: &Media) -> Result<usize> {
        self.media()?.count(media)
    }

    /// Decodes an image or audio file in memory for this engine's
    /// projector ([`Media::from_bytes`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] without a projector; otherwise as
    /// [`Media::from_bytes`].
    pub fn media_from_bytes(&self, bytes: &[u8]) -> Result<Media> {
        self.media()?.media_from_bytes(bytes)
    }
}
