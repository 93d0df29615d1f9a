//! llama.cpp's built-in chat templates: a fixed list of well-known formats
//! matched by name or by looking at a template's text (no Jinja is run).

use std::ffi::{CString, c_char};

use super::ChatMessage;
use crate::error::{Error, Result, try_reserve};
use crate::llama::ffi::check_shim;
use crate::sys;

/// Formats `messages` with llama.cpp's built-in `template`: a name (see
/// [`builtin_chat_templates`]) or a Jinja template string, which llama.cpp
/// matches to one of its known formats without running it (so a template
/// it does not know is an error, and one it mistakes renders wrongly: use
/// [`ChatTemplate`](super::ChatTemplate) to run a template). Only the text
/// of each message is used (text parts joined). With `add_assistant`, the
/// result ends with the opening of an assistant turn.
///
/// # Errors
/// [`Error::ChatTemplate`] if the template is not recognised;
/// [`Error::Nul`] if a string holds a NUL byte.
#[doc(alias = "llama_chat_apply_template")]
pub fn apply_builtin_template(template: &str, messages: &[ChatMessage], add_assistant: bool) -> Result<String> {
    let tmpl = CString::new(template)?;
    let owned = messages
        .iter()
        .map(|m| Ok((CString::new(m.role.as_str())?, CString::new(m.text())?)))
        .collect::<Result<Vec<_>>>()?;
    let raw: Vec<sys::llama_chat_message> =
        owned.iter().map(|(r, c)| sys::llama_chat_message { role: r.as_ptr(), content: c.as_ptr() }).collect();
    let guess =
        owned.iter().map(|(r, c)| c.as_bytes().len() + r.as_bytes().len() + 32).fold(64usize, usize::saturating_add);
    let mut buf = Vec::new();
    try_reserve(&mut buf, guess)?;
    buf.resize(guess, 0);
    for _ in 0..2 {
        let mut n = 0;
        // SAFETY: NUL-terminated template and message strings that outlive
        // the call; `buf` has `buf.len()` writable bytes; the shim catches
        // exceptions.
        let code = unsafe {
            sys::shim::llama_rs_chat_apply_template(
                tmpl.as_ptr(),
                raw.as_ptr(),
                raw.len(),
                add_assistant,
                buf.as_mut_ptr().cast::<c_char>(),
                i32::try_from(buf.len()).unwrap_or(i32::MAX),
                &mut n,
            )
        };
        check_shim(code, "llama_chat_apply_template")?;
        if n < 0 {
            return Err(Error::ChatTemplate("the chat template is not one llama.cpp knows".into()));
        }
        let n = n as usize;
        if n <= buf.len() {
            buf.truncate(n);
            return String::from_utf8(buf).map_err(|_| Error::ChatTemplate("formatted chat is not UTF-8".into()));
        }
        let more = n - buf.len();
        try_reserve(&mut buf, more)?;
        buf.resize(n, 0);
    }
    Err(Error::ChatTemplate("the formatted chat kept growing".into()))
}

/// The names of llama.cpp's built-in chat templates (`chatml`, `llama3`,
/// `gemma`, …).
#[doc(alias = "llama_chat_builtin_templates")]
pub fn builtin_chat_templates() -> Vec<&'static str> {
    // SAFETY: with a NULL array and length 0 it only returns the count.
    let n = unsafe { sys::llama_chat_builtin_templates(std::ptr::null_mut(), 0) }.max(0) as usize;
    let mut ptrs = vec![std::ptr::null(); n];
    // SAFETY: `ptrs` has room for `n` pointers to static strings.
    unsafe { sys::llama_chat_builtin_templates(ptrs.as_mut_ptr(), n) };
    ptrs.into_iter()
        // SAFETY: the names are NULL or static NUL-terminated strings.
        .filter_map(|p| unsafe { crate::llama::ffi::borrowed_str(p) })
        .collect()
}
