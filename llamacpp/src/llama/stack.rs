//! Running llama.cpp calls whose stack use grows with their input.
//!
//! A few code paths in llama.cpp recurse once per input element, so a long
//! enough input overflows any fixed stack, and a stack overflow kills the
//! process (it cannot be caught):
//! - `std::regex` (libstdc++'s backtracking matcher recurses once per
//!   matched character), used by the pre-tokenizers that llama.cpp does
//!   not split by hand (deepseek-llm and others) and by lazy-grammar
//!   trigger patterns, which run over all text generated so far;
//! - the GBNF parser, once per nesting level of parentheses.
//!
//! Such calls go through [`with_stack`], which runs them on a helper thread
//! with a stack sized from the input when the input is larger than what
//! any caller's thread can be assumed to have (a spawned Rust thread has
//! 2 MiB by default). The stack is reserved address space: pages are only
//! committed as the recursion touches them.
//!
//! The stack estimates per input element live beside their inputs (the
//! grammar's in the sampler module), except [`REGEX_STACK_PER_BYTE`], which
//! both the vocabulary and the samplers use. The kept helper thread is a
//! [`CallThread`] of `crate::llama::thread`.

use crate::error::{Error, Result};
use crate::llama::thread::{CallThread, OnDrop};

/// Inputs needing at most this much stack run on the caller's thread.
/// Rust's spawned threads (and tokio's workers) get 2 MiB, the main thread
/// 8 MiB: this leaves the caller at least 1.5 MiB for its own frames.
const INLINE_STACK: usize = 512 << 10;

/// Headroom added on top of the estimate for the code around the
/// recursion.
const HEADROOM: usize = 4 << 20;

/// The largest stack requested for one call (a reservation of address
/// space, not memory). Inputs that would need more are refused.
pub(crate) const MAX_STACK: usize = 16 << 30;

/// Stack bytes per byte of text matched by a `std::regex`; measured 327
/// on x86-64 (libstdc++'s matcher, with deepseek-llm's regex
/// pre-tokenizer: 3,203 characters survive a 1 MiB stack), times 4 for
/// other compilers and targets. Used for the regex pre-tokenizers
/// (`crate::llama::vocab`) and lazy-grammar trigger patterns (the sampler module).
pub(crate) const REGEX_STACK_PER_BYTE: usize = 4 * 330;

/// Runs `f`, on a helper thread with a stack of at least `needed` bytes
/// when that is more than [`INLINE_STACK`]. A panic in `f` is resumed in
/// the caller.
///
/// # Errors
/// [`Error::InputTooLarge`] if `needed` exceeds [`MAX_STACK`] or the
/// thread cannot be created (no address space for its stack).
pub(crate) fn with_stack<R: Send>(what: &'static str, needed: usize, f: impl FnOnce() -> R + Send) -> Result<R> {
    let Some(size) = helper_stack(what, needed)? else {
        return Ok(f());
    };
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("llama-deep-stack".into())
            .stack_size(size)
            .spawn_scoped(scope, f)
            .map_err(|_| too_large(what))?;
        match handle.join() {
            Ok(r) => Ok(r),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    })
}

/// A helper thread with a large stack, kept for repeated calls (a
/// sampler's grammar runs on every token): spawning a thread per call
/// costs a new mapping and fresh page faults for the stack each time
/// (measured: about 1 ms per call at 5 MiB), a kept thread only a channel
/// round trip.
#[derive(Default)]
pub(crate) struct DeepStack {
    /// The thread and its stack size.
    worker: Option<(CallThread, usize)>,
}

impl std::fmt::Debug for DeepStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeepStack").field("stack", &self.worker.as_ref().map(|w| w.1)).finish()
    }
}

impl DeepStack {
    /// As [`with_stack`], on this helper's thread (created, or replaced by
    /// a larger one, as `needed` requires).
    ///
    /// # Errors
    /// As [`with_stack`].
    pub(crate) fn run<R: Send>(
        &mut self,
        what: &'static str,
        needed: usize,
        f: impl FnOnce() -> R + Send,
    ) -> Result<R> {
        let Some(size) = helper_stack(what, needed)? else {
            return Ok(f());
        };
        if self.worker.as_ref().is_none_or(|w| w.1 < size) {
            self.worker = None;
            let worker =
                CallThread::spawn("llama-deep-stack", Some(size), OnDrop::Join).map_err(|_| too_large(what))?;
            self.worker = Some((worker, size));
        }
        let (worker, _) = self.worker.as_ref().unwrap_or_else(|| unreachable!("spawned above"));
        match worker.call(f) {
            Some(Ok(r)) => Ok(r),
            Some(Err(payload)) => std::panic::resume_unwind(payload),
            None => {
                self.worker = None;
                Err(too_large(what))
            }
        }
    }
}

/// The stack of the helper thread for a call that needs `needed` bytes:
/// `None` to run it inline; otherwise headroom added and rounded to a power
/// of two, so that a kept helper grows in few steps.
fn helper_stack(what: &'static str, needed: usize) -> Result<Option<usize>> {
    if needed <= INLINE_STACK {
        return Ok(None);
    }
    if needed > MAX_STACK {
        return Err(too_large(what));
    }
    Ok(Some(needed.saturating_add(HEADROOM).checked_next_power_of_two().unwrap_or(usize::MAX)))
}

fn too_large(what: &'static str) -> Error {
    Error::InputTooLarge { what, limit: MAX_STACK }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recursion that needs about `depth` KiB of stack.
    fn recurse(depth: usize) -> usize {
        let frame = std::hint::black_box([0u8; 1024]);
        if depth == 0 { frame[0] as usize } else { recurse(depth - 1) + std::hint::black_box(frame[1]) as usize }
    }

    #[test]
    fn small_inputs_run_inline_and_large_ones_get_a_big_stack() {
        let me = std::thread::current().id();
        assert_eq!(with_stack("test", 1024, || std::thread::current().id()).unwrap(), me);
        assert_ne!(with_stack("test", 64 << 20, || std::thread::current().id()).unwrap(), me);
        // At least 8 MiB of frames: fatal on a 2 MiB test thread, fine here.
        assert_eq!(with_stack("test", 40 << 20, || recurse(8 * 1024)).unwrap(), 0);
    }

    #[test]
    fn a_kept_helper_runs_borrowing_jobs_and_grows() {
        let mut deep = DeepStack::default();
        let me = std::thread::current().id();
        assert_eq!(deep.run("test", 1024, || std::thread::current().id()).unwrap(), me);
        let mut data = vec![1, 2, 3];
        let first = deep.run("test", 8 << 20, || {
            data.push(4);
            std::thread::current().id()
        });
        let first = first.unwrap();
        assert_ne!(first, me);
        assert_eq!(data, [1, 2, 3, 4]);
        // The same thread serves the next call of the same size...
        assert_eq!(deep.run("test", 8 << 20, || std::thread::current().id()).unwrap(), first);
        // ...and a larger one replaces it.
        assert_eq!(deep.run("test", 40 << 20, || recurse(8 * 1024)).unwrap(), 0);
        // A panic comes back to the caller and the helper keeps working.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            deep.run("test", 8 << 20, || panic!("in the helper"))
        }));
        assert_eq!(caught.unwrap_err().downcast_ref::<&str>(), Some(&"in the helper"));
        assert_eq!(deep.run("test", 8 << 20, || 7).unwrap(), 7);
        let err = deep.run("big", MAX_STACK + 1, || ()).unwrap_err();
        assert!(matches!(err, Error::InputTooLarge { what: "big", .. }), "{err:?}");
    }

    #[test]
    fn oversized_requests_are_refused_and_panics_resume() {
        let err = with_stack("test input", MAX_STACK + 1, || ()).unwrap_err();
        assert!(matches!(err, Error::InputTooLarge { what: "test input", .. }), "{err:?}");
        let caught = std::panic::catch_unwind(|| with_stack("test", 8 << 20, || panic!("inner")));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"inner"));
    }
}
