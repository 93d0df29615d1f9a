//! Issue 3: no safe call aborts the process on bad input.
//!
//! Each test drives one of llama.cpp's abort or throw paths (survey §1.18,
//! §4) from safe code and checks that it comes back as an `Err`, and that
//! the objects involved keep working afterwards. An abort would kill the
//! whole test binary, so each case runs in a child process
//! (`safe_api::isolated`): one that aborts fails alone, by name, with the
//! child's output, and the other cases still run. One module per subject.

mod batch;
mod context;
mod encoder;
mod model_file;
#[cfg(feature = "mtmd")]
mod projector;
mod recurrent;
mod sampler;
mod state;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use llama_suite::safe_api::*;
use llama_suite::synthetic::{GgufWriter, TINY_BOS_ID, TINY_EOS_ID, TINY_VOCAB_SIZE};
use llamacpp::{
    AddBos, Batch, ContextParams, Detokenizer, Error, Logits, MetadataValue, Model, ModelParams, Output, Pooling,
    Sampler, SamplerChain, Special, StateError, Token,
};

/// A context over the tiny model with `n_seq` sequences.
fn ctx_with_seqs(model: &Model, n_seq: u32, kv_unified: bool) -> llamacpp::Context<'_> {
    model.new_context(&small_params().n_ctx(256 * n_seq).n_seq_max(n_seq).kv_unified(kv_unified)).expect("context")
}
