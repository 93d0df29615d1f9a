//! Images and audio in a conversation: the media parts of its messages
//! ([`media_parts`]), and their places in the prompt
//! ([`ChatPrompt::media_at`](super::ChatPrompt::media_at)).
//!
//! Before rendering, [`ChatFormat::prompt`](super::ChatFormat::prompt)
//! replaces each media part with a text part holding one noncharacter,
//! U+FDD2, which no caller's string may hold: the template renders it
//! where the image goes, and tokenizing cuts the text there, so the place
//! is a token index. (llama-server renders a marker text the same way;
//! libmtmd then puts the model's image delimiters around each medium.)

use std::borrow::Cow;

use serde_json::Value;

use crate::error::{Error, Result};

/// Stands for a medium in the rendered text.
pub(crate) const MEDIA: char = '\u{FDD2}';

/// A medium of a conversation, in the shape its message part gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MediaPart {
    /// An image by URL (`{"type": "image_url", "image_url": {"url": …}}`):
    /// a `data:` URL holds the file itself.
    Image {
        /// The URL.
        url: String,
    },
    /// An audio clip (`{"type": "input_audio", "input_audio": {"data":
    /// <base64>, "format": "wav"}}`).
    Audio {
        /// The file, base64.
        data: String,
        /// Its format (`wav`, `mp3`).
        format: String,
    },
}

/// The media parts of `messages` (OpenAI-style message objects), in the
/// order their places take in the prompt.
///
/// # Errors
/// [`Error::InvalidArgument`] for a media part without its URL or data.
pub fn media_parts(messages: &Value) -> Result<Vec<MediaPart>> {
    let mut out = Vec::new();
    for part in parts(messages) {
        match part_kind(part) {
            Some("image_url") => {
                let url = match part.get("image_url") {
                    Some(Value::String(url)) => url,
                    Some(object) => object.get("url").and_then(Value::as_str).unwrap_or_default(),
                    None => "",
                };
                if url.is_empty() {
                    return Err(Error::InvalidArgument("an image_url part without its url".into()));
                }
                out.push(MediaPart::Image { url: url.to_owned() });
            }
            Some("input_audio") => {
                let audio = part.get("input_audio");
                let field = |name: &str| audio.and_then(|a| a.get(name)).and_then(Value::as_str).unwrap_or_default();
                if field("data").is_empty() {
                    return Err(Error::InvalidArgument("an input_audio part without its data".into()));
                }
                out.push(MediaPart::Audio { data: field("data").to_owned(), format: field("format").to_owned() });
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Every part of every message's content list, in order.
fn parts(messages: &Value) -> impl Iterator<Item = &Value> {
    messages.as_array().into_iter().flatten().filter_map(|m| m.get("content").and_then(Value::as_array)).flatten()
}

fn part_kind(part: &Value) -> Option<&str> {
    part.get("type").and_then(Value::as_str).filter(|t| matches!(*t, "image_url" | "input_audio"))
}

/// `messages` with each media part a text part holding [`MEDIA`], and
/// how many there were.
///
/// # Errors
/// [`Error::ChatMarkup`] for a caller's string that holds U+FDD2.
pub(crate) fn substitute(messages: &Value) -> Result<(Cow<'_, Value>, usize)> {
    check_strings(messages)?;
    let n = parts(messages).filter(|p| part_kind(p).is_some()).count();
    if n == 0 {
        return Ok((Cow::Borrowed(messages), 0));
    }
    let mut out = messages.clone();
    for message in out.as_array_mut().into_iter().flatten() {
        let Some(list) = message.get_mut("content").and_then(Value::as_array_mut) else { continue };
        for part in list.iter_mut() {
            if part_kind(part).is_some() {
                *part = serde_json::json!({"type": "text", "text": MEDIA.to_string()});
            }
        }
    }
    Ok((Cow::Owned(out), n))
}

fn check_strings(value: &Value) -> Result<()> {
    match value {
        Value::String(s) if s.contains(MEDIA) => Err(Error::ChatMarkup(
            "a message holds U+FDD2, the noncharacter that stands for an image or audio part".into(),
        )),
        Value::Array(items) => items.iter().try_for_each(check_strings),
        Value::Object(map) => map.values().try_for_each(check_strings),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn media_parts_are_found_in_order_and_replaced_by_their_mark() {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
                {"type": "image_url", "image_url": "https://example.com/b.jpg"},
            ]},
        ]);
        assert_eq!(
            media_parts(&messages).unwrap(),
            [
                MediaPart::Image { url: "data:image/png;base64,AAAA".into() },
                MediaPart::Audio { data: "UklG".into(), format: "wav".into() },
                MediaPart::Image { url: "https://example.com/b.jpg".into() },
            ]
        );
        let (out, n) = substitute(&messages).unwrap();
        assert_eq!(n, 3);
        assert_eq!(out[1]["content"][1], json!({"type": "text", "text": "\u{FDD2}"}));
        assert_eq!(out[1]["content"][0], messages[1]["content"][0]);

        let sneaky = json!([{"role": "user", "content": "an image here: \u{FDD2}"}]);
        assert!(matches!(substitute(&sneaky), Err(Error::ChatMarkup(_))));
        let empty = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]);
        assert!(matches!(media_parts(&empty), Err(Error::InvalidArgument(_))));
    }
}
