//! Streaming text out of tokens without splitting UTF-8 characters.

use super::{Special, Token, Vocab};
use crate::error::Result;

/// Turns a stream of tokens into text without ever splitting a UTF-8
/// character: bytes of an unfinished character are held back until the
/// token that completes it arrives.
#[derive(Debug)]
pub struct Detokenizer<'v> {
    vocab: &'v Vocab,
    pending: Vec<u8>,
    special: Special,
    /// The text [`Detokenizer::piece`] hands out.
    out: String,
}

impl<'v> Detokenizer<'v> {
    /// A detokenizer that renders control tokens as their text with
    /// [`Special::Markup`], as nothing with [`Special::Plain`].
    pub fn new(vocab: &'v Vocab, special: Special) -> Self {
        Detokenizer { vocab, pending: Vec::with_capacity(16), special, out: String::new() }
    }

    /// Adds a token and returns the text that is now complete (possibly
    /// empty), in a buffer the detokenizer reuses: no allocation per token.
    ///
    /// # Errors
    /// As [`Detokenizer::push`].
    pub fn piece(&mut self, token: Token) -> Result<&str> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let pushed = self.push(token, &mut out);
        self.out = out;
        pushed.map(|()| self.out.as_str())
    }

    /// Adds a token and appends the text that is now complete to `out`.
    /// Invalid byte sequences become U+FFFD.
    ///
    /// # Errors
    /// [`Error::InvalidToken`](crate::Error::InvalidToken) for an id outside the vocabulary.
    pub fn push(&mut self, token: Token, out: &mut String) -> Result<()> {
        self.vocab.append_piece(token, self.special, &mut self.pending)?;
        self.drain_complete(out);
        Ok(())
    }

    /// Adds a token and returns the text that is now complete (possibly
    /// empty).
    ///
    /// # Errors
    /// As [`Detokenizer::push`].
    pub fn push_str(&mut self, token: Token) -> Result<String> {
        let mut out = String::new();
        self.push(token, &mut out)?;
        Ok(out)
    }

    /// Bytes held back because they do not finish a character yet.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Flushes what is held back, replacing an unfinished character with U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    fn drain_complete(&mut self, out: &mut String) {
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: from_utf8 just said these bytes are valid.
                    out.push_str(std::str::from_utf8(&self.pending[consumed..consumed + valid]).unwrap_or_default());
                    consumed += valid;
                    match e.error_len() {
                        // An invalid sequence: replace it and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += bad;
                        }
                        // An unfinished character at the end: keep it.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..consumed);
    }
}
