//! What a request yields: its [`Event`]s through a [`Completion`] (an
//! iterator and a stream), each [`Piece`] of text as it is sampled, then
//! its [`Finish`]; or, waited for, its whole [`Answer`].

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use crate::llama::types::Token;
use crate::text::generate::{FinishReason, Usage};

/// One sampled token and the text it released.
///
/// A request yields one piece per sampled token, as soon as it is sampled,
/// except for the tokens of the last step (the one whose token ended the
/// request), which come in one final piece together with any text still
/// held back. The texts of a request's pieces, concatenated, are its
/// output: valid UTF-8, never containing (part of) a stop string. A
/// piece's text can be empty while its token's text is held back (an
/// unfinished character, or a possible start of a stop string); it is
/// released with a later piece. A final end-of-generation token is in no
/// piece.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Piece {
    /// The released text.
    pub text: String,
    /// The token sampled (`None` in a final piece of held-back text only).
    pub token: Option<Token>,
    /// The token's log-probability and the most likely alternatives, when
    /// the request asked for them ([`SamplingParams::logprobs`](crate::SamplingParams::logprobs)).
    pub logprob: Option<TokenLogprob>,
}

/// A sampled token's log-probability under the model, with the most
/// likely tokens at that position.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TokenLogprob {
    /// The sampled token.
    pub token: Token,
    /// Its natural-log probability (≤ 0).
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely
    /// first (as many as asked for; the sampled token is among them only
    /// if it ranks there).
    pub top: Vec<(Token, f32)>,
}

/// Latencies of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timings {
    /// From submit to admission into the pool.
    pub queued: Duration,
    /// From submit to the first sampled token (`None` if none was).
    pub time_to_first_token: Option<Duration>,
    /// Mean gap between consecutive tokens.
    pub inter_token_mean: Duration,
    /// Largest gap between consecutive tokens.
    pub inter_token_max: Duration,
    /// From submit to the end.
    pub total: Duration,
    /// Engine steps (decode calls) from submit to the first token.
    pub steps_to_first_token: Option<u64>,
    /// How often the request was preempted and recomputed.
    pub preemptions: u32,
}

/// The end of a request: why, and what it cost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Latencies.
    pub timings: Timings,
}

/// What a [`Completion`] yields: pieces of text, then exactly one
/// [`Event::Done`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Text and the tokens it came from.
    Piece(Piece),
    /// The request ended; no event follows.
    Done(Finish),
}

/// The output of one submitted request: a blocking [`Iterator`] and an
/// async [`Stream`](futures_core::Stream) of [`Event`]s, ending with
/// exactly one [`Event::Done`] (also when the engine stops).
///
/// Both traits have a `next` method: with `futures::StreamExt` in scope,
/// call the async one as `StreamExt::next(&mut completion).await`.
///
/// Dropping it cancels the request at the worker's next step; its KV cells
/// then become a cached prefix (or are freed when the prefix cache is off). Events wait in an unbounded channel, so a slow
/// reader never stalls the engine; a request buffers at most one piece
/// per generated token.
pub struct Completion {
    pub(super) id: u64,
    /// Boxed: the receiver's pending listener is not `Unpin`.
    pub(super) events: Pin<Box<async_channel::Receiver<Event>>>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) done: bool,
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("id", &self.id).field("done", &self.done).finish()
    }
}

/// The final event of a request whose worker went away without sending
/// one (a worker that panicked).
fn lost() -> Event {
    Event::Done(Finish {
        reason: FinishReason::Failed("the engine's worker stopped".into()),
        usage: Usage::default(),
        timings: Timings::default(),
    })
}

impl Completion {
    /// The request's id (unique within its engine, in submit order).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Asks the engine to end the request: it finishes with
    /// [`FinishReason::Cancelled`] at the next step, and the events up to
    /// then are still delivered.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    fn received(&mut self, received: std::result::Result<Event, ()>) -> Option<Event> {
        let event = received.unwrap_or_else(|()| lost());
        if matches!(event, Event::Done(_)) {
            self.done = true;
            self.events.close();
        }
        Some(event)
    }

    /// Waits for the whole answer: the text, the tokens and the finish.
    pub fn wait(self) -> Answer {
        let mut out = Answer {
            text: String::new(),
            tokens: Vec::new(),
            finish: Finish { reason: FinishReason::Cancelled, usage: Usage::default(), timings: Timings::default() },
        };
        for event in self {
            match event {
                Event::Piece(p) => {
                    out.text.push_str(&p.text);
                    out.tokens.extend(p.token);
                }
                Event::Done(f) => out.finish = f,
            }
        }
        out
    }
}

/// A request's whole answer ([`Completion::wait`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answer {
    /// The text.
    pub text: String,
    /// Every sampled token (a final end-of-generation token excluded).
    pub tokens: Vec<Token>,
    /// How it ended.
    pub finish: Finish,
}

impl Iterator for Completion {
    type Item = Event;

    /// Blocks until the next event.
    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let received = self.events.recv_blocking().map_err(|_| ());
        self.received(received)
    }
}

impl std::iter::FusedIterator for Completion {}

impl futures_core::Stream for Completion {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Event>> {
        if self.done {
            return Poll::Ready(None);
        }
        // The receiver registers the waker before reporting Pending.
        match futures_core::Stream::poll_next(self.events.as_mut(), cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(event) => Poll::Ready(self.received(event.ok_or(()))),
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
