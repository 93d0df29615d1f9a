//! One image or audio clip, decoded ([`Media`], libmtmd's `mtmd_bitmap`).

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

use sha2::{Digest, Sha256};

use super::Projector;
use crate::error::{Error, Result, check_shim};
use crate::sys;

/// The largest encoded media file [`Media::from_bytes`] decodes (256 MiB).
pub const MAX_MEDIA_BYTES: usize = 256 << 20;

/// The most pixels an image may have (64 Mpx: 192 MiB of RGB); projectors
/// resize every image to a few hundred thousand pixels anyway.
pub const MAX_IMAGE_PIXELS: u64 = 64 << 20;

/// An image (RGB, 8 bits per channel) or an audio clip (mono PCM, f32),
/// ready to go into a [`MediaPrompt`](super::MediaPrompt) where its
/// prompt has a marker ([`Projector::marker`]).
///
/// Every `Media` has an id: the SHA-256 of what it holds (for a decoded
/// file, of the file's bytes, as libmtmd computes it), which prompt
/// caching compares instead of the pixels.
#[derive(Debug)]
pub struct Media {
    ptr: NonNull<sys::mtmd::mtmd_bitmap>,
}

// SAFETY: an `mtmd_bitmap` is plain data (width, height, a byte vector, an
// id string, flags; `struct mtmd_bitmap` in tools/mtmd/mtmd.cpp) with no
// thread affinity; `Media` owns it alone, and `&Media` only reads it.
unsafe impl Send for Media {}
// SAFETY: as above: every `&self` method only reads.
unsafe impl Sync for Media {}

impl Drop for Media {
    fn drop(&mut self) {
        // SAFETY: the bitmap is ours and freed once.
        unsafe { sys::mtmd::mtmd_bitmap_free(self.ptr.as_ptr()) }
    }
}

impl Media {
    /// An image of `width × height` pixels from its RGB bytes, row by row
    /// (`width * height * 3` bytes).
    ///
    /// # Errors
    /// [`Error::Media`] for a zero width or height, a length that is not
    /// `width * height * 3`, or more than [`MAX_IMAGE_PIXELS`].
    #[doc(alias = "mtmd_bitmap_init")]
    pub fn image_rgb(width: u32, height: u32, rgb: &[u8]) -> Result<Media> {
        if width == 0 || height == 0 {
            return Err(Error::Media(format!("an image of {width}×{height} pixels is empty")));
        }
        let pixels = u64::from(width) * u64::from(height);
        if pixels > MAX_IMAGE_PIXELS {
            return Err(Error::Media(format!(
                "an image of {width}×{height} pixels is larger than the {MAX_IMAGE_PIXELS} pixels allowed"
            )));
        }
        if rgb.len() as u64 != pixels * 3 {
            return Err(Error::Media(format!(
                "an RGB image of {width}×{height} pixels has {} bytes, not {}",
                pixels * 3,
                rgb.len()
            )));
        }
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `rgb` holds `width * height * 3` bytes (checked above),
        // which the bitmap copies; the shim catches exceptions.
        let code = unsafe { sys::mtmd::llama_rs_mtmd_bitmap_init(width, height, rgb.as_ptr(), &mut ptr) };
        check_shim(code, "mtmd_bitmap_init")?;
        let media = Media::own(ptr, "mtmd_bitmap_init")?;
        media.set_id(&sha256_hex(&[&width.to_le_bytes(), &height.to_le_bytes(), rgb]))?;
        Ok(media)
    }

    /// An audio clip from its samples: mono PCM at the projector's sample
    /// rate ([`Projector::audio_sample_rate`]).
    ///
    /// # Errors
    /// [`Error::Media`] for no samples or a sample that is not finite.
    #[doc(alias = "mtmd_bitmap_init_from_audio")]
    pub fn audio_pcm(samples: &[f32]) -> Result<Media> {
        if samples.is_empty() {
            return Err(Error::Media("an audio clip of no samples is empty".into()));
        }
        if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
            return Err(Error::Media(format!("audio sample {i} is {}", samples[i])));
        }
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `samples` holds `samples.len()` floats, which the bitmap
        // copies; the shim catches exceptions.
        let code =
            unsafe { sys::mtmd::llama_rs_mtmd_bitmap_init_from_audio(samples.len(), samples.as_ptr(), &mut ptr) };
        check_shim(code, "mtmd_bitmap_init_from_audio")?;
        let media = Media::own(ptr, "mtmd_bitmap_init_from_audio")?;
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        media.set_id(&sha256_hex(&[b"pcm", &bytes]))?;
        Ok(media)
    }

    /// An image (JPEG, PNG, BMP, GIF, TGA, PSD, HDR, PIC, PNM: what
    /// stb_image decodes) or audio file (WAV, MP3, FLAC: what miniaudio
    /// decodes, resampled to the projector's rate) in memory.
    ///
    /// # Errors
    /// [`Error::InputTooLarge`] over [`MAX_MEDIA_BYTES`]; [`Error::Media`]
    /// for bytes that do not decode (a truncated or corrupt file, another
    /// format), an image of more than [`MAX_IMAGE_PIXELS`], or audio for a
    /// projector without audio.
    #[doc(alias = "mtmd_helper_bitmap_init_from_buf")]
    pub fn from_bytes(projector: &Projector<'_>, bytes: &[u8]) -> Result<Media> {
        if bytes.len() > MAX_MEDIA_BYTES {
            return Err(Error::InputTooLarge { what: "the media file", limit: MAX_MEDIA_BYTES });
        }
        if bytes.is_empty() {
            return Err(Error::Media("the media file is empty".into()));
        }
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the projector is live (borrowed), `bytes` holds
        // `bytes.len()` bytes for the call, and the shim catches
        // exceptions.
        let code = unsafe {
            sys::mtmd::llama_rs_mtmd_bitmap_from_buf(projector.as_ptr(), bytes.as_ptr(), bytes.len(), &mut ptr)
        };
        check_shim(code, "mtmd_helper_bitmap_init_from_buf")?;
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(Error::Media(crate::backend::last_error_or(
                "the bytes are not an image or audio file libmtmd decodes (or the file is truncated or corrupt)",
            )));
        };
        let media = Media { ptr };
        if media.is_audio() && !projector.supports_audio() {
            return Err(Error::Media("this projector takes no audio".into()));
        }
        if !media.is_audio() && !projector.supports_vision() {
            return Err(Error::Media("this projector takes no images".into()));
        }
        if media.is_empty() {
            return Err(Error::Media("the file decodes to an empty image or clip".into()));
        }
        let pixels = u64::from(media.width()) * u64::from(media.height());
        if !media.is_audio() && pixels > MAX_IMAGE_PIXELS {
            return Err(Error::Media(format!(
                "an image of {}×{} pixels is larger than the {MAX_IMAGE_PIXELS} pixels allowed",
                media.width(),
                media.height()
            )));
        }
        Ok(media)
    }

    /// [`Media::from_bytes`] of a file's contents.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; otherwise as
    /// [`Media::from_bytes`].
    pub fn from_file(projector: &Projector<'_>, path: impl AsRef<Path>) -> Result<Media> {
        let path = path.as_ref();
        let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        if len > MAX_MEDIA_BYTES as u64 {
            return Err(Error::InputTooLarge { what: "the media file", limit: MAX_MEDIA_BYTES });
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Media::from_bytes(projector, &bytes)
    }

    fn own(ptr: *mut sys::mtmd::mtmd_bitmap, function: &'static str) -> Result<Media> {
        NonNull::new(ptr).map(|ptr| Media { ptr }).ok_or_else(|| Error::Media(format!("{function} returned no bitmap")))
    }

    fn set_id(&self, id: &str) -> Result<()> {
        let id = CString::new(id)?;
        // SAFETY: the bitmap is ours (no `&` to its id is alive: `id()`
        // borrows `self`, and this runs only while constructing); the
        // shim catches exceptions.
        let code = unsafe { sys::mtmd::llama_rs_mtmd_bitmap_set_id(self.ptr.as_ptr(), id.as_ptr()) };
        check_shim(code, "mtmd_bitmap_set_id")
    }

    /// Whether this is an audio clip (else an image).
    pub fn is_audio(&self) -> bool {
        // SAFETY: the bitmap is live.
        unsafe { sys::mtmd::mtmd_bitmap_is_audio(self.ptr.as_ptr()) }
    }

    /// Width in pixels (audio: the number of samples).
    pub fn width(&self) -> u32 {
        // SAFETY: the bitmap is live.
        unsafe { sys::mtmd::mtmd_bitmap_get_nx(self.ptr.as_ptr()) }
    }

    /// Height in pixels (audio: 1).
    pub fn height(&self) -> u32 {
        // SAFETY: the bitmap is live.
        unsafe { sys::mtmd::mtmd_bitmap_get_ny(self.ptr.as_ptr()) }
    }

    /// The decoded bytes: RGB rows for an image, f32 samples (native
    /// endianness) for audio.
    pub fn data(&self) -> &[u8] {
        // SAFETY: the bitmap is live; its buffer holds `n_bytes` bytes and
        // does not change while `self` is borrowed.
        unsafe {
            let len = sys::mtmd::mtmd_bitmap_get_n_bytes(self.ptr.as_ptr());
            let data = sys::mtmd::mtmd_bitmap_get_data(self.ptr.as_ptr());
            if len == 0 || data.is_null() { &[] } else { std::slice::from_raw_parts(data, len) }
        }
    }

    fn is_empty(&self) -> bool {
        self.data().is_empty()
    }

    /// The SHA-256 of the media (hex): what prompt caching compares.
    pub fn id(&self) -> &str {
        // SAFETY: the bitmap is live; its id string does not change while
        // `self` is borrowed (only construction sets it).
        unsafe { crate::ffi::borrowed_str(sys::mtmd::mtmd_bitmap_get_id(self.ptr.as_ptr())) }.unwrap_or("")
    }

    pub(crate) fn as_ptr(&self) -> *const sys::mtmd::mtmd_bitmap {
        self.ptr.as_ptr()
    }
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
