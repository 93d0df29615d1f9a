//! `apply_builtin_template` with an arbitrary template name / Jinja string.
//!
//! Input: byte 0 = flags (bit 0 add_assistant, bits 1..3 message count),
//! then `template \0 content \0 role` (later parts optional).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamacpp::{ChatMessage, apply_builtin_template};
use llama_fuzz::{split_nul, text};

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let parts = split_nul(rest, 3);
    let template = text(parts[0]);
    let content = parts.get(1).map_or_else(|| "Hello, how are you?".to_owned(), |p| text(p));
    let odd_role = parts.get(2).map(|p| text(p));
    let n = usize::from((head >> 1) & 7);
    let roles = ["system", "user", "assistant", "user", "tool"];
    let mut messages: Vec<ChatMessage> =
        (0..n).map(|i| ChatMessage::new(roles[i % roles.len()], format!("{content} #{i}"))).collect();
    if let Some(role) = odd_role {
        messages.push(ChatMessage::new(role, content.clone()));
    }
    let _ = apply_builtin_template(&template, &messages, head & 1 != 0);
    let _ = apply_builtin_template(&template, &[], head & 1 == 0);
});
