//! Images and audio in engine requests (feature `mtmd`).
//!
//! A request's media are tokenized at submit, each alone, by the engine's
//! projector: the text tokens around it (the model's image delimiters)
//! go into the prompt, and its embeddings take a run of placeholder
//! tokens there ([`crate::text::placeholder`]), so that cell accounting,
//! the prefix index, sharing and preemption work unchanged. The worker
//! decodes a medium's run whole, in a step of its own before the step's
//! batch ([`EngineMedia::decode`]).
//!
//! Feature-only state lives in the types here; without `mtmd` they are
//! empty and no request has media.

pub(crate) use crate::text::placeholder::{is_placeholder, media_boundary};

#[cfg(feature = "mtmd")]
mod on;
#[cfg(feature = "mtmd")]
pub(crate) use on::{Attached, EngineMedia, MediaConfig, Spans};

#[cfg(not(feature = "mtmd"))]
mod off;
#[cfg(not(feature = "mtmd"))]
pub(crate) use off::{Attached, EngineMedia, MediaConfig, Spans};
