//! Streaming generation: prompt in, text pieces out.
//!
//! A [`Session`] remembers which tokens are in the KV cache of one
//! sequence, so a later prompt that starts the same way only decodes what
//! is new (the prompt cache of llama.cpp's `completion` tool and server).
//! [`Session::generate`] returns a [`Generation`]: an iterator of text
//! pieces that
//!
//! * prefills the prompt in chunks of the context's `n_batch`, asking for
//!   logits on the last prompt token only;
//! * samples with [`Sampler::sample`](crate::Sampler::sample) and decodes one token at a time,
//!   reusing one [`Batch`](crate::Batch) and one output `String` (the allocation-free
//!   [`Generation::next_piece`] hands out `&str`; the [`Iterator`]
//!   implementation copies each piece into a new `String`);
//! * yields only whole UTF-8 characters ([`Detokenizer`](crate::Detokenizer));
//! * never yields any part of a stop string, even one split across tokens
//!   ([`StopMatcher`]);
//! * stops at end-of-generation tokens, after `max_tokens`, at a stop
//!   string, when cancelled through the context's [`AbortHandle`](crate::AbortHandle), or when
//!   the context is full (or shifts it, see [`Overflow`]);
//! * measures itself ([`GenerationStats`]).
//!
//! [`Model::complete`](crate::Model::complete) and [`Model::chat`](crate::Model::chat)
//! run one whole generation in a context of their own and return its text
//! ([`CompleteOptions`], [`Completed`]).
//!
//! ```no_run
//! use llamacpp::generate::{GenerateOptions, Session};
//! use llamacpp::{AddBos, ContextParams, Model, ModelParams, Sampler};
//!
//! # fn main() -> Result<(), llamacpp::Error> {
//! let model = Model::load("gemma-3-270m-q4_k_m.gguf", &ModelParams::default())?;
//! let mut ctx = model.new_context(&ContextParams::default())?;
//! let mut sampler = Sampler::greedy();
//! let prompt = model.vocab().tokenize("The capital of France is", AddBos::Yes)?;
//!
//! let mut session = Session::new();
//! let options = GenerateOptions::default().max_tokens(32).stop(["\n"]);
//! let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options)?;
//! while let Some(piece) = generation.next_piece() {
//!     print!("{}", piece?);
//! }
//! eprintln!("\n{}", generation.stats());
//! # Ok(())
//! # }
//! ```

mod complete;
mod options;
pub(crate) mod session;
mod stop;
pub(crate) mod text_tail;

pub use crate::llama::types::FinishReason;
pub use complete::{CompleteOptions, Completed, DEFAULT_MAX_TOKENS};
pub use options::{GenerateOptions, GenerationStats, Overflow, Usage};
pub use session::{Generation, Session};
pub(crate) use stop::check_stops;
pub use stop::{MAX_STOP_BYTES, MAX_STOPS, StopMatcher, stop_holdback};
