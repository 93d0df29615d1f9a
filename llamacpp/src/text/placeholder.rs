//! Media in a sequence of tokens: a medium's embeddings take a run of
//! placeholder tokens, one per embedding, so that everything that works on
//! a sequence's tokens (prefix reuse, cell accounting, sharing between
//! sequences) works unchanged. Placeholders are negative (no vocabulary
//! has such ids) and derived from the medium's id (the SHA-256 of its
//! pixels, samples or file): two prompts share a cached prefix through a
//! medium only when the media are identical, and a shared prefix never
//! ends inside one ([`media_boundary`]). The engine's requests and a
//! [`Conversation`](crate::chat::Conversation) with a projector use them.

use crate::llama::types::Token;

/// Whether `token` stands for one embedding of a medium.
pub(crate) fn is_placeholder(token: Token) -> bool {
    token.0 < 0
}

/// `len` (a prefix of `tokens` another sequence or an earlier run holds),
/// moved back to the start of the medium it would cut: a medium is decoded
/// whole (an image the model attends to at once cannot be resumed halfway).
pub(crate) fn media_boundary(tokens: &[Token], mut len: usize) -> usize {
    if len == 0 || len >= tokens.len() || !is_placeholder(tokens[len]) {
        return len;
    }
    while len > 0 && is_placeholder(tokens[len - 1]) {
        len -= 1;
    }
    len
}

/// `n` placeholder tokens for the medium `id`: negative, and different
/// for different media (the id is a SHA-256; the tokens are a splitmix64
/// stream seeded by its first 64 bits).
#[cfg_attr(not(feature = "mtmd"), allow(dead_code))]
pub(crate) fn placeholders(id: &str, n: usize) -> impl Iterator<Item = Token> {
    let seed = id.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0);
    (0..n as u64).map(move |i| {
        let mut z = seed.wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Token(-1 - (z & 0x3FFF_FFFF) as i32)
    })
}

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

    #[test]
    fn placeholders_are_negative_and_depend_on_the_medium() {
        let a: Vec<Token> = placeholders("00112233445566778899", 64).collect();
        let b: Vec<Token> = placeholders("00112233445566770000", 64).collect();
        let c: Vec<Token> = placeholders("10112233445566778899", 64).collect();
        assert!(a.iter().all(|&t| is_placeholder(t)));
        assert_eq!(a, b, "only the first 64 bits of the id seed them");
        assert!(a.iter().zip(&c).all(|(x, y)| x != y), "another medium differs at every position");
    }
}
