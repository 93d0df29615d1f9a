//! One image or audio clip, decoded ([`Media`], libmtmd's `mtmd_bitmap`).

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

use sha2::{Digest, Sha256};

use super::Projector;
use crate::error::{Error, Result};
use crate::llama::ffi::check_shim;
use crate::sys;

/// The largest encoded media file [`Media::from_bytes`] decodes (256 MiB).
pub const MAX_MEDIA_BYTES: usize = 256 << 20;

/// The most pixels an image may have (64 Mpx: 192 MiB of RGB); projectors
/// resize every image to a few hundred thousand pixels anyway.
pub const MAX_IMAGE_PIXELS: u64 = 64 << 20;

/// The longest side an image may have, in pixels. Sides are also within
/// 200:1 of each other: libmtmd's resizers compute in 32-bit arithmetic.
pub const MAX_IMAGE_SIDE: u32 = 16_384;

/// The most samples an audio clip may have (an hour at 48 kHz).
pub const MAX_AUDIO_SAMPLES: usize = 48_000 * 3600;

/// The fewest samples an audio clip may have (0.1 s at 16 kHz): libmtmd's
/// feature extractors assert on shorter clips.
pub const MIN_AUDIO_SAMPLES: usize = 1600;

/// The widest aspect ratio an image may have.
const MAX_ASPECT: u64 = 200;

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
    /// `width * height * 3`, more than [`MAX_IMAGE_PIXELS`], a side over
    /// [`MAX_IMAGE_SIDE`], or sides more than 200:1 apart.
    #[doc(alias = "mtmd_bitmap_init")]
    pub fn image_rgb(width: u32, height: u32, rgb: &[u8]) -> Result<Media> {
        check_image_size(width, height)?;
        let pixels = u64::from(width) * u64::from(height);
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
    /// [`Error::Media`] for fewer than [`MIN_AUDIO_SAMPLES`] or more than
    /// [`MAX_AUDIO_SAMPLES`] samples, or a sample that is not finite.
    #[doc(alias = "mtmd_bitmap_init_from_audio")]
    pub fn audio_pcm(samples: &[f32]) -> Result<Media> {
        check_audio_len(samples.len())?;
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

    /// An image (JPEG, PNG, GIF, BMP, decoded by stb_image) or audio file
    /// (WAV, MP3, FLAC, decoded by miniaudio and resampled to the
    /// projector's rate) in memory. An image's size is read from its
    /// header and checked before anything is decoded; stb_image's other
    /// formats are refused.
    ///
    /// # Errors
    /// [`Error::InputTooLarge`] over [`MAX_MEDIA_BYTES`]; [`Error::Media`]
    /// for another format, bytes that do not decode (a truncated or
    /// corrupt file), an image whose size [`Media::image_rgb`] would
    /// refuse, a clip whose length [`Media::audio_pcm`] would refuse, or
    /// audio for a projector without audio (images for one without
    /// vision).
    #[doc(alias = "mtmd_helper_bitmap_init_from_buf")]
    pub fn from_bytes(projector: &Projector<'_>, bytes: &[u8]) -> Result<Media> {
        if bytes.len() > MAX_MEDIA_BYTES {
            return Err(Error::InputTooLarge { what: "the media file", limit: MAX_MEDIA_BYTES });
        }
        match sniff(bytes)? {
            Kind::Image { width, height } => check_image_size(width, height)?,
            Kind::Audio => {}
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
            return Err(Error::Media(crate::llama::backend::last_error_or(
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
        if media.is_audio() {
            check_audio_len(media.width() as usize)?;
        } else {
            check_image_size(media.width(), media.height())?;
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
        unsafe { crate::llama::ffi::borrowed_str(sys::mtmd::mtmd_bitmap_get_id(self.ptr.as_ptr())) }.unwrap_or("")
    }

    pub(crate) fn as_ptr(&self) -> *const sys::mtmd::mtmd_bitmap {
        self.ptr.as_ptr()
    }
}

/// Refuses image sizes libmtmd cannot take safely.
fn check_image_size(width: u32, height: u32) -> Result<()> {
    if width == 0 || height == 0 {
        return Err(Error::Media(format!("an image of {width}×{height} pixels is empty")));
    }
    let (w, h) = (u64::from(width), u64::from(height));
    if w * h > MAX_IMAGE_PIXELS || width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE {
        return Err(Error::Media(format!(
            "an image of {width}×{height} pixels is larger than allowed ({MAX_IMAGE_PIXELS} pixels, \
             {MAX_IMAGE_SIDE} a side)"
        )));
    }
    if w.max(h) > MAX_ASPECT * w.min(h) {
        return Err(Error::Media(format!("an image of {width}×{height} pixels is narrower than 1:{MAX_ASPECT}")));
    }
    Ok(())
}

/// Refuses clip lengths libmtmd cannot take safely.
fn check_audio_len(samples: usize) -> Result<()> {
    if !(MIN_AUDIO_SAMPLES..=MAX_AUDIO_SAMPLES).contains(&samples) {
        return Err(Error::Media(format!(
            "an audio clip of {samples} samples is outside {MIN_AUDIO_SAMPLES}..={MAX_AUDIO_SAMPLES}"
        )));
    }
    Ok(())
}

/// What a media file's first bytes say it is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Image { width: u32, height: u32 },
    Audio,
}

/// The kind of a media file from its magic bytes, and an image's size from
/// its header, read before any decoder runs.
fn sniff(b: &[u8]) -> Result<Kind> {
    let unreadable = |format: &str| Error::Media(format!("the {format} header is truncated or corrupt"));
    let be16 = |i: usize| b.get(i..i + 2).map(|s| u32::from(u16::from_be_bytes([s[0], s[1]])));
    let le16 = |i: usize| b.get(i..i + 2).map(|s| u32::from(u16::from_le_bytes([s[0], s[1]])));
    let be32 = |i: usize| b.get(i..i + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
    let le32 = |i: usize| b.get(i..i + 4).map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]).unsigned_abs());
    let image = |w: Option<u32>, h: Option<u32>, format: &str| match (w, h) {
        (Some(width), Some(height)) => Ok(Kind::Image { width, height }),
        _ => Err(unreadable(format)),
    };
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        return if b.get(12..16) == Some(b"IHDR") { image(be32(16), be32(20), "PNG") } else { Err(unreadable("PNG")) };
    }
    if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        return image(le16(6), le16(8), "GIF");
    }
    if b.starts_with(b"BM") {
        return image(le32(18), le32(22), "BMP");
    }
    if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
        // Segments up to the first start-of-frame marker, which holds the
        // size (SOF0..SOF15 but DHT, JPG and DAC).
        let mut i = 2;
        while let (Some(&0xFF), Some(&marker)) = (b.get(i), b.get(i + 1)) {
            match marker {
                0xFF => i += 1, // fill byte
                0xC0..=0xCF if ![0xC4, 0xC8, 0xCC].contains(&marker) => return image(be16(i + 7), be16(i + 5), "JPEG"),
                0x01 | 0xD0..=0xD7 => i += 2,
                _ => i += 2 + be16(i + 2).ok_or_else(|| unreadable("JPEG"))? as usize,
            }
        }
        return Err(unreadable("JPEG"));
    }
    if b.starts_with(b"RIFF") && b.get(8..12) == Some(b"WAVE") {
        return check_wav(b).map(|()| Kind::Audio);
    }
    if b.starts_with(b"fLaC") {
        return check_flac(b).map(|()| Kind::Audio);
    }
    // MP3's length is found by scanning its frames: bounded by the file.
    if b.starts_with(b"ID3") || (b.len() >= 2 && b[0] == 0xFF && b[1] & 0xE0 == 0xE0) {
        return Ok(Kind::Audio);
    }
    Err(Error::Media("not a JPEG, PNG, GIF or BMP image, nor a WAV, MP3 or FLAC file".into()))
}

/// The sample rates a WAV or FLAC file may have: miniaudio resamples to
/// the projector's rate (16 kHz for Whisper-style encoders), so a file
/// claiming 1 Hz would become 16,000 times its length in memory.
const AUDIO_RATES: std::ops::RangeInclusive<u32> = 8_000..=384_000;

/// The longest clip a file may claim: libmtmd's helper allocates what the
/// header says before decoding.
const MAX_AUDIO_SECONDS: u64 = 3600;

/// A WAV file's header, checked before miniaudio allocates what it claims:
/// a format chunk before the data, 1 to 8 channels, a sample rate in
/// [`AUDIO_RATES`], a data chunk no longer than the file holds and at most
/// an hour long.
fn check_wav(b: &[u8]) -> Result<()> {
    let bad = |why: &str| Error::Media(format!("the WAV header {why}"));
    let le16 = |i: usize| b.get(i..i + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let le32 = |i: usize| b.get(i..i + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    let mut format = None;
    let mut i = 12;
    while let (Some(id), Some(size)) = (b.get(i..i + 4), le32(i + 4)) {
        let (body, size) = (i + 8, size as usize);
        match id {
            b"fmt " => {
                let (Some(channels), Some(rate), Some(align)) = (le16(body + 2), le32(body + 4), le16(body + 12))
                else {
                    return Err(bad("is truncated"));
                };
                format = Some((channels, rate, align));
            }
            b"data" => {
                let Some((channels, rate, align)) = format else { return Err(bad("has no format before its data")) };
                if !(1..=8).contains(&channels) || align == 0 {
                    return Err(bad(&format!("has {channels} channels and {align}-byte frames")));
                }
                if !AUDIO_RATES.contains(&rate) {
                    return Err(bad(&format!("has a sample rate of {rate} Hz (8 to 384 kHz are taken)")));
                }
                if size > b.len() - body {
                    return Err(bad(&format!("claims {size} bytes of samples; the file holds {}", b.len() - body)));
                }
                let seconds = (size / usize::from(align)) as u64 / u64::from(rate);
                if seconds > MAX_AUDIO_SECONDS {
                    return Err(bad(&format!("claims {seconds} s of audio; at most {MAX_AUDIO_SECONDS} s")));
                }
                return Ok(());
            }
            _ => {}
        }
        i = body.saturating_add(size).saturating_add(size % 2);
    }
    Err(bad("has no data chunk"))
}

/// A FLAC file's STREAMINFO, checked before miniaudio allocates the
/// samples it claims: a sample rate in [`AUDIO_RATES`], at most an hour.
fn check_flac(b: &[u8]) -> Result<()> {
    let bad = |why: String| Error::Media(format!("the FLAC header {why}"));
    // The first metadata block (type 0: STREAMINFO, 34 bytes from byte 8):
    // block sizes and frame sizes (10 bytes), then 20 bits of sample rate,
    // 3 of channels, 5 of bits per sample and 36 of total samples.
    if b.get(4).map(|t| t & 0x7F) != Some(0) {
        return Err(bad("does not start with its STREAMINFO".into()));
    }
    let Some(packed) = b.get(18..26).map(|s| u64::from_be_bytes(s.try_into().unwrap_or([0; 8]))) else {
        return Err(bad("is truncated".into()));
    };
    let rate = (packed >> 44) as u32;
    let total = packed & ((1 << 36) - 1);
    if !AUDIO_RATES.contains(&rate) {
        return Err(bad(format!("has a sample rate of {rate} Hz (8 to 384 kHz are taken)")));
    }
    if total / u64::from(rate) > MAX_AUDIO_SECONDS {
        return Err(bad(format!("claims {} s of audio; at most {MAX_AUDIO_SECONDS} s", total / u64::from(rate))));
    }
    Ok(())
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(width.to_be_bytes());
        b.extend(height.to_be_bytes());
        b
    }

    #[test]
    fn headers_give_the_size_before_any_decoder_runs() {
        assert_eq!(sniff(&png(640, 488)).unwrap(), Kind::Image { width: 640, height: 488 });
        assert_eq!(sniff(b"GIF89a\x10\x00\x20\x00").unwrap(), Kind::Image { width: 16, height: 32 });
        let mut bmp = b"BM".to_vec();
        bmp.resize(18, 0);
        bmp.extend(7i32.to_le_bytes());
        bmp.extend((-9i32).to_le_bytes());
        assert_eq!(sniff(&bmp).unwrap(), Kind::Image { width: 7, height: 9 });
        // SOI, an APP0 segment of 4 bytes, then SOF0 with height 488, width 640.
        let jpeg = [0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0, 0xFF, 0xC0, 0, 17, 8, 0x01, 0xE8, 0x02, 0x80];
        assert_eq!(sniff(&jpeg).unwrap(), Kind::Image { width: 640, height: 488 });
        assert_eq!(sniff(&wav(16_000, 1, 2, 3200, 3200)).unwrap(), Kind::Audio);
        assert_eq!(sniff(&flac(16_000, 16_000 * 60)).unwrap(), Kind::Audio);
        assert_eq!(sniff(b"ID3\x04").unwrap(), Kind::Audio);
        for bad in [&b""[..], b"not media", b"\x89PNG\r\n\x1a\n", &jpeg[..12], b"GIF89a\x10", b"\0\0\x02\0TGA"] {
            assert!(matches!(sniff(bad), Err(Error::Media(_))), "{bad:?}");
        }
    }

    /// A WAV header (format chunk, then a data chunk that claims
    /// `claimed` bytes) and `held` bytes of samples.
    fn wav(rate: u32, channels: u16, bytes_per_sample: u16, claimed: u32, held: usize) -> Vec<u8> {
        let mut b = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
        b.extend(16u32.to_le_bytes());
        b.extend(1u16.to_le_bytes()); // PCM
        b.extend(channels.to_le_bytes());
        b.extend(rate.to_le_bytes());
        b.extend((rate * u32::from(channels * bytes_per_sample)).to_le_bytes());
        b.extend((channels * bytes_per_sample).to_le_bytes());
        b.extend((bytes_per_sample * 8).to_le_bytes());
        b.extend(b"data");
        b.extend(claimed.to_le_bytes());
        b.resize(b.len() + held, 0);
        b
    }

    fn flac(rate: u32, total: u64) -> Vec<u8> {
        let mut b = b"fLaC\x80\0\0\x22".to_vec();
        b.extend([0u8; 10]);
        // Mono (channels - 1 = 0), 16 bits (bits - 1 = 15).
        let packed = (u64::from(rate) << 44) | (15 << 36) | total;
        b.extend(packed.to_be_bytes());
        b.extend([0u8; 16]);
        b
    }

    /// Headers that claim more than the file holds, or audio that would be
    /// huge once resampled, are refused before miniaudio allocates it.
    #[test]
    fn audio_headers_are_checked_before_miniaudio_allocates() {
        let media = |b: Vec<u8>| match sniff(&b) {
            Err(Error::Media(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(media(wav(16_000, 1, 2, u32::MAX, 3200)).contains("claims 4294967295 bytes"));
        assert!(media(wav(1, 1, 2, 3200, 3200)).contains("sample rate of 1 Hz"));
        assert!(media(wav(16_000, 0, 2, 3200, 3200)).contains("0 channels"));
        assert!(media(b"RIFF\0\0\0\0WAVEdata\x04\0\0\0abcd".to_vec()).contains("no format"));
        assert!(media(b"RIFF\0\0\0\0WAVEfmt ".to_vec()).contains("no data chunk"));
        assert!(media(flac(16_000, 16_000 * 7200)).contains("claims 7200 s"));
        assert!(media(flac(1, 1000)).contains("sample rate of 1 Hz"));
        assert!(media(b"fLaC\x04".to_vec()).contains("STREAMINFO"));
    }

    #[test]
    fn image_sizes_and_clip_lengths_have_bounds() {
        assert!(check_image_size(640, 488).is_ok());
        assert!(check_image_size(MAX_IMAGE_SIDE, MAX_IMAGE_SIDE / 4).is_ok());
        for (w, h) in [(0, 5), (5, 0), (MAX_IMAGE_SIDE + 1, 100), (100_000, 100_000), (201, 1), (10_000, 49)] {
            assert!(matches!(check_image_size(w, h), Err(Error::Media(_))), "{w}×{h}");
        }
        assert!(check_audio_len(MIN_AUDIO_SAMPLES).is_ok());
        assert!(check_audio_len(MIN_AUDIO_SAMPLES - 1).is_err());
        assert!(check_audio_len(MAX_AUDIO_SAMPLES + 1).is_err());
    }
}
