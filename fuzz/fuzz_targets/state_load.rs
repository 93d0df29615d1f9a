//! Loading context state from arbitrary bytes (whole-context and
//! per-sequence), then decoding one token: must never crash.
//!
//! Input: byte 0 = mode (bits 0..1: which loader and context, bit 2: the
//! destination sequence), then the state bytes.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use llamacpp::{Batch, Context, Logits, Output, Token};
use llama_fuzz::{ctx_params, tiny_model};

thread_local! {
    /// `[one sequence, two sequences]`, created once and cleared per input.
    static CTXS: RefCell<[Context<'static>; 2]> = RefCell::new([
        tiny_model().new_context(&ctx_params(1)).expect("context"),
        tiny_model().new_context(&ctx_params(2)).expect("context"),
    ]);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, state)) = data.split_first() else { return };
    CTXS.with(|c| {
        let mut ctxs = c.borrow_mut();
        let which = usize::from(mode & 1);
        let ctx = &mut ctxs[which];
        let seq = if which == 1 { i32::from((mode >> 2) & 1) } else { 0 };
        let loaded = if mode & 2 == 0 { ctx.load_state(state) } else { ctx.load_seq_state(state, seq) };
        if loaded.is_ok() {
            let _ = ctx.seq_pos_min(seq);
            let _ = ctx.save_state();
            let _ = ctx.save_seq_state(seq);
        }
        // Decode one token after the last position of `seq`, whatever the
        // load did: llama.cpp must refuse a bad batch, not assert.
        let next = match ctx.seq_pos_max(seq) {
            Ok(Some(p)) => p.saturating_add(1),
            _ => 0,
        };
        let mut batch = Batch::new(1, 1);
        if batch.push(Token(i32::from(mode >> 3) + 3), next, &[seq], Logits::Yes).is_ok() && ctx.decode(&batch).is_ok()
        {
            let _ = ctx.logits(Output::Last);
        }
        ctx.clear_kv();
    });
});
