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

impl MediaPart {
    /// The file the part holds: the payload of an image's `data:` URL
    /// (base64, of an `image/*` type or none), or the decoded clip of an
    /// audio part (`wav`, `mp3` or `flac`). Nothing is fetched: an image
    /// by any other URL is refused.
    ///
    /// # Errors
    /// [`Error::Media`] for another scheme than `data:`, a `data:` URL
    /// that is not base64 or not of an image, invalid base64, or an audio
    /// format libmtmd does not decode.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        match self {
            MediaPart::Image { url } => image_bytes(url),
            MediaPart::Audio { data, format } => {
                if !matches!(format.as_str(), "wav" | "mp3" | "flac") {
                    return Err(Error::Media(format!("input_audio format {format:?}: wav, mp3 or flac")));
                }
                base64(data)
            }
        }
    }
}

/// The file a `data:` URL holds; other URLs are refused.
fn image_bytes(url: &str) -> Result<Vec<u8>> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        return Err(Error::Media(format!(
            "image URLs with scheme {scheme:?} are not fetched: send the image itself as a data: URL \
             (data:image/png;base64,...)"
        )));
    };
    let (header, payload) = rest.split_once(',').ok_or_else(|| Error::Media("a data: URL without a comma".into()))?;
    let mut fields = header.split(';');
    let mime = fields.next().unwrap_or_default();
    if !mime.is_empty() && !mime.starts_with("image/") {
        return Err(Error::Media(format!("an image_url of type {mime:?}: images only")));
    }
    if !fields.any(|f| f == "base64") {
        return Err(Error::Media("a data: URL must be base64 (data:image/png;base64,...)".into()));
    }
    base64(payload)
}

fn base64(data: &str) -> Result<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(data.trim()).map_err(|e| Error::Media(format!("base64: {e}")))
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

    #[test]
    fn only_base64_image_data_urls_and_known_audio_formats_decode() {
        let image = |url: &str| MediaPart::Image { url: url.into() }.bytes();
        assert_eq!(image("data:image/png;base64,AAEC").unwrap(), [0, 1, 2]);
        assert_eq!(image("data:;base64,AAEC").unwrap(), [0, 1, 2]);
        for (url, why) in [
            ("https://example.com/a.png", "not fetched"),
            ("file:///etc/passwd", "not fetched"),
            ("data:text/html;base64,AAEC", "images only"),
            ("data:image/png,raw", "must be base64"),
            ("data:image/png;base64", "without a comma"),
            ("data:image/png;base64,@@@", "base64"),
        ] {
            let err = image(url).unwrap_err();
            assert!(matches!(&err, Error::Media(m) if m.contains(why)), "{url}: {err}");
        }
        let audio = |format: &str| MediaPart::Audio { data: "AAEC".into(), format: format.into() }.bytes();
        assert_eq!(audio("wav").unwrap(), [0, 1, 2]);
        assert!(matches!(audio("ogg"), Err(Error::Media(m)) if m.contains("wav, mp3 or flac")));
    }
}
