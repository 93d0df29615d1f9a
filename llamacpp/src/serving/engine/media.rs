//! Images and audio in engine requests (feature `mtmd`).
//!
//! A request's media are tokenized at submit, each alone, by the engine's
//! projector: the text tokens around it (the model's image delimiters)
//! go into the prompt, and its embeddings take a run of placeholder
//! tokens there, one per embedding, so that everything that works on a
//! sequence's tokens (cell accounting, the prefix index, sharing,
//! preemption) works unchanged. Placeholders are negative (no vocabulary
//! has such ids) and derived from the medium's id (the SHA-256 of its
//! pixels, samples or file): two prompts share a cached prefix through a
//! medium only when the media are identical, and a shared prefix never
//! ends inside one ([`media_boundary`]). The worker decodes a medium's
//! run whole, in a step of its own before the step's batch
//! ([`EngineMedia::decode`]).
//!
//! Feature-only state lives in the types here; without `mtmd` they are
//! empty and no request has media.

use crate::types::Token;

/// Whether `token` stands for one embedding of a medium.
pub(crate) fn is_placeholder(token: Token) -> bool {
    token.0 < 0
}

/// `len` (a prefix of `tokens` another sequence holds), moved back to the
/// start of the medium it would cut: a medium is decoded whole (an image
/// the model attends to at once cannot be resumed halfway).
pub(crate) fn media_boundary(tokens: &[Token], mut len: usize) -> usize {
    if len == 0 || len >= tokens.len() || !is_placeholder(tokens[len]) {
        return len;
    }
    while len > 0 && is_placeholder(tokens[len - 1]) {
        len -= 1;
    }
    len
}

#[cfg(feature = "mtmd")]
mod on;
#[cfg(feature = "mtmd")]
pub(crate) use on::{Attached, EngineMedia, MediaConfig, Spans};

#[cfg(not(feature = "mtmd"))]
mod off;
#[cfg(not(feature = "mtmd"))]
pub(crate) use off::{Attached, EngineMedia, MediaConfig, Spans};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_prefix_never_ends_inside_a_medium() {
        let t = |v: &[i32]| v.iter().map(|&x| Token(x)).collect::<Vec<_>>();
        let tokens = t(&[1, 2, -5, -6, -7, 3, -8, -9]);
        assert_eq!(media_boundary(&tokens, 0), 0);
        assert_eq!(media_boundary(&tokens, 2), 2, "before the medium");
        assert_eq!(media_boundary(&tokens, 3), 2, "inside it");
        assert_eq!(media_boundary(&tokens, 4), 2, "inside it");
        assert_eq!(media_boundary(&tokens, 5), 5, "after it");
        assert_eq!(media_boundary(&tokens, 7), 6, "inside the second");
        assert_eq!(media_boundary(&tokens, 8), 8, "the whole prompt");
    }
}
