//! The interface between the load driver and a serving backend.
//!
//! A backend runs one request at a time per call, blocking, and is called
//! from many threads at once (the driver runs every request on its own
//! `std::thread`), so it must be `Sync`. To plug in another backend (the
//! in-process engine in `engine.rs`), implement [`Backend`] and select it in
//! `main.rs` (see `BackendKind::Engine` there).

use std::time::Instant;

/// What a backend can tell about a finished request besides the arrival
/// times it already reported through `on_token`. Both fields are optional
/// cross-checks; the driver's numbers come from the `on_token` calls only.
#[derive(Debug, Default, Clone)]
pub struct Completion {
    /// How many tokens the backend says it generated.
    pub reported_tokens: Option<usize>,
    /// How many prompt tokens were taken from a cache instead of evaluated.
    pub cached_prompt_tokens: Option<usize>,
}

/// A serving backend under test.
///
/// The contract, the same for every backend so that the numbers compare:
/// * the prompt is token ids, used as they are (it already starts with BOS;
///   add nothing);
/// * greedy decoding (top-k 1), and generation does not stop at
///   end-of-generation tokens: exactly `n_predict` tokens come back;
/// * prompt caching on (a request may reuse a cached prefix of its prompt);
/// * `on_token` is called once per generated token, in order, as soon as
///   the token is available to the caller, with the time it arrived (a
///   chunk that carries k tokens makes k calls with the same time);
/// * every wait inside is bounded: `run` returns (with `Err` if need be)
///   within the backend's request timeout.
pub trait Backend: Sync {
    /// A short name for the output (`llama-server`, `engine`).
    fn name(&self) -> &str;

    /// Runs one request to completion.
    fn run(&self, prompt: &[i32], n_predict: usize, on_token: &mut dyn FnMut(Instant)) -> Result<Completion, String>;
}
