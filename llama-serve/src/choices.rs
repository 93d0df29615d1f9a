//! From an OpenAI request to engine requests and back: sampling fields to
//! [`SamplingParams`], `n` choices as `n` engine requests (the later ones
//! share the first one's prompt cells), and the engine's events to choices
//! (collected, or as a stream of indexed deltas).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;
use futures::{Stream, StreamExt};
use llamacpp::chat::{ChatParser, Reply, ReplyReader};
use llamacpp::constraint::Constraint;
use llamacpp::engine::{Completion, Engine, Event, Finish, Request, SamplingParams, Speculation, TokenLogprob};
use llamacpp::generate::FinishReason;
use llamacpp::{Error, Special, Token, Vocab};

use crate::openai::{ApiError, Sampling, Usage};

/// At most this many choices per request (`n`, times the prompts of a
/// completion request).
pub const MAX_CHOICES: usize = 16;

/// The engine's error as an HTTP error.
pub fn engine_error(e: Error) -> ApiError {
    match e {
        Error::QueueFull { capacity } => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, format!("the server is busy ({capacity} requests waiting)"))
                .code("queue_full")
                .retry_after(1)
        }
        Error::EngineStopped(m) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the engine has stopped: {m}"))
        }
        Error::InvalidToken { .. } => ApiError::bad_request(e.to_string()).param("prompt"),
        Error::Grammar(_) | Error::JsonSchema { .. } => ApiError::bad_request(e.to_string()).param("response_format"),
        Error::ChatTemplate(_) | Error::ChatTemplateRaised(_) | Error::ChatMarkup(_) => {
            ApiError::bad_request(e.to_string()).param("messages")
        }
        Error::InvalidParameter { name, .. } => ApiError::bad_request(e.to_string()).param(name),
        // A medium the projector refuses, an image that does not fit a
        // micro-batch, media where the server takes none.
        Error::Media(_) | Error::InvalidBatch(_) | Error::Unsupported(_) => {
            ApiError::bad_request(e.to_string()).param("messages")
        }
        Error::CannotSpeculate(_) => ApiError::bad_request(e.to_string()).param("speculative"),
        Error::InvalidArgument(_)
        | Error::EmptyPrompt
        | Error::PromptTooLong { .. }
        | Error::OutOfRange { .. }
        | Error::InputTooLarge { .. }
        | Error::Nul(_) => ApiError::bad_request(e.to_string()),
        e => ApiError::internal(e),
    }
}

/// OpenAI's finish reasons: `stop` (a stop string or the end of
/// generation), `length` (max_tokens or the context); an engine failure is
/// an error instead.
pub fn finish_reason(reason: &FinishReason) -> Result<&'static str, ApiError> {
    match reason {
        FinishReason::Stop(_) | FinishReason::EndOfGeneration => Ok("stop"),
        FinishReason::Length | FinishReason::ContextFull => Ok("length"),
        FinishReason::Cancelled => Ok("cancelled"),
        FinishReason::Shutdown => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server shut down before the request finished"))
        }
        FinishReason::Failed(m) => Err(ApiError::internal(format!("generation failed: {m}"))),
        other => Err(ApiError::internal(format!("generation ended: {other}"))),
    }
}

/// The stop string a choice ended at, if it did.
pub fn stop_string(reason: &FinishReason) -> Option<String> {
    match reason {
        FinishReason::Stop(s) => Some(s.clone()),
        _ => None,
    }
}

static SEEDS: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

/// A seed for a request that gave none: different per request.
fn fresh_seed() -> u32 {
    let x = SEEDS.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    ((x ^ (x >> 29)) as u32) ^ nanos
}

/// The engine's sampling for choice `choice` (seeds differ per choice, so
/// `n` sampled choices differ). `constraint` is llguidance's
/// (`response_format`, forced tool calls); without one, the `grammar`
/// extension field is a GBNF grammar for llama.cpp's sampler.
/// `request` with the client's `speculative` choice, if it made one
/// (`spec`: the server's settings for it).
pub fn with_speculation(request: Request, s: &Sampling, spec: Speculation) -> Request {
    match s.speculative {
        Some(on) => request.speculation(on.then_some(spec)),
        None => request,
    }
}

pub fn sampling_params(
    s: &Sampling,
    vocab: &Vocab,
    top_logprobs: Option<usize>,
    constraint: Option<&Constraint>,
    choice: usize,
) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams::greedy()
        .temperature(s.temperature.unwrap_or(1.0))
        .top_p(s.top_p.unwrap_or(1.0))
        .penalties(
            64,
            s.repeat_penalty.unwrap_or(1.0),
            s.frequency_penalty.unwrap_or(0.0),
            s.presence_penalty.unwrap_or(0.0),
        )
        .seed(s.seed.map_or_else(fresh_seed, |seed| seed.wrapping_add(choice as u32)));
    if let Some(k) = s.top_k {
        p = p.top_k(k);
    }
    if let Some(m) = s.min_p {
        p = p.min_p(m);
    }
    if let Some(bias) = &s.logit_bias {
        let mut list = Vec::with_capacity(bias.len());
        for (key, &b) in bias {
            let id: i32 = key.parse().map_err(|_| {
                ApiError::bad_request(format!("logit_bias key {key:?} is not a token id")).param("logit_bias")
            })?;
            let token = vocab.check(Token(id)).map_err(|e| ApiError::bad_request(e.to_string()).param("logit_bias"))?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::bad_request(format!("logit_bias {b} is outside [-100, 100]")).param("logit_bias"));
            }
            list.push((token, b));
        }
        p = p.logit_bias(list);
    }
    match (constraint, &s.grammar) {
        (Some(c), _) => p = p.constraint(c.clone()),
        (None, Some(g)) => p = p.grammar(g.clone()),
        (None, None) => {}
    }
    if let Some(top) = top_logprobs {
        p = p.logprobs(top);
    }
    Ok(p)
}

/// One choice as it is collected.
#[derive(Debug, Default)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<(Token, TokenLogprob)>,
    pub finish_reason: &'static str,
    /// The stop string it ended at, if it did.
    pub stop: Option<String>,
    pub usage: Usage,
    /// The engine's end of it.
    pub end: Option<Finish>,
}

impl Choice {
    /// The choice read as a chat reply by `parser`'s formats: thoughts,
    /// text and tool calls (with their ids), the one fold of the library
    /// ([`ReplyReader`]).
    pub fn reply(&self, parser: ChatParser) -> Reply {
        let mut reader = ReplyReader::new(parser);
        reader.push(&self.text);
        if let Some(end) = &self.end {
            reader.finish(end.reason.clone(), end.usage);
        }
        reader.into_reply()
    }
}

/// Submits `requests` (one per choice). The first is submitted first, so
/// the others, with the same prompt, share its cells.
pub fn submit_all(engine: &Engine, requests: Vec<Request>) -> Result<Vec<Completion>, ApiError> {
    if requests.len() > MAX_CHOICES {
        return Err(ApiError::bad_request(format!("at most {MAX_CHOICES} choices per request")).param("n"));
    }
    requests.into_iter().map(|r| engine.submit(r).map_err(engine_error)).collect()
}

/// Waits for every choice (concurrently: they run in the same steps).
pub async fn collect(completions: Vec<Completion>) -> Result<Vec<Choice>, ApiError> {
    let choices = futures::future::join_all(completions.into_iter().map(collect_one)).await;
    choices.into_iter().collect()
}

async fn collect_one(mut completion: Completion) -> Result<Choice, ApiError> {
    let mut choice = Choice::default();
    while let Some(event) = StreamExt::next(&mut completion).await {
        match event {
            Event::Piece(p) => {
                choice.text.push_str(&p.text);
                if let (Some(t), Some(lp)) = (p.token, p.logprob) {
                    choice.logprobs.push((t, lp));
                }
            }
            Event::Done(f) => {
                choice.finish_reason = finish_reason(&f.reason)?;
                choice.stop = stop_string(&f.reason);
                choice.usage = f.usage.into();
                choice.end = Some(f);
                return Ok(choice);
            }
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine ended a request without a final event"))
}

/// What a streamed choice yields.
#[derive(Debug)]
pub enum Delta {
    Piece { text: String, logprob: Option<TokenLogprob> },
    Done(Result<Finish, ApiError>),
}

/// Every choice's events as one stream of `(choice index, delta)`, in the
/// order they arrive. Dropping it drops the completions, which cancels
/// them (a client that disconnects frees its cells).
pub fn merged(completions: Vec<Completion>) -> impl Stream<Item = (usize, Delta)> + Send {
    let streams = completions.into_iter().enumerate().map(|(i, c)| {
        StreamExt::map(c, move |event| match event {
            Event::Piece(p) => (i, Delta::Piece { text: p.text, logprob: p.logprob }),
            Event::Done(f) => (i, Delta::Done(finish_reason(&f.reason).map(|_| f))),
        })
    });
    futures::stream::select_all(streams)
}

/// The usage of choices in groups of `n` per prompt: each prompt counted
/// once (as its first choice saw it), the completions summed.
pub fn combined_usage(usages: impl IntoIterator<Item = Usage>, n: usize) -> Usage {
    let mut total = Usage::default();
    for (i, u) in usages.into_iter().enumerate() {
        if i % n.max(1) == 0 {
            total.prompt_tokens += u.prompt_tokens;
            total.prompt_tokens_details.cached_tokens += u.prompt_tokens_details.cached_tokens;
        }
        total.completion_tokens += u.completion_tokens;
        total.completion_tokens_details.accepted_prediction_tokens +=
            u.completion_tokens_details.accepted_prediction_tokens;
        total.completion_tokens_details.rejected_prediction_tokens +=
            u.completion_tokens_details.rejected_prediction_tokens;
    }
    total.total_tokens = total.prompt_tokens + total.completion_tokens;
    total
}

/// A token's text for logprob entries (bytes that are not UTF-8 on their
/// own, such as part of a character, come out as U+FFFD).
pub fn token_text(vocab: &Vocab, token: Token) -> (String, Vec<u8>) {
    let bytes = vocab.token_to_piece(token, Special::Plain).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_cannot_speculate_is_a_bad_request_naming_the_field() {
        let e = engine_error(Error::CannotSpeculate("a recurrent or hybrid model's cache cannot drop its last tokens"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("speculative"));
        assert!(e.message.contains("recurrent"), "{}", e.message);
    }
}
