//! libmtmd (feature `mtmd`): multimodal projectors and media input, from
//! `tools/mtmd/mtmd.h` and `mtmd-helper.h` at the pinned commit (the build
//! checks their sha256, build/mtmd.rs).
//!
//! Written by hand: the calls here take and return pointers and scalars
//! only, so no struct layout has to match. The calls that can throw a C++
//! exception (loading, decoding media files, tokenizing, encoding,
//! evaluating) are the `llama_rs_mtmd_*` twins in `shim/shim.cpp`, with the
//! convention of [`crate::shim`]: [`crate::shim::OK`] or
//! [`crate::shim::EXCEPTION`], the wrapped call's result in the last
//! out-parameter.

use crate::{ggml_log_callback, llama_context, llama_model, llama_pos, llama_seq_id, llama_token};
use std::os::raw::{c_char, c_int, c_void};

/// A multimodal projector loaded beside a text model (`mtmd_context`).
#[repr(C)]
pub struct mtmd_context {
    _opaque: [u8; 0],
}
/// An image (RGB) or audio (PCM f32) input (`mtmd_bitmap`).
#[repr(C)]
pub struct mtmd_bitmap {
    _opaque: [u8; 0],
}
/// A list of text and media chunks (`mtmd_input_chunks`).
#[repr(C)]
pub struct mtmd_input_chunks {
    _opaque: [u8; 0],
}
/// One chunk of a tokenized prompt (`mtmd_input_chunk`).
#[repr(C)]
pub struct mtmd_input_chunk {
    _opaque: [u8; 0],
}

/// `enum mtmd_input_chunk_type`.
pub type mtmd_input_chunk_type = c_int;
/// Text tokens.
pub const MTMD_INPUT_CHUNK_TYPE_TEXT: mtmd_input_chunk_type = 0;
/// Image embeddings.
pub const MTMD_INPUT_CHUNK_TYPE_IMAGE: mtmd_input_chunk_type = 1;
/// Audio embeddings.
pub const MTMD_INPUT_CHUNK_TYPE_AUDIO: mtmd_input_chunk_type = 2;

unsafe extern "C" {
    /// The default media marker (`"<__media__>"`).
    pub fn mtmd_default_marker() -> *const c_char;
    /// Frees a projector.
    pub fn mtmd_free(ctx: *mut mtmd_context);
    /// Whether the decoder attends non-causally within `chunk` (a media
    /// chunk; null: an image chunk).
    pub fn mtmd_decode_use_non_causal(ctx: *const mtmd_context, chunk: *const mtmd_input_chunk) -> bool;
    /// Whether the text model uses M-RoPE positions.
    pub fn mtmd_decode_use_mrope(ctx: *const mtmd_context) -> bool;
    /// Whether the projector takes images.
    pub fn mtmd_support_vision(ctx: *const mtmd_context) -> bool;
    /// Whether the projector takes audio.
    pub fn mtmd_support_audio(ctx: *const mtmd_context) -> bool;
    /// The audio sample rate in Hz, or -1 without audio.
    pub fn mtmd_get_audio_sample_rate(ctx: *const mtmd_context) -> c_int;
    /// The projector's media marker.
    pub fn mtmd_get_marker(ctx: *const mtmd_context) -> *const c_char;
    /// Routes libmtmd's log (not ggml's or libllama's).
    pub fn mtmd_log_set(log_callback: ggml_log_callback, user_data: *mut c_void);
    /// Routes the log of libmtmd's helpers, and libmtmd's (`mtmd_log_set`).
    pub fn mtmd_helper_log_set(log_callback: ggml_log_callback, user_data: *mut c_void);

    /// Image width in pixels (audio: samples).
    pub fn mtmd_bitmap_get_nx(bitmap: *const mtmd_bitmap) -> u32;
    /// Image height in pixels (audio: 1).
    pub fn mtmd_bitmap_get_ny(bitmap: *const mtmd_bitmap) -> u32;
    /// The bitmap's bytes (RGB, or f32 samples).
    pub fn mtmd_bitmap_get_data(bitmap: *const mtmd_bitmap) -> *const u8;
    /// The length of [`mtmd_bitmap_get_data`].
    pub fn mtmd_bitmap_get_n_bytes(bitmap: *const mtmd_bitmap) -> usize;
    /// Whether the bitmap holds audio.
    pub fn mtmd_bitmap_is_audio(bitmap: *const mtmd_bitmap) -> bool;
    /// Frees a bitmap.
    pub fn mtmd_bitmap_free(bitmap: *mut mtmd_bitmap);
    /// The bitmap's id (`""` if none was set).
    pub fn mtmd_bitmap_get_id(bitmap: *const mtmd_bitmap) -> *const c_char;

    /// A new, empty chunk list.
    pub fn mtmd_input_chunks_init() -> *mut mtmd_input_chunks;
    /// The number of chunks.
    pub fn mtmd_input_chunks_size(chunks: *const mtmd_input_chunks) -> usize;
    /// Chunk `idx` (owned by the list).
    pub fn mtmd_input_chunks_get(chunks: *const mtmd_input_chunks, idx: usize) -> *const mtmd_input_chunk;
    /// Frees a chunk list and its chunks.
    pub fn mtmd_input_chunks_free(chunks: *mut mtmd_input_chunks);
    /// The chunk's type.
    pub fn mtmd_input_chunk_get_type(chunk: *const mtmd_input_chunk) -> mtmd_input_chunk_type;
    /// A text chunk's tokens (their count in `*n_tokens_output`).
    pub fn mtmd_input_chunk_get_tokens_text(
        chunk: *const mtmd_input_chunk,
        n_tokens_output: *mut usize,
    ) -> *const llama_token;
    /// The chunk's number of tokens (embeddings, for media).
    pub fn mtmd_input_chunk_get_n_tokens(chunk: *const mtmd_input_chunk) -> usize;
    /// A media chunk's id (its bitmap's); null for text.
    pub fn mtmd_input_chunk_get_id(chunk: *const mtmd_input_chunk) -> *const c_char;
    /// The positions the chunk takes (M-RoPE: fewer than its tokens).
    pub fn mtmd_input_chunk_get_n_pos(chunk: *const mtmd_input_chunk) -> llama_pos;
    /// The embeddings of the last encode: `n_embd_inp × n_tokens` floats.
    pub fn mtmd_get_output_embd(ctx: *mut mtmd_context) -> *mut f32;

    /// `mtmd_init_from_file` with `mtmd_context_params_default()` and the
    /// given fields, behind the barrier; null in `result` on failure.
    pub fn llama_rs_mtmd_init(
        path: *const c_char,
        model: *const llama_model,
        use_gpu: bool,
        n_threads: i32,
        warmup: bool,
        flash_attn_type: i32,
        image_min_tokens: i32,
        image_max_tokens: i32,
        result: *mut *mut mtmd_context,
    ) -> c_int;
    /// `mtmd_bitmap_init` (RGB, `nx * ny * 3` bytes) behind the barrier.
    pub fn llama_rs_mtmd_bitmap_init(nx: u32, ny: u32, data: *const u8, result: *mut *mut mtmd_bitmap) -> c_int;
    /// `mtmd_bitmap_init_from_audio` (PCM f32) behind the barrier.
    pub fn llama_rs_mtmd_bitmap_init_from_audio(
        n_samples: usize,
        data: *const f32,
        result: *mut *mut mtmd_bitmap,
    ) -> c_int;
    /// `mtmd_bitmap_set_id` behind the barrier.
    pub fn llama_rs_mtmd_bitmap_set_id(bitmap: *mut mtmd_bitmap, id: *const c_char) -> c_int;
    /// `mtmd_helper_bitmap_init_from_buf`: an image or audio file in
    /// memory, decoded, with its SHA-256 as id; null in `result` when it
    /// cannot be decoded.
    pub fn llama_rs_mtmd_bitmap_from_buf(
        ctx: *const mtmd_context,
        buf: *const u8,
        len: usize,
        result: *mut *mut mtmd_bitmap,
    ) -> c_int;
    /// `mtmd_tokenize` behind the barrier (`text` NUL-terminated at
    /// `text_len`): 0, 1 (bitmaps ≠ markers), 2 (preprocessing failed).
    pub fn llama_rs_mtmd_tokenize(
        ctx: *const mtmd_context,
        output: *mut mtmd_input_chunks,
        text: *const c_char,
        text_len: usize,
        add_special: bool,
        parse_special: bool,
        bitmaps: *const *const mtmd_bitmap,
        n_bitmaps: usize,
        result: *mut i32,
    ) -> c_int;
    /// `mtmd_encode_chunk` behind the barrier: 0 on success.
    pub fn llama_rs_mtmd_encode_chunk(
        ctx: *mut mtmd_context,
        chunk: *const mtmd_input_chunk,
        result: *mut i32,
    ) -> c_int;
    /// `mtmd_helper_eval_chunk_single` behind the barrier.
    pub fn llama_rs_mtmd_eval_chunk_single(
        ctx: *mut mtmd_context,
        lctx: *mut llama_context,
        chunk: *const mtmd_input_chunk,
        n_past: llama_pos,
        seq_id: llama_seq_id,
        n_batch: i32,
        logits_last: bool,
        new_n_past: *mut llama_pos,
        result: *mut i32,
    ) -> c_int;
    /// `mtmd_helper_decode_image_chunk` of encoded embeddings behind the
    /// barrier: 0, -1 (not a media chunk), or llama_decode's code.
    pub fn llama_rs_mtmd_decode_media_chunk(
        ctx: *mut mtmd_context,
        lctx: *mut llama_context,
        chunk: *const mtmd_input_chunk,
        embd: *mut f32,
        n_past: llama_pos,
        seq_id: llama_seq_id,
        n_batch: i32,
        new_n_past: *mut llama_pos,
        result: *mut i32,
    ) -> c_int;
}
