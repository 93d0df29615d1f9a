//! Media spliced into a prompt of tokens: each medium tokenized alone by
//! the projector, the text around it (the model's delimiters) kept as
//! tokens and its embeddings a run of placeholders
//! ([`crate::text::placeholder`]), decoded whole when the run is reached.
//! The engine's requests and a [`Conversation`](crate::chat::Conversation)
//! with a projector prefill through this.

use crate::error::{Error, Result};
use crate::llama::context::Context;
use crate::llama::mtmd::{ChunkKind, Media, MediaPrompt, Projector};
use crate::llama::types::{Pos, SeqId, Token};
use crate::llama::vocab::{AddBos, Special};
use crate::text::placeholder::{is_placeholder, placeholders};

/// One medium of a prompt: the run of placeholders `start..start + len`
/// and the tokenized chunk its embeddings come from.
#[derive(Debug)]
struct Span {
    start: usize,
    len: usize,
    prompt: MediaPrompt,
    chunk: usize,
}

/// A prompt's media runs, in order.
#[derive(Debug, Default)]
pub(crate) struct Spans(Vec<Span>);

// The engine's worker asks which run starts where; a conversation
// decodes them all at once.
#[cfg_attr(not(feature = "engine"), allow(dead_code))]
impl Spans {
    /// The length of the medium whose run starts at `pos`.
    pub fn starting_at(&self, pos: usize) -> Option<usize> {
        self.find(pos).map(|s| s.len)
    }

    /// The start of the first medium after `pos`.
    pub fn next_start_after(&self, pos: usize) -> Option<usize> {
        self.0.iter().map(|s| s.start).find(|&start| start > pos)
    }

    /// Each run's start and length, in order.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        self.0.iter().map(|s| (s.start, s.len)).collect()
    }

    /// Where the last medium's run ends (0 without media).
    pub fn end(&self) -> usize {
        self.0.last().map_or(0, |s| s.start + s.len)
    }

    fn find(&self, pos: usize) -> Option<&Span> {
        self.0.iter().find(|s| s.start == pos)
    }

    /// Encodes the medium whose run starts at `pos` and decodes it into
    /// `seq` of `ctx` from that position.
    pub fn decode(&self, projector: &mut Projector<'_>, ctx: &mut Context<'_>, pos: usize, seq: SeqId) -> Result<()> {
        let span = self.find(pos).ok_or_else(|| Error::InvalidArgument("no medium starts there".into()))?;
        let chunk =
            span.prompt.chunks().nth(span.chunk).ok_or_else(|| Error::InvalidArgument("no such media chunk".into()))?;
        let pos = Pos::try_from(pos).map_err(|_| Error::InvalidArgument("position out of range".into()))?;
        projector.eval_media_chunk(ctx, &chunk, pos, seq).map(drop)
    }
}

/// `tokens` with `media` in the places `at` (each a run of placeholders
/// between the model's delimiters), and those runs.
///
/// # Errors
/// [`Error::Media`] when places and media differ in number or the
/// projector refuses a medium; [`Error::InvalidBatch`] for an image the
/// model attends to at once that does not fit `n_ubatch`;
/// [`Error::InvalidArgument`] for a prompt that ends with a medium (the
/// first token is sampled from the logits of a text token).
pub(crate) fn splice(
    projector: &Projector<'_>,
    tokens: Vec<Token>,
    at: &[usize],
    media: &[&Media],
    n_ubatch: usize,
) -> Result<(Vec<Token>, Spans)> {
    if at.len() != media.len() {
        return Err(Error::Media(format!("the prompt has places for {} media, and {} came", at.len(), media.len())));
    }
    if at.windows(2).any(|w| w[0] > w[1]) || at.last().is_some_and(|&p| p > tokens.len()) {
        return Err(Error::InvalidArgument("the media's places are out of order or past the prompt".into()));
    }
    let (mut out, mut spans, mut prev) = (Vec::with_capacity(tokens.len()), Vec::new(), 0);
    for (&place, medium) in at.iter().zip(media) {
        out.extend_from_slice(&tokens[prev..place]);
        prev = place;
        let prompt = projector.tokenize(projector.marker(), &[medium], AddBos::No, Special::Markup)?;
        let mut run = None;
        for (i, chunk) in prompt.chunks().enumerate() {
            if chunk.kind() == ChunkKind::Text {
                out.extend_from_slice(chunk.tokens());
                continue;
            }
            let n = chunk.n_tokens();
            if n == 0 || chunk.n_pos() != n {
                return Err(Error::Unsupported("a medium whose positions are not its tokens (M-RoPE)".into()));
            }
            if projector.is_non_causal(&chunk) && n > n_ubatch {
                return Err(Error::InvalidBatch(format!(
                    "the {n} tokens of this image are attended to at once: they must fit one micro-batch \
                     (n_ubatch is {n_ubatch})"
                )));
            }
            let start = out.len();
            out.extend(placeholders(medium.id(), n));
            run = Some((start, n, i));
        }
        let Some((start, len, chunk)) = run else {
            return Err(Error::Media("the projector made no embeddings of a medium".into()));
        };
        spans.push(Span { start, len, prompt, chunk });
    }
    out.extend_from_slice(&tokens[prev..]);
    if out.last().is_some_and(|&t| is_placeholder(t)) {
        return Err(Error::InvalidArgument(
            "the prompt ends with a medium: the first token is sampled after text (add some after it)".into(),
        ));
    }
    Ok((out, Spans(spans)))
}
