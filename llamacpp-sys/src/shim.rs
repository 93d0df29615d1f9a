//! The exception barrier: twins of the llama.cpp calls that can throw a C++
//! exception through the C ABI (`shim/shim.cpp`).
//!
//! Each returns [`OK`] when the wrapped call returned (its result is in the
//! last, out-parameter) or [`EXCEPTION`] when it threw; then
//! [`llama_rs_last_exception`] gives the exception's message on this thread.

use crate::*;
use std::os::raw::{c_char, c_int};

/// The wrapped call returned normally.
pub const OK: c_int = 0;
/// The wrapped call threw a C++ exception, which the shim caught.
pub const EXCEPTION: c_int = -1;

/// One buffer type's share of a context's memory
/// (`llama_memory_breakdown_data` of `src/llama-ext.h`, keyed by its buffer
/// type).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_rs_buffer_memory {
    /// The buffer type (which device's memory, and of what kind).
    pub buft: ggml_backend_buffer_type_t,
    /// Bytes of model weights.
    pub model: usize,
    /// Bytes of the context's memory (KV cache, recurrent state).
    pub context: usize,
    /// Bytes of compute buffers.
    pub compute: usize,
}

unsafe extern "C" {
    /// The message of the last exception caught on this thread; `""` if none.
    /// Valid until the next shim call on this thread.
    pub fn llama_rs_last_exception() -> *const c_char;
    /// Makes the next shim call on this thread throw inside its `try`
    /// block. For tests of the barrier itself.
    pub fn llama_rs_shim_inject_exception();

    /// `llama_decode` behind the barrier: its return value in `result`.
    pub fn llama_rs_decode(ctx: *mut llama_context, batch: llama_batch, result: *mut i32) -> c_int;

    /// Installs the RPC guard's abort hook (once): 0, or -1 on platforms
    /// without the guard. See shim/shim.cpp ("The RPC guard"): while a
    /// guarded call is in flight, a worker that dies ends the dispatcher
    /// thread of its connection instead of the process, and the call that
    /// waited for it never returns.
    pub fn llama_rs_rpc_guard_install() -> c_int;
    /// Marks this thread as making a guarded call; `catches`: a C++ catch
    /// lies between llama.cpp and the caller (a failed connect may throw).
    pub fn llama_rs_rpc_guard_begin(catches: bool);
    /// Ends the guarded call begun on this thread.
    pub fn llama_rs_rpc_guard_end();
    /// Counts out a guarded call that will never end (from another thread).
    pub fn llama_rs_rpc_guard_abandon();
    /// How many dispatcher threads the guard has ended in this process.
    pub fn llama_rs_rpc_failures() -> u64;
    /// `llama_rs_decode`, synchronized before it returns. Call it between
    /// `llama_rs_rpc_guard_begin(true)` and `llama_rs_rpc_guard_end` on
    /// this thread. May never return when a worker dies: run it on a
    /// thread that can be abandoned, with everything it reads leaked.
    pub fn llama_rs_rpc_decode(ctx: *mut llama_context, batch: llama_batch, result: *mut i32) -> c_int;
    /// `llama_rs_encode` likewise.
    pub fn llama_rs_rpc_encode(ctx: *mut llama_context, batch: llama_batch, result: *mut i32) -> c_int;
    /// `llama_encode` behind the barrier: its return value in `result`.
    pub fn llama_rs_encode(ctx: *mut llama_context, batch: llama_batch, result: *mut i32) -> c_int;
    /// `llama_tokenize` behind the barrier: its return value in `result`.
    pub fn llama_rs_tokenize(
        vocab: *const llama_vocab,
        text: *const c_char,
        text_len: i32,
        tokens: *mut llama_token,
        n_tokens_max: i32,
        add_special: bool,
        parse_special: bool,
        result: *mut i32,
    ) -> c_int;
    /// `llama_token_to_piece` behind the barrier: its return value in `result`.
    pub fn llama_rs_token_to_piece(
        vocab: *const llama_vocab,
        token: llama_token,
        buf: *mut c_char,
        length: i32,
        lstrip: i32,
        special: bool,
        result: *mut i32,
    ) -> c_int;
    /// `llama_detokenize` behind the barrier: its return value in `result`.
    pub fn llama_rs_detokenize(
        vocab: *const llama_vocab,
        tokens: *const llama_token,
        n_tokens: i32,
        text: *mut c_char,
        text_len_max: i32,
        remove_special: bool,
        unparse_special: bool,
        result: *mut i32,
    ) -> c_int;
    /// `llama_vocab_get_text` behind the barrier: its return value in `result`.
    pub fn llama_rs_vocab_get_text(vocab: *const llama_vocab, token: llama_token, result: *mut *const c_char) -> c_int;
    /// `llama_vocab_get_score` behind the barrier: its return value in `result`.
    pub fn llama_rs_vocab_get_score(vocab: *const llama_vocab, token: llama_token, result: *mut f32) -> c_int;
    /// `llama_vocab_get_attr` behind the barrier: its return value in `result`.
    pub fn llama_rs_vocab_get_attr(
        vocab: *const llama_vocab,
        token: llama_token,
        result: *mut llama_token_attr::Type,
    ) -> c_int;
    /// `llama_chat_apply_template` behind the barrier: its return value in `result`.
    pub fn llama_rs_chat_apply_template(
        tmpl: *const c_char,
        chat: *const llama_chat_message,
        n_msg: usize,
        add_ass: bool,
        buf: *mut c_char,
        length: i32,
        result: *mut i32,
    ) -> c_int;
    /// `llama_sampler_init_grammar` behind the barrier: its return value in `result`.
    pub fn llama_rs_sampler_init_grammar(
        vocab: *const llama_vocab,
        grammar_str: *const c_char,
        grammar_root: *const c_char,
        result: *mut *mut llama_sampler,
    ) -> c_int;
    /// `llama_sampler_init_grammar_lazy_patterns` behind the barrier: its return value in `result`.
    pub fn llama_rs_sampler_init_grammar_lazy_patterns(
        vocab: *const llama_vocab,
        grammar_str: *const c_char,
        grammar_root: *const c_char,
        trigger_patterns: *mut *const c_char,
        num_trigger_patterns: usize,
        trigger_tokens: *const llama_token,
        num_trigger_tokens: usize,
        result: *mut *mut llama_sampler,
    ) -> c_int;
    /// `llama_sampler_accept` behind the barrier: its return value in `result`.
    pub fn llama_rs_sampler_accept(smpl: *mut llama_sampler, token: llama_token) -> c_int;
    /// `llama_sampler_apply` behind the barrier: its return value in `result`.
    pub fn llama_rs_sampler_apply(smpl: *mut llama_sampler, cur_p: *mut llama_token_data_array) -> c_int;
    /// `llama_sampler_sample` behind the barrier: its return value in `result`.
    pub fn llama_rs_sampler_sample(
        smpl: *mut llama_sampler,
        ctx: *mut llama_context,
        idx: i32,
        result: *mut llama_token,
    ) -> c_int;
    /// `llama_model_save_to_file` behind the barrier.
    pub fn llama_rs_model_save_to_file(model: *const llama_model, path_model: *const c_char) -> c_int;
    /// `llama_load_mode_from_str` behind the barrier: its return value in `result`.
    pub fn llama_rs_load_mode_from_str(s: *const c_char, result: *mut llama_load_mode::Type) -> c_int;
    /// `llama_state_seq_set_data_ext` behind the barrier: its return value in `result`.
    pub fn llama_rs_state_seq_set_data_ext(
        ctx: *mut llama_context,
        src: *const u8,
        size: usize,
        dest_seq_id: llama_seq_id,
        flags: llama_state_seq_flags,
        result: *mut usize,
    ) -> c_int;
    /// `llama_set_adapters_lora` behind the barrier: its return value in `result`.
    pub fn llama_rs_set_adapters_lora(
        ctx: *mut llama_context,
        adapters: *mut *mut llama_adapter_lora,
        n_adapters: usize,
        scales: *mut f32,
        result: *mut i32,
    ) -> c_int;
    /// `ggml_backend_dev_buffer_type(dev)` behind the barrier (for
    /// ggml-vulkan, the device's initialization, which may throw).
    pub fn llama_rs_dev_buffer_type(dev: ggml_backend_dev_t, result: *mut ggml_backend_buffer_type_t) -> c_int;
    /// Writes at most `capacity` entries of `llama_get_memory_breakdown(ctx)`
    /// to `out` and the number of entries to `*count`.
    pub fn llama_rs_get_memory_breakdown(
        ctx: *const llama_context,
        out: *mut llama_rs_buffer_memory,
        capacity: usize,
        count: *mut usize,
    ) -> c_int;
}
