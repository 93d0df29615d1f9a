//! Images and audio in chat requests (feature `mtmd`): `image_url` parts
//! with `data:` URLs and `input_audio` parts, decoded on the blocking
//! pool for the engine's projector (`--mmproj`). Remote URLs are refused:
//! the server fetches nothing.

use llamacpp::engine::Request;
use serde_json::Value;

use crate::error::ApiError;
use crate::state::Ready;

/// The media of a request, decoded.
#[derive(Default)]
pub(crate) struct Decoded {
    #[cfg(feature = "mtmd")]
    media: Vec<llamacpp::mtmd::Media>,
    /// The tokens they take in the prompt.
    pub tokens: usize,
}

/// Loads the projector `--mmproj` names into the engine's settings.
#[cfg(feature = "mtmd")]
pub(crate) fn configure(
    config: llamacpp::engine::EngineConfig,
    mmproj: Option<&std::path::Path>,
    threads: Option<i32>,
) -> Result<llamacpp::engine::EngineConfig, String> {
    let Some(path) = mmproj else { return Ok(config) };
    let mut params = llamacpp::mtmd::ProjectorParams::default();
    if let Some(t) = threads {
        params = params.n_threads(t);
    }
    Ok(config.projector(path, params))
}

#[cfg(not(feature = "mtmd"))]
pub(crate) fn configure(
    config: llamacpp::engine::EngineConfig,
    mmproj: Option<&std::path::Path>,
    _threads: Option<i32>,
) -> Result<llamacpp::engine::EngineConfig, String> {
    match mmproj {
        None => Ok(config),
        Some(_) => {
            Err("--mmproj: this build has no image or audio input (build llama-serve with --features mtmd)".into())
        }
    }
}

/// The media of `messages`, decoded for the engine: at most `max` of
/// them, each a `data:` URL of an image or a base64 clip
/// ([`MediaPart::bytes`](llamacpp::chat::MediaPart::bytes): remote URLs
/// are refused, the server fetches nothing).
pub(crate) fn decode(ready: &Ready, messages: &Value, max: usize) -> Result<Decoded, ApiError> {
    let parts = llamacpp::chat::media_parts(messages).map_err(|e| bad(e.to_string()))?;
    if parts.is_empty() {
        return Ok(Decoded::default());
    }
    if parts.len() > max {
        return Err(bad(format!("{} images and clips; at most {max} per request (--max-media)", parts.len())));
    }
    let mut decoded = Decoded::default();
    for part in &parts {
        let bytes = part.bytes().map_err(|e| match e {
            llamacpp::Error::Media(message) => bad(message),
            other => bad(other.to_string()),
        })?;
        take(ready, &bytes, &mut decoded)?;
    }
    Ok(decoded)
}

#[cfg(feature = "mtmd")]
fn take(ready: &Ready, bytes: &[u8], decoded: &mut Decoded) -> Result<(), ApiError> {
    if !ready.engine.takes_images() && !ready.engine.takes_audio() {
        return Err(bad("this server takes no images or audio (start it with --mmproj)".into()));
    }
    let medium = ready.engine.media_from_bytes(bytes).map_err(crate::error::engine_error)?;
    decoded.tokens += ready.engine.media_tokens(&medium).map_err(crate::error::engine_error)?;
    decoded.media.push(medium);
    Ok(())
}

#[cfg(not(feature = "mtmd"))]
fn take(_ready: &Ready, _bytes: &[u8], _decoded: &mut Decoded) -> Result<(), ApiError> {
    Err(bad("this server takes no images or audio (built without the mtmd feature)".into()))
}

/// `request` with the decoded media in the places its prompt has.
pub(crate) fn attach(request: Request, decoded: Decoded) -> Request {
    #[cfg(feature = "mtmd")]
    let request = if decoded.media.is_empty() { request } else { request.with_media(decoded.media) };
    #[cfg(not(feature = "mtmd"))]
    let _ = decoded;
    request
}

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message).param("messages")
}
