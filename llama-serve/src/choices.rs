//! The engine's side of every API: a request's sampling fields to
//! [`SamplingParams`], `n` choices as `n` engine requests (the later ones
//! share the first one's prompt cells), and the engine's events back to
//! choices (collected, or as one stream of indexed deltas), with their
//! finish reasons and usage.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;
use futures::{Stream, StreamExt};
use llamacpp::chat::{ChatParser, Reply, ReplyReader};
use llamacpp::constraint::Constraint;
use llamacpp::engine::{Completion, Engine, Event, Finish, Request, SamplingParams, Speculation, TokenLogprob};
use llamacpp::generate::FinishReason;
use llamacpp::{Special, Token, Vocab};

use crate::error::{ApiError, engine_error};
use crate::openai::Usage;
use crate::request::Sampling;

/// At most this many choices per request (`n`, times the prompts of a
/// completion request).
pub const MAX_CHOICES: usize = 16;

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

/// `request` with the client's `speculative` choice, if it made one
/// (`spec`: the server's settings for it).
pub fn with_speculation(request: Request, s: &Sampling, spec: Speculation) -> Request {
    match s.speculative {
        Some(on) => request.speculation(on.then_some(spec)),
        None => request,
    }
}

/// The engine's sampling for choice `choice` (seeds differ per choice, so
/// `n` sampled choices differ). `constraint` is llguidance's
/// (`response_format`, forced tool calls); without one, the `grammar`
/// extension field is a GBNF grammar for llama.cpp's sampler.
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
    /// A chat choice's reply ([`crate::respond`] reads it).
    pub reply: Option<Reply>,
}

impl Choice {
    /// The choice read as a chat reply by `parser`'s formats: thoughts,
    /// text and tool calls (with their ids), the one fold of the library
    /// ([`ReplyReader`]).
    pub fn read(&self, parser: ChatParser) -> Reply {
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

/// The usage of choices in groups of `n` per prompt (`None`: a choice
/// that failed): each prompt counted once, as the first of its choices
/// that finished saw it; the completions summed.
pub fn combined_usage(usages: &[Option<Usage>], n: usize) -> Usage {
    let mut total = Usage::default();
    for group in usages.chunks(n.max(1)) {
        for (k, mut u) in group.iter().flatten().copied().enumerate() {
            if k > 0 {
                u.prompt_tokens = 0;
                u.prompt_tokens_details.cached_tokens = 0;
            }
            total += u;
        }
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

    fn usage(prompt: usize, completion: usize) -> Usage {
        Usage { prompt_tokens: prompt, completion_tokens: completion, ..Usage::default() }
    }

    #[test]
    fn each_prompt_is_counted_once_even_when_its_first_choice_failed() {
        // Two prompts (10 and 20 tokens), two choices each.
        let all = [Some(usage(10, 3)), Some(usage(10, 4)), Some(usage(20, 5)), Some(usage(20, 6))];
        let u = combined_usage(&all, 2);
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.total_tokens), (30, 18, 48));
        let first_failed = [None, Some(usage(10, 4)), Some(usage(20, 5)), None];
        let u = combined_usage(&first_failed, 2);
        assert_eq!((u.prompt_tokens, u.completion_tokens), (30, 9));
    }
}
