//! Tokens, the vocabulary, tokenizing and detokenizing.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result, try_reserve};
use crate::llama::extensions::Extensions;
use crate::llama::ffi::check_shim;
use crate::llama::stack::{REGEX_STACK_PER_BYTE, with_stack};
use crate::llama::thread::SendPtr;
use crate::sys;

mod detokenizer;

pub use detokenizer::Detokenizer;
// Defined in the leaf module `types` (batches and samplers use it too);
// kept here at its old path.
pub use crate::llama::types::Token;

/// The attribute bits of a token (`LLAMA_TOKEN_ATTR_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TokenAttrs(pub u32);

impl TokenAttrs {
    /// Unknown token.
    pub const UNKNOWN: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_UNKNOWN);
    /// Unused slot.
    pub const UNUSED: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_UNUSED);
    /// Ordinary text.
    pub const NORMAL: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_NORMAL);
    /// Control token (BOS, EOS, chat markers, …).
    pub const CONTROL: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_CONTROL);
    /// User-defined token.
    pub const USER_DEFINED: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_USER_DEFINED);
    /// A raw byte (`<0xNN>`).
    pub const BYTE: TokenAttrs = TokenAttrs(sys::llama_token_attr::LLAMA_TOKEN_ATTR_BYTE);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: TokenAttrs) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

/// Whether tokenizing adds the model's start token(s): [`AddBos::Yes`]
/// adds BOS (and EOS or SEP where the model's vocabulary says it adds
/// them), as llama.cpp's `add_special`; [`AddBos::No`] adds nothing (for
/// text that continues a prompt, or a template that writes `<bos>`
/// itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddBos {
    /// Add the start (and end) tokens the model asks for.
    Yes,
    /// Add no tokens.
    No,
}

/// How special (control) tokens such as `<start_of_turn>` relate to text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Special {
    /// Text is only text: `<start_of_turn>` in the input is tokenized as
    /// ordinary characters (untrusted input cannot inject control
    /// tokens), and control tokens render as nothing.
    #[default]
    Plain,
    /// Control-token text in the input becomes the control token (for
    /// trusted templates), and control tokens render as their text.
    Markup,
}

/// A model's vocabulary: tokenizer, detokenizer and special tokens.
///
/// Borrowed from its [`Model`](crate::Model) with [`Model::vocab`](crate::Model::vocab).
/// Tokenizing is thread-safe (documented by llama.cpp), so `&Vocab` can be
/// used from many threads.
pub struct Vocab {
    ptr: NonNull<sys::llama_vocab>,
    n_tokens: i32,
    has_vocab: bool,
    /// The pre-tokenizer splits text with `std::regex`, whose matcher
    /// recurses once per character of a match (see `crate::llama::stack`).
    regex_split: bool,
    /// The caches upper floors build from the vocabulary (the control
    /// tokens' texts that keep chat text plain), once per model.
    extensions: Extensions,
}

/// The pre-tokenizers (`tokenizer.ggml.pre`) of BPE vocabularies whose
/// regexes llama.cpp splits by hand (`unicode_regex_split_custom`), so
/// tokenizing them needs no deep stack; every other BPE pre-tokenizer
/// falls back to `std::regex`. The groups follow llama-vocab.cpp's mapping
/// to the GPT-2, Llama 3 and Qwen 2 regexes; `tests/hardening.rs` tokenizes
/// long runs on a small stack with each vocabulary fixture of the list.
const HAND_SPLIT_PRE_TOKENIZERS: &[&str] = &[
    // GPT-2's regex.
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "granite-docling",
    // Llama 3's regex.
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    // Qwen 2's regex.
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "stablelm2",
    // Checked with their fixtures only.
    "starcoder",
    "refact",
    "command-r",
];

// SAFETY: the vocab is read-only after load; tokenize, detokenize and
// token_to_piece are documented thread-safe in llama.h, the other getters
// are pure reads (llama-cpp-c-api.md §1.3, §1.17). It lives inside `Model`,
// whose Send/Sync reasoning covers the pointer's lifetime.
unsafe impl Send for Vocab {}
// SAFETY: see `Send` above.
unsafe impl Sync for Vocab {}

impl fmt::Debug for Vocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocab").field("n_tokens", &self.n_tokens).finish()
    }
}

macro_rules! special_tokens {
    ($($(#[$doc:meta])* $name:ident => $func:ident;)*) => {$(
        $(#[$doc])*
        #[doc = concat!("\n\nWraps `", stringify!($func), "`; `None` when the model has none.")]
        pub fn $name(&self) -> Option<Token> {
            // SAFETY: a pure read of the live vocab; returns -1 when absent.
            let t = unsafe { sys::$func(self.ptr.as_ptr()) };
            (t >= 0 && t < self.n_tokens).then_some(Token(t))
        }
    )*};
}

impl Vocab {
    /// # Safety
    /// `ptr` must be the vocab of a model that outlives the returned value.
    pub(crate) unsafe fn from_raw(ptr: *const sys::llama_vocab) -> Vocab {
        let ptr = NonNull::new(ptr.cast_mut()).expect("llama_model_get_vocab never returns NULL");
        // SAFETY: `ptr` is a live vocab (caller's contract).
        let (n_tokens, kind) =
            unsafe { (sys::llama_vocab_n_tokens(ptr.as_ptr()), sys::llama_vocab_type(ptr.as_ptr())) };
        Vocab {
            ptr,
            n_tokens,
            has_vocab: kind != sys::llama_vocab_type::LLAMA_VOCAB_TYPE_NONE,
            regex_split: kind == sys::llama_vocab_type::LLAMA_VOCAB_TYPE_BPE,
            extensions: Extensions::default(),
        }
    }

    /// The caches upper floors keep for this vocabulary, one per type.
    pub(crate) fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// Records the model's pre-tokenizer name (`tokenizer.ggml.pre`): a
    /// BPE vocabulary split by hand needs no deep stack to tokenize.
    pub(crate) fn set_pre_tokenizer(&mut self, pre: Option<&str>) {
        if pre.is_some_and(|p| HAND_SPLIT_PRE_TOKENIZERS.contains(&p)) {
            self.regex_split = false;
        }
    }

    /// Whether tokenizing goes through `std::regex` (for tests).
    #[doc(hidden)]
    pub fn splits_with_regex(&self) -> bool {
        self.regex_split
    }

    /// The raw pointer, for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *const sys::llama_vocab {
        self.ptr.as_ptr()
    }

    /// The number of tokens.
    #[doc(alias = "llama_vocab_n_tokens")]
    pub fn n_tokens(&self) -> usize {
        self.n_tokens.max(0) as usize
    }

    /// `Ok(token)` if it is inside the vocabulary.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] otherwise.
    pub fn check(&self, token: Token) -> Result<Token> {
        if token.0 >= 0 && token.0 < self.n_tokens {
            Ok(token)
        } else {
            Err(Error::InvalidToken { token: token.0, n_vocab: self.n_tokens })
        }
    }

    fn check_with_text(&self, token: Token) -> Result<Token> {
        self.check_has_tokenizer()?;
        self.check(token)
    }

    /// A vocabulary of type NONE has no tokenizer, and llama.cpp asserts on
    /// every call that needs one (tokenizing, token texts, grammar token
    /// literals).
    pub(crate) fn check_has_tokenizer(&self) -> Result<()> {
        if self.has_vocab { Ok(()) } else { Err(Error::InvalidArgument("the model has no vocabulary".into())) }
    }

    /// Tokenizes `text`. Control tokens written in the text (such as
    /// `<start_of_turn>`) are treated as plain text, so untrusted input
    /// cannot inject them; use [`Vocab::tokenize_special`] for trusted
    /// templates. [`AddBos::Yes`] adds the model's start token(s) when the
    /// model asks for them.
    ///
    /// Tokenizers whose pre-tokenizer falls back to `std::regex` (BPE
    /// vocabularies other than the GPT-2, Llama 3 and Qwen 2 families, such
    /// as deepseek-llm) recurse once per character of a match; for long
    /// text they run on a helper thread with a stack sized for it (about
    /// 1.3 KB per byte of address space, touched only as deep as needed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for text over 2 GiB or a model without a
    /// vocabulary; [`Error::InputTooLarge`] for text whose regex
    /// pre-tokenizer would need more than 16 GiB of stack (about 12 MiB of
    /// text: tokenize it in pieces); [`Error::OutOfMemory`] if the token
    /// buffer cannot be allocated.
    #[doc(alias = "llama_tokenize")]
    pub fn tokenize(&self, text: &str, add_bos: AddBos) -> Result<Vec<Token>> {
        let mut out = Vec::new();
        self.tokenize_into(text, add_bos, Special::Plain, &mut out)?;
        Ok(out)
    }

    /// Tokenizes `text`, turning control-token text like `<start_of_turn>`
    /// into the control tokens. Only for trusted text.
    ///
    /// # Errors
    /// As [`Vocab::tokenize`].
    pub fn tokenize_special(&self, text: &str, add_bos: AddBos) -> Result<Vec<Token>> {
        let mut out = Vec::new();
        self.tokenize_into(text, add_bos, Special::Markup, &mut out)?;
        Ok(out)
    }

    /// Tokenizes a prompt rendered by a chat template
    /// (`ChatFormat::render`): control-token
    /// text becomes control tokens ([`Special::Markup`]: the template is
    /// trusted, the messages inside it are not checked), and the model's
    /// BOS is added unless the template already wrote it (most templates
    /// start with `{{ bos_token }}`; tokenizing with [`AddBos::Yes`] then
    /// would give two).
    ///
    /// # Errors
    /// As [`Vocab::tokenize`].
    pub fn tokenize_chat(&self, rendered: &str) -> Result<Vec<Token>> {
        let mut tokens = self.tokenize_special(rendered, AddBos::No)?;
        self.chat_bos(&mut tokens)?;
        Ok(tokens)
    }

    /// The crate's one BOS rule for chat prompts: the model's BOS first,
    /// where the vocabulary adds one, unless the template wrote it already.
    /// (Only BOS: `AddBos::Yes` would also append the EOS of vocabularies
    /// that add one, ending the prompt before the reply.)
    pub(crate) fn chat_bos(&self, tokens: &mut Vec<Token>) -> Result<()> {
        if self.adds_bos()
            && let Some(bos) = self.bos()
            && tokens.first() != Some(&bos)
        {
            try_reserve(tokens, 1)?;
            tokens.insert(0, bos);
        }
        Ok(())
    }

    /// The stack a tokenization of `text_len` bytes needs (llama.cpp's
    /// hand-written BPE pre-tokenizer regexes recurse per byte).
    #[cfg(feature = "mtmd")]
    pub(crate) fn tokenize_stack(&self, text_len: usize) -> usize {
        if self.regex_split { text_len.saturating_mul(REGEX_STACK_PER_BYTE) } else { 0 }
    }

    /// Tokenizes `text`, replacing the contents of `out` (its allocation is
    /// reused); `special` says whether control-token text becomes control
    /// tokens ([`Special::Markup`], as [`Vocab::tokenize_special`]).
    ///
    /// # Errors
    /// As [`Vocab::tokenize`].
    pub fn tokenize_into(&self, text: &str, add_bos: AddBos, special: Special, out: &mut Vec<Token>) -> Result<()> {
        self.check_has_tokenizer()?;
        let (add_bos, parse_special) = (add_bos == AddBos::Yes, special == Special::Markup);
        let len = i32::try_from(text.len()).map_err(|_| Error::InvalidArgument("text longer than 2 GiB".into()))?;
        out.clear();
        let stack = if self.regex_split { text.len().saturating_mul(REGEX_STACK_PER_BYTE) } else { 0 };
        // A token covers at least one byte, plus BOS/EOS.
        let mut capacity = text.len() + 2;
        loop {
            try_reserve(out, capacity)?;
            let cap = i32::try_from(out.capacity()).unwrap_or(i32::MAX);
            let buf = SendPtr(out.as_mut_ptr());
            let vocab = self;
            let n = with_stack("the text to tokenize", stack, move || {
                let mut n = 0;
                // SAFETY: `text` is valid for `len` bytes (no NUL needed);
                // `buf` has room for `cap` tokens (the caller waits for this
                // call and does not touch `out` meanwhile), and `Token` is a
                // `repr(transparent)` i32 like `llama_token`.
                let code = unsafe {
                    sys::shim::llama_rs_tokenize(
                        vocab.as_ptr(),
                        text.as_ptr().cast(),
                        len,
                        buf.get().cast(),
                        cap,
                        add_bos,
                        parse_special,
                        &mut n,
                    )
                };
                // The exception message is kept by the thread that caught it.
                check_shim(code, "llama_tokenize").map(|()| n)
            })??;
            if n >= 0 {
                // SAFETY: llama.cpp wrote `n <= cap` tokens.
                unsafe { out.set_len(n as usize) };
                return Ok(());
            }
            if n == i32::MIN {
                return Err(Error::InvalidArgument("tokenization overflowed i32".into()));
            }
            capacity = (-n) as usize;
        }
    }

    /// The bytes a token stands for. They can be part of a UTF-8 character
    /// (byte tokens); use [`Vocab::decode`] for the text of whole tokens and
    /// [`Detokenizer`] to stream it. With [`Special::Plain`], control
    /// tokens give no bytes.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    #[doc(alias = "llama_token_to_piece")]
    pub fn token_to_piece(&self, token: Token, special: Special) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.append_piece(token, special, &mut out)?;
        Ok(out)
    }

    /// Appends the bytes of `token` to `out` without clearing it.
    ///
    /// # Errors
    /// As [`Vocab::token_to_piece`].
    pub fn append_piece(&self, token: Token, special: Special, out: &mut Vec<u8>) -> Result<()> {
        self.check_with_text(token)?;
        let special = special == Special::Markup;
        let start = out.len();
        let mut room = 32usize;
        loop {
            out.resize(start + room, 0);
            let mut n = 0;
            // SAFETY: the token is in range; `out[start..]` has `room`
            // writable bytes; the shim catches exceptions.
            let code = unsafe {
                sys::shim::llama_rs_token_to_piece(
                    self.as_ptr(),
                    token.0,
                    out.as_mut_ptr().add(start).cast(),
                    room as i32,
                    0,
                    special,
                    &mut n,
                )
            };
            if let Err(e) = check_shim(code, "llama_token_to_piece") {
                out.truncate(start);
                return Err(e);
            }
            if n >= 0 {
                out.truncate(start + n as usize);
                return Ok(());
            }
            room = (-n) as usize;
        }
    }

    /// The text of `tokens`, as a whole text: the inverse of
    /// [`Vocab::tokenize`] (BOS and other control tokens give nothing),
    /// through llama.cpp's detokenizer, which also undoes what the
    /// tokenizer adds (the space a SentencePiece vocabulary puts before the
    /// first word; the spaces some BPE vocabularies clean up around
    /// punctuation). Lossless for text that tokenizes losslessly; bytes
    /// that are not valid UTF-8 (tokens that end inside a character) become
    /// U+FFFD. To show generated text as it comes, stream it with a
    /// [`Detokenizer`], which renders every token with its own leading
    /// space.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), llamacpp::Error> {
    /// # let model = llamacpp::Model::load("model.gguf", &llamacpp::ModelParams::default())?;
    /// use llamacpp::AddBos;
    /// let tokens = model.vocab().tokenize("Hello, world", AddBos::Yes)?;
    /// assert_eq!(model.vocab().decode(&tokens)?, "Hello, world");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    pub fn decode(&self, tokens: &[Token]) -> Result<String> {
        // Skip a leading BOS here: llama.cpp's own removal of it keeps the
        // space the tokenizer added before the first word.
        let tokens = match (tokens.first(), self.bos()) {
            (Some(&first), Some(bos)) if first == bos => &tokens[1..],
            _ => tokens,
        };
        self.detokenize(tokens, AddBos::No, Special::Plain)
    }

    /// Turns tokens back into text with llama.cpp's detokenizer, which
    /// also applies the tokenizer's clean-up (spaces around punctuation for
    /// some vocabularies); invalid UTF-8 becomes U+FFFD. [`AddBos::Yes`]
    /// drops the start/end tokens a tokenization with [`AddBos::Yes`]
    /// added; [`Special::Markup`] renders control tokens as their text.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    #[doc(alias = "llama_detokenize")]
    pub fn detokenize(&self, tokens: &[Token], added: AddBos, special: Special) -> Result<String> {
        let (remove_special, unparse_special) = (added == AddBos::Yes, special == Special::Markup);
        for &t in tokens {
            self.check_with_text(t)?;
        }
        let n_tokens = i32::try_from(tokens.len()).map_err(|_| Error::InvalidArgument("too many tokens".into()))?;
        let mut buf = Vec::new();
        let mut room = tokens.len().saturating_mul(8).saturating_add(16);
        loop {
            buf.clear();
            try_reserve(&mut buf, room)?;
            buf.resize(room, 0);
            let cap = i32::try_from(buf.len()).unwrap_or(i32::MAX);
            let mut n = 0;
            // SAFETY: all tokens are in range; `buf` has `cap` writable bytes.
            let code = unsafe {
                sys::shim::llama_rs_detokenize(
                    self.as_ptr(),
                    tokens.as_ptr().cast(),
                    n_tokens,
                    buf.as_mut_ptr().cast(),
                    cap,
                    remove_special,
                    unparse_special,
                    &mut n,
                )
            };
            check_shim(code, "llama_detokenize")?;
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(String::from_utf8_lossy(&buf).into_owned());
            }
            room = (-n) as usize;
        }
    }

    /// The stored text of a token (e.g. `▁the`, `<0x0A>`).
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    #[doc(alias = "llama_vocab_get_text")]
    pub fn text(&self, token: Token) -> Result<&str> {
        self.check_with_text(token)?;
        let mut ptr = std::ptr::null();
        // SAFETY: the token is in range; the shim catches exceptions.
        let code = unsafe { sys::shim::llama_rs_vocab_get_text(self.as_ptr(), token.0, &mut ptr) };
        check_shim(code, "llama_vocab_get_text")?;
        // SAFETY: NULL, or a string in the vocab, which outlives `&self`.
        Ok(unsafe { crate::llama::ffi::borrowed_str(ptr) }.unwrap_or(""))
    }

    /// The token's score (SentencePiece log-probability).
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    #[doc(alias = "llama_vocab_get_score")]
    pub fn score(&self, token: Token) -> Result<f32> {
        self.check_with_text(token)?;
        let mut score = 0.0;
        // SAFETY: the token is in range; the shim catches exceptions.
        let code = unsafe { sys::shim::llama_rs_vocab_get_score(self.as_ptr(), token.0, &mut score) };
        check_shim(code, "llama_vocab_get_score")?;
        Ok(score)
    }

    /// The token's attribute bits.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for an id outside the vocabulary.
    #[doc(alias = "llama_vocab_get_attr")]
    pub fn attrs(&self, token: Token) -> Result<TokenAttrs> {
        self.check_with_text(token)?;
        let mut attr = 0;
        // SAFETY: the token is in range; the shim catches exceptions.
        let code = unsafe { sys::shim::llama_rs_vocab_get_attr(self.as_ptr(), token.0, &mut attr) };
        check_shim(code, "llama_vocab_get_attr")?;
        Ok(TokenAttrs(attr))
    }

    /// Whether the token ends generation (EOS, EOT, …). False for ids
    /// outside the vocabulary.
    #[doc(alias = "llama_vocab_is_eog")]
    pub fn is_eog(&self, token: Token) -> bool {
        // SAFETY: is_eog looks the id up in a set; any id is safe.
        self.check(token).is_ok() && unsafe { sys::llama_vocab_is_eog(self.as_ptr(), token.0) }
    }

    /// Whether the token is a control token. False for ids outside the
    /// vocabulary.
    #[doc(alias = "llama_vocab_is_control")]
    pub fn is_control(&self, token: Token) -> bool {
        // SAFETY: the id is checked first; is_control reads its attribute.
        self.check_with_text(token).is_ok() && unsafe { sys::llama_vocab_is_control(self.as_ptr(), token.0) }
    }

    /// Whether tokenizing with `add_bos` adds a start token.
    #[doc(alias = "llama_vocab_get_add_bos")]
    pub fn adds_bos(&self) -> bool {
        // SAFETY: a pure read of the live vocab.
        unsafe { sys::llama_vocab_get_add_bos(self.as_ptr()) }
    }

    /// Whether tokenizing with `add_bos` adds separator tokens (BERT-style
    /// pairs).
    #[doc(alias = "llama_vocab_get_add_sep")]
    pub fn adds_sep(&self) -> bool {
        // SAFETY: a pure read of the live vocab.
        unsafe { sys::llama_vocab_get_add_sep(self.as_ptr()) }
    }

    /// Whether tokenizing with `add_bos` also appends an end token.
    #[doc(alias = "llama_vocab_get_add_eos")]
    pub fn adds_eos(&self) -> bool {
        // SAFETY: a pure read of the live vocab.
        unsafe { sys::llama_vocab_get_add_eos(self.as_ptr()) }
    }

    special_tokens! {
        /// The beginning-of-sequence token.
        bos => llama_vocab_bos;
        /// The end-of-sequence token.
        eos => llama_vocab_eos;
        /// The end-of-turn token.
        eot => llama_vocab_eot;
        /// The sentence separator.
        sep => llama_vocab_sep;
        /// The newline token.
        nl => llama_vocab_nl;
        /// The padding token.
        pad => llama_vocab_pad;
        /// The mask token.
        mask => llama_vocab_mask;
        /// Fill-in-the-middle: prefix marker.
        fim_pre => llama_vocab_fim_pre;
        /// Fill-in-the-middle: suffix marker.
        fim_suf => llama_vocab_fim_suf;
        /// Fill-in-the-middle: middle marker.
        fim_mid => llama_vocab_fim_mid;
        /// Fill-in-the-middle: padding.
        fim_pad => llama_vocab_fim_pad;
        /// Fill-in-the-middle: repository marker.
        fim_rep => llama_vocab_fim_rep;
        /// Fill-in-the-middle: file separator.
        fim_sep => llama_vocab_fim_sep;
    }
}
