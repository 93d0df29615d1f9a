//! Images and audio in a [`Conversation`]: with the `mtmd` feature, a
//! projector loaded beside the model ([`Conversation::projector`]), media
//! kept by the conversation ([`Conversation::attach`]) or given as
//! `data:` URLs and base64 clips in message parts, and each prompt's
//! media decoded before the reply as the engine decodes them: a run of
//! placeholder tokens per medium ([`crate::text::placeholder`]), so the
//! KV cache is reused across turns through identical media and each
//! image is encoded once for as long as the cache keeps it. Without the
//! feature a prompt with media parts is refused.

use crate::llama::types::Token;

#[cfg(feature = "mtmd")]
pub(super) use on::ConversationMedia;

#[cfg(not(feature = "mtmd"))]
pub(super) use off::ConversationMedia;

/// What a prompt with media left in the cache: the prompt's tokens (a
/// placeholder per embedding) and how many positions were decoded.
pub(super) struct Prefilled {
    pub tokens: Vec<Token>,
    pub evaluated: usize,
}

#[cfg(feature = "mtmd")]
mod on {
    use std::collections::HashMap;

    use serde_json::Value;

    use super::Prefilled;
    use crate::error::{Error, Result};
    use crate::llama::context::Context;
    use crate::llama::mtmd::{Media, Projector};
    use crate::llama::types::SeqId;
    use crate::text::chat::conversation::{Conversation, Turn};
    use crate::text::chat::{ChatPrompt, ContentPart, InputAudio, MediaPart, media_parts};
    use crate::text::generate::Session;

    /// The scheme of a part that refers to a medium the conversation keeps.
    const KEPT: &str = "media:";

    /// A conversation's projector and the media its messages refer to.
    #[derive(Default)]
    pub(crate) struct ConversationMedia<'m> {
        projector: Option<Projector<'m>>,
        /// Each medium by what its part holds: `media:<id>` for an
        /// attached one, the `data:` URL or base64 clip of a part given
        /// whole (decoded once).
        known: HashMap<String, Media>,
    }

    impl<'m> ConversationMedia<'m> {
        /// Splices the media of `prompt` (its parts in `messages`, in
        /// order) into its tokens and decodes the prompt up to its last
        /// medium into `seq` of `ctx`, reusing what `session` recorded there.
        pub(crate) fn prefill(
            &mut self,
            ctx: &mut Context<'m>,
            session: &mut Session,
            prompt: &ChatPrompt,
            messages: &Value,
            seq: SeqId,
        ) -> Result<Prefilled> {
            let projector = self.projector.as_mut().ok_or_else(|| {
                Error::Unsupported(
                    "image and audio parts need a projector: Conversation::projector, or an engine's \
                     EngineConfig::projector"
                        .into(),
                )
            })?;
            let parts = media_parts(messages)?;
            let mut keys = Vec::with_capacity(parts.len());
            for part in &parts {
                let key = match part {
                    MediaPart::Image { url } => url,
                    MediaPart::Audio { data, .. } => data,
                };
                if !self.known.contains_key(key) {
                    if key.starts_with(KEPT) {
                        return Err(Error::Media(format!(
                            "a message refers to {key}, which this conversation does not hold \
                             (Conversation::attach keeps a medium)"
                        )));
                    }
                    let medium = Media::from_bytes(projector, &part.bytes()?)?;
                    self.known.insert(key.clone(), medium);
                }
                keys.push(key.as_str());
            }
            // Parts given whole that no message holds any more are let go;
            // attached media stay (their message may come later).
            self.known.retain(|k, _| k.starts_with(KEPT) || keys.contains(&k.as_str()));
            let media: Vec<&Media> = keys.iter().map(|k| &self.known[*k]).collect();
            let (tokens, spans) = crate::text::spliced::splice(
                projector,
                prompt.tokens.clone(),
                &prompt.media_at,
                &media,
                ctx.n_ubatch() as usize,
            )?;
            let runs = spans.runs();
            let evaluated = session.prefill_runs(ctx, seq, &tokens, spans.end(), &runs, |ctx, pos| {
                spans.decode(projector, ctx, pos, seq)
            })?;
            Ok(Prefilled { tokens, evaluated })
        }
    }

    impl<'m> Conversation<'m> {
        /// Takes images (and audio, where the projector has an audio
        /// encoder) through `projector`, loaded for this conversation's
        /// model: media attached with [`Conversation::attach`] and
        /// `image_url` parts with `data:` URLs or `input_audio` parts in
        /// the messages. Each prompt's media are encoded and decoded into
        /// the cache before the reply; a later turn reuses them from the
        /// cache while the history before them is unchanged.
        ///
        /// # Errors
        /// [`Error::WrongModel`] for a projector loaded for another model.
        pub fn projector(mut self, projector: Projector<'m>) -> Result<Self> {
            if !std::ptr::eq(projector.model(), self.model) {
                return Err(Error::WrongModel("the projector"));
            }
            self.media.projector = Some(projector);
            Ok(self)
        }

        /// Keeps `medium` for this conversation and returns the message
        /// part that puts it in a message: an `image_url` (or
        /// `input_audio`) part that refers to it as `media:<id>`. The
        /// conversation keeps the medium for as long as it lives.
        pub fn attach(&mut self, medium: Media) -> ContentPart {
            let key = format!("{KEPT}{}", medium.id());
            let part = if medium.is_audio() {
                ContentPart::InputAudio { input_audio: InputAudio { data: key.clone(), format: "media".into() } }
            } else {
                ContentPart::image_url(key.clone())
            };
            self.media.known.insert(key, medium);
            part
        }

        /// Appends a user message of `media` (in order) followed by
        /// `text`.
        pub fn user_media(&mut self, text: impl Into<String>, media: impl IntoIterator<Item = Media>) {
            let mut parts: Vec<ContentPart> = media.into_iter().map(|m| self.attach(m)).collect();
            parts.push(ContentPart::text(text));
            self.push(crate::text::chat::ChatMessage::parts("user", parts));
        }

        /// Appends a user message of `media` and `text`
        /// ([`Conversation::user_media`]) and starts the reply; when the
        /// reply cannot start, the message is not kept.
        ///
        /// # Errors
        /// As [`Conversation::reply`].
        pub fn send_media(
            &mut self,
            text: impl Into<String>,
            media: impl IntoIterator<Item = Media>,
        ) -> Result<Turn<'_, 'm>> {
            self.user_media(text, media);
            self.start(None, true)
        }
    }
}

#[cfg(not(feature = "mtmd"))]
mod off {
    use serde_json::Value;

    use super::Prefilled;
    use crate::error::{Error, Result};
    use crate::llama::context::Context;
    use crate::llama::types::SeqId;
    use crate::text::chat::ChatPrompt;
    use crate::text::generate::Session;

    /// Without `mtmd` a conversation holds no media.
    #[derive(Default)]
    pub(crate) struct ConversationMedia<'m>(std::marker::PhantomData<&'m ()>);

    impl<'m> ConversationMedia<'m> {
        /// Splices the media of `prompt` (its parts in `messages`, in
        /// order) into its tokens and decodes the prompt up to its last
        /// medium into `seq` of `ctx`, reusing what `session` recorded there.
        pub(crate) fn prefill(
            &mut self,
            _ctx: &mut Context<'m>,
            _session: &mut Session,
            _prompt: &ChatPrompt,
            _messages: &Value,
            _seq: SeqId,
        ) -> Result<Prefilled> {
            Err(Error::Unsupported(
                "image and audio parts need the `mtmd` feature (and Conversation::projector)".into(),
            ))
        }
    }
}
