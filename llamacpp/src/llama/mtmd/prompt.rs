//! A tokenized prompt of text and media chunks ([`MediaPrompt`], libmtmd's
//! `mtmd_input_chunks`).

use std::ptr::NonNull;

use crate::llama::types::Token;
use crate::sys;

/// What one chunk of a [`MediaPrompt`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKind {
    /// Text tokens.
    Text,
    /// An image's embeddings.
    Image,
    /// An audio clip's embeddings.
    Audio,
}

/// One chunk of a [`MediaPrompt`].
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'p> {
    ptr: *const sys::mtmd::mtmd_input_chunk,
    kind: ChunkKind,
    _prompt: std::marker::PhantomData<&'p MediaPrompt>,
}

impl<'p> Chunk<'p> {
    /// Text, image or audio.
    pub fn kind(&self) -> ChunkKind {
        self.kind
    }

    /// A text chunk's tokens (empty for media).
    pub fn tokens(&self) -> &'p [Token] {
        if self.kind != ChunkKind::Text {
            return &[];
        }
        let mut n = 0;
        // SAFETY: the chunk lives as long as its prompt (`'p`); the tokens
        // are an array of `n` llama_tokens inside it, and `Token` is a
        // `repr(transparent)` i32.
        unsafe {
            let tokens = sys::mtmd::mtmd_input_chunk_get_tokens_text(self.ptr, &mut n);
            if tokens.is_null() || n == 0 { &[] } else { std::slice::from_raw_parts(tokens.cast(), n) }
        }
    }

    /// The number of tokens: text tokens, or the embeddings a media chunk
    /// decodes into.
    pub fn n_tokens(&self) -> usize {
        // SAFETY: the chunk is live for `'p`.
        unsafe { sys::mtmd::mtmd_input_chunk_get_n_tokens(self.ptr) }
    }

    /// The positions the chunk takes in its sequence (with M-RoPE, fewer
    /// than its tokens for an image).
    pub fn n_pos(&self) -> usize {
        // SAFETY: the chunk is live for `'p`.
        let n = unsafe { sys::mtmd::mtmd_input_chunk_get_n_pos(self.ptr) };
        usize::try_from(n).unwrap_or(0)
    }

    /// A media chunk's id: its [`Media::id`](super::Media::id); `None` for
    /// text.
    pub fn media_id(&self) -> Option<&'p str> {
        if self.kind == ChunkKind::Text {
            return None;
        }
        // SAFETY: the chunk is live for `'p`, and its id does not change.
        unsafe { crate::llama::ffi::borrowed_str(sys::mtmd::mtmd_input_chunk_get_id(self.ptr)) }
    }

    /// The raw chunk, for libmtmd calls this crate does not wrap; valid
    /// while the prompt lives.
    pub fn as_ptr(&self) -> *const sys::mtmd::mtmd_input_chunk {
        self.ptr
    }
}

/// A prompt of text and media, tokenized by
/// [`Projector::tokenize`](super::Projector::tokenize): text chunks of
/// tokens and, where the text had a marker, the media's chunk (the
/// embeddings of an image or clip, computed when the prompt is evaluated).
#[derive(Debug)]
pub struct MediaPrompt {
    ptr: NonNull<sys::mtmd::mtmd_input_chunks>,
    /// The id of the projector that tokenized it, which alone may
    /// evaluate it (another one's images may have another size).
    pub(crate) projector: u64,
}

// SAFETY: an `mtmd_input_chunks` is a vector of owned chunks (token
// vectors, preprocessed image or audio tensors as plain float vectors, an id
// string; tools/mtmd/mtmd.cpp) with no thread affinity; `MediaPrompt` owns
// it alone and `&MediaPrompt` only reads it.
unsafe impl Send for MediaPrompt {}
// SAFETY: as above: every `&self` method only reads.
unsafe impl Sync for MediaPrompt {}

impl Drop for MediaPrompt {
    fn drop(&mut self) {
        // SAFETY: the list is ours and freed once; it frees its chunks.
        unsafe { sys::mtmd::mtmd_input_chunks_free(self.ptr.as_ptr()) }
    }
}

impl MediaPrompt {
    /// Takes ownership of a chunk list made for `projector`.
    pub(crate) fn new(ptr: NonNull<sys::mtmd::mtmd_input_chunks>, projector: u64) -> MediaPrompt {
        MediaPrompt { ptr, projector }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut sys::mtmd::mtmd_input_chunks {
        self.ptr.as_ptr()
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> impl ExactSizeIterator<Item = Chunk<'_>> + '_ {
        // SAFETY: the list is live while `self` is borrowed.
        let n = unsafe { sys::mtmd::mtmd_input_chunks_size(self.ptr.as_ptr()) };
        (0..n).map(move |i| {
            // SAFETY: `i < n`, the list's size; the chunk lives in the list.
            let ptr = unsafe { sys::mtmd::mtmd_input_chunks_get(self.ptr.as_ptr(), i) };
            // SAFETY: a chunk of the list.
            let kind = match unsafe { sys::mtmd::mtmd_input_chunk_get_type(ptr) } {
                sys::mtmd::MTMD_INPUT_CHUNK_TYPE_IMAGE => ChunkKind::Image,
                sys::mtmd::MTMD_INPUT_CHUNK_TYPE_AUDIO => ChunkKind::Audio,
                _ => ChunkKind::Text,
            };
            Chunk { ptr, kind, _prompt: std::marker::PhantomData }
        })
    }

    /// All the chunks' tokens (text tokens and media embeddings).
    pub fn n_tokens(&self) -> usize {
        self.chunks().map(|c| c.n_tokens()).sum()
    }

    /// All the positions the prompt takes in its sequence.
    pub fn n_pos(&self) -> usize {
        self.chunks().map(|c| c.n_pos()).sum()
    }

    /// How many leading chunks `self` and `other` share: equal text tokens
    /// and media of equal id (the SHA-256 of their pixels or file)
    /// tokenized by the same projector (another one, even of the same
    /// file, may have other limits on image tokens), so that a cached
    /// prefix is reused only with identical media embeddings. The
    /// count covers whole chunks; [`MediaPrompt::common_positions`] says
    /// how far into the sequence that reaches, including a shared head of
    /// the first differing text chunk.
    pub fn common_chunks(&self, other: &MediaPrompt) -> usize {
        let same_projector = self.projector == other.projector;
        self.chunks().zip(other.chunks()).take_while(|(a, b)| same_chunk(a, b, same_projector)).count()
    }

    /// The positions `self` and `other` share from the start: the
    /// positions of their [`common_chunks`](MediaPrompt::common_chunks),
    /// plus the common head of the next chunks' tokens when both are text.
    pub fn common_positions(&self, other: &MediaPrompt) -> usize {
        let same_projector = self.projector == other.projector;
        let mut positions = 0;
        for (a, b) in self.chunks().zip(other.chunks()) {
            if same_chunk(&a, &b, same_projector) {
                positions += a.n_pos();
                continue;
            }
            if a.kind() == ChunkKind::Text && b.kind() == ChunkKind::Text {
                positions += a.tokens().iter().zip(b.tokens()).take_while(|(x, y)| x == y).count();
            }
            break;
        }
        positions
    }
}

/// Equal text tokens, or the same medium embedded by the same projector.
fn same_chunk(a: &Chunk<'_>, b: &Chunk<'_>, same_projector: bool) -> bool {
    a.kind() == b.kind()
        && match a.kind() {
            ChunkKind::Text => a.tokens() == b.tokens(),
            _ => {
                same_projector
                    && a.media_id().is_some_and(|id| !id.is_empty())
                    && a.media_id() == b.media_id()
                    && a.n_tokens() == b.n_tokens()
            }
        }
}
