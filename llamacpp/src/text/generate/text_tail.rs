//! The text end of a generation: sampled tokens in, text out that never
//! splits a UTF-8 character and never contains (part of) a stop string.
//!
//! One pipeline, used by [`Session`](super::Session)'s runs and by the
//! [engine](crate::engine)'s sequences: detokenize a token → look for stop
//! strings in the new text → release what can no longer belong to one; at
//! the end of a run that no stop string ended, flush what is held back.

use crate::error::Result;
use crate::llama::types::Token;
use crate::llama::vocab::{Detokenizer, Special, Vocab};

use super::StopMatcher;

/// The buffers of a [`TextTail`] without its vocabulary: what a
/// [`Session`](super::Session) keeps between runs, so that its runs reuse
/// them instead of allocating new ones.
#[derive(Debug, Default)]
pub(crate) struct TailBuffers {
    stop: StopMatcher,
    /// The text of the last token (a scratch buffer).
    piece: String,
    /// Text released and not yet handed out.
    released: String,
}

/// Detokenizer, stop matcher and released text of one generation.
#[derive(Debug)]
pub(crate) struct TextTail<'v> {
    detokenizer: Detokenizer<'v>,
    buffers: TailBuffers,
}

impl<'v> TextTail<'v> {
    /// A tail for a run that renders tokens of `vocab` (control tokens as
    /// `special` says) and stops at `stops`.
    // The engine's sequences start fresh; a Session reuses its buffers.
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    pub fn new<S: AsRef<str>>(vocab: &'v Vocab, special: Special, stops: &[S]) -> Self {
        TextTail::reusing(TailBuffers::default(), vocab, special, stops)
    }

    /// As [`TextTail::new`], in the buffers of an earlier run.
    pub fn reusing<S: AsRef<str>>(mut buffers: TailBuffers, vocab: &'v Vocab, special: Special, stops: &[S]) -> Self {
        buffers.stop.set_stops(stops);
        buffers.piece.clear();
        buffers.released.clear();
        TextTail { detokenizer: Detokenizer::new(vocab, special), buffers }
    }

    /// Hands the buffers back for a later run; the tail is left empty.
    pub fn take_buffers(&mut self) -> TailBuffers {
        std::mem::take(&mut self.buffers)
    }

    /// Adds a sampled token: its complete text goes through the stop
    /// matcher, and what is certain not to be part of a stop string is
    /// released. Returns the stop string that completed, if one did (the
    /// released text then ends right before it).
    ///
    /// # Errors
    /// As [`Detokenizer::push`].
    pub fn push(&mut self, token: Token) -> Result<Option<String>> {
        let TailBuffers { stop, piece, released } = &mut self.buffers;
        piece.clear();
        self.detokenizer.push(token, piece)?;
        Ok(stop.push(piece, released).map(|i| stop.stops()[i].clone()))
    }

    /// At the end of a run that no stop string ended: releases everything
    /// held back, an unfinished character as U+FFFD. (After a stop string,
    /// what is held belongs to it or follows it, and is never released.)
    pub fn flush(&mut self) {
        let TailBuffers { stop, released, .. } = &mut self.buffers;
        if !self.detokenizer.pending().is_empty() {
            let rest = self.detokenizer.finish();
            stop.push(&rest, released);
        }
        stop.flush(released);
    }

    /// Drops what is held back (a cancelled run hands out nothing more).
    pub fn discard(&mut self) {
        self.buffers.stop.held.clear();
        self.detokenizer.finish();
    }

    /// Bytes of an unfinished character held back.
    pub fn incomplete_utf8(&self) -> usize {
        self.detokenizer.pending().len()
    }

    /// The text released and not yet taken.
    pub fn released(&self) -> &str {
        &self.buffers.released
    }

    /// Forgets the released text (the caller has handed it out).
    pub fn clear_released(&mut self) {
        self.buffers.released.clear();
    }

    /// Takes the released text (the engine's sequences hand it out whole).
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    pub fn take_released(&mut self) -> String {
        std::mem::take(&mut self.buffers.released)
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::llama::model::{Model, ModelParams};
    use crate::testing::{
        TINY_CONTROL_TOKEN, TINY_CONTROL_TOKEN_ID, TINY_FIRST_BYTE_ID, TinyModelSpec, tiny_llama_path,
    };

    fn vocab_model() -> Model {
        let path = tiny_llama_path(&TinyModelSpec::default()).expect("write the tiny model");
        Model::load(&path, &ModelParams::default().vocab_only(true)).expect("load its vocabulary")
    }

    /// The byte tokens that spell `text`.
    fn bytes(text: &str) -> Vec<Token> {
        text.bytes().map(|b| Token(TINY_FIRST_BYTE_ID + i32::from(b))).collect()
    }

    /// Pushes `tokens`, collecting the text released after each and the
    /// first stop string that completed.
    fn run(tail: &mut TextTail<'_>, tokens: &[Token]) -> (Vec<String>, Option<String>) {
        let mut pieces = Vec::new();
        for &token in tokens {
            let stopped = tail.push(token).expect("a token of the vocabulary");
            pieces.push(tail.take_released());
            if stopped.is_some() {
                return (pieces, stopped);
            }
        }
        (pieces, None)
    }

    #[test]
    fn a_character_split_across_tokens_is_released_whole() {
        let model = vocab_model();
        let mut tail = TextTail::new(model.vocab(), Special::Plain, &[] as &[&str]);
        let (pieces, stopped) = run(&mut tail, &bytes("aé!"));
        assert_eq!(stopped, None);
        assert_eq!(pieces, ["a", "", "é", "!"]);
    }

    #[test]
    fn a_stop_string_is_never_released_even_across_tokens() {
        let model = vocab_model();
        let mut tail = TextTail::new(model.vocab(), Special::Plain, &["END"]);
        let (pieces, stopped) = run(&mut tail, &bytes("xyEN_ENDzz"));
        assert_eq!(stopped.as_deref(), Some("END"));
        // "E" and "EN" are held while they could start the stop string;
        // "EN_" cannot, and goes out at once.
        assert_eq!(pieces, ["x", "y", "", "", "EN_", "", "", ""]);
        // The stop string's end drops the held text: there is nothing to flush.
        tail.flush();
        assert_eq!(tail.released(), "");
    }

    #[test]
    fn flushing_releases_what_is_held_and_marks_an_unfinished_character() {
        let model = vocab_model();
        let mut tail = TextTail::new(model.vocab(), Special::Plain, &["abc"]);
        let mut tokens = bytes("ab");
        tokens.push(bytes("é")[0]);
        let (pieces, stopped) = run(&mut tail, &tokens);
        assert_eq!((pieces.concat(), stopped), (String::new(), None));
        assert_eq!(tail.incomplete_utf8(), 1);
        tail.flush();
        assert_eq!(tail.take_released(), "ab\u{FFFD}");
        assert_eq!(tail.incomplete_utf8(), 0);
    }

    #[test]
    fn discarding_drops_what_is_held() {
        let model = vocab_model();
        let mut tail = TextTail::new(model.vocab(), Special::Plain, &["abc"]);
        run(&mut tail, &bytes("ab"));
        tail.discard();
        tail.flush();
        assert_eq!(tail.released(), "");
    }

    #[test]
    fn buffers_reused_for_another_run_start_empty_with_its_stops() {
        let model = vocab_model();
        let mut tail = TextTail::new(model.vocab(), Special::Plain, &["zz"]);
        run(&mut tail, &bytes("az"));
        let mut next = TextTail::reusing(tail.take_buffers(), model.vocab(), Special::Markup, &["q"]);
        assert_eq!(next.released(), "");
        let mut tokens = vec![Token(TINY_CONTROL_TOKEN_ID)];
        tokens.extend(bytes("zzq"));
        let (pieces, stopped) = run(&mut next, &tokens);
        assert_eq!(stopped.as_deref(), Some("q"));
        assert_eq!(pieces.concat(), format!("{TINY_CONTROL_TOKEN}zz"));
    }
}
