//! Why a request, or the worker, ends: typed inside the engine, turned
//! into the public [`FinishReason`] and [`Error::EngineStopped`] text only
//! where they leave it.

use std::fmt;
use std::sync::Arc;

use crate::error::Error;
use crate::text::generate::FinishReason;

/// What went wrong: an error, kept whole (shared by the requests of one
/// failed decode), or a panic caught in the worker.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    Error(Arc<Error>),
    Panic(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(Arc::new(e))
    }
}

impl Failure {
    /// A caught panic, with its message when it has one.
    pub fn panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".into());
        Failure::Panic(message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => e.fmt(f),
            Failure::Panic(message) => write!(f, "the worker panicked: {message}"),
        }
    }
}

/// Why a request ends: [`FinishReason`], with a failure's error kept.
#[derive(Clone, Debug)]
pub(crate) enum Cause {
    Length,
    Stop(String),
    EndOfGeneration,
    Cancelled,
    ContextFull,
    Shutdown,
    Failed(Failure),
}

impl Cause {
    /// The public reason. `FinishReason::Failed` carries text (it is
    /// `Clone + Eq` and part of the API), so a failure becomes its message
    /// here, at the boundary.
    pub fn reason(&self) -> FinishReason {
        match self {
            Cause::Length => FinishReason::Length,
            Cause::Stop(stop) => FinishReason::Stop(stop.clone()),
            Cause::EndOfGeneration => FinishReason::EndOfGeneration,
            Cause::Cancelled => FinishReason::Cancelled,
            Cause::ContextFull => FinishReason::ContextFull,
            Cause::Shutdown => FinishReason::Shutdown,
            Cause::Failed(failure) => FinishReason::Failed(failure.to_string()),
        }
    }

    /// The `reason` label of the finished-requests series.
    pub fn label(&self) -> &'static str {
        match self {
            Cause::Length => "length",
            Cause::Stop(_) => "stop",
            Cause::EndOfGeneration => "eog",
            Cause::Cancelled => "cancelled",
            Cause::ContextFull => "context_full",
            Cause::Shutdown => "shutdown",
            Cause::Failed(_) => "failed",
        }
    }
}

/// Why the worker stopped serving: every handle went away or
/// [`Engine::shutdown`](super::super::Engine::shutdown) was called, or it
/// failed.
#[derive(Clone, Debug)]
pub(crate) enum Exit {
    Shutdown,
    Failed(Failure),
}

impl Exit {
    /// How the requests still in the worker end.
    pub fn cause(&self) -> Cause {
        match self {
            Exit::Shutdown => Cause::Shutdown,
            Exit::Failed(failure) => Cause::Failed(failure.clone()),
        }
    }
}

impl fmt::Display for Exit {
    /// The text of [`Error::EngineStopped`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Shutdown => f.write_str("shut down"),
            Exit::Failed(failure) => failure.fmt(f),
        }
    }
}
