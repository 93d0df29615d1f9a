//! The in-process backend: `llamacpp::engine::Engine` driven directly, the
//! choice a Rust application makes when it embeds the engine instead of
//! running llama-server beside it.

use std::sync::Arc;
use std::time::Instant;

use llamacpp::engine::{Engine, EngineConfig, Event, Request};
use llamacpp::generate::FinishReason;
use llamacpp::{KvType, Model, ModelParams, Token};

use super::backend::{Backend, Completion};

/// The engine's settings that the driver's shared options decide.
#[derive(Debug)]
pub struct EngineOptions {
    pub model: std::path::PathBuf,
    pub threads: usize,
    pub ctx: usize,
    pub parallel: usize,
    pub batch: usize,
    pub ubatch: usize,
    pub prefill_cap: Option<usize>,
    pub gpu_layers: Option<i32>,
    pub kv_type: KvType,
}

#[derive(Debug)]
pub struct EngineBackend {
    engine: Engine,
}

impl EngineBackend {
    pub fn new(o: &EngineOptions) -> Result<Self, String> {
        let mut config = EngineConfig::default()
            .n_ctx(o.ctx as u32)
            .n_batch(o.batch as u32)
            .n_ubatch(o.ubatch as u32)
            .max_running(o.parallel as u32)
            .n_threads(o.threads as i32)
            .kv_type(o.kv_type);
        if let Some(cap) = o.prefill_cap {
            config = config.prefill_cap(cap as u32);
        }
        // What fits beside the engine's context, unless a count is given.
        let mut params = ModelParams::default().fit_context(config.context_params());
        if let Some(n) = o.gpu_layers {
            params = params.n_gpu_layers(n);
        }
        let model = Model::load(&o.model, &params).map_err(|e| e.to_string())?;
        let engine = Engine::start(Arc::new(model), config).map_err(|e| e.to_string())?;
        eprintln!(
            "serve_bench: engine: {} KV cells, up to {} sequences, step budget {} tokens, prefill cap {} while decoding",
            engine.pool_cells(),
            o.parallel,
            o.batch,
            o.prefill_cap.unwrap_or(o.batch / 4)
        );
        Ok(EngineBackend { engine })
    }
}

impl Drop for EngineBackend {
    fn drop(&mut self) {
        let s = self.engine.stats();
        eprintln!(
            "serve_bench: engine: {} steps, {} preemptions, {} prefix-hit tokens, {} prompt tokens evaluated, \
             KV {}/{} cells ({} in {} cached prefixes)",
            s.steps,
            s.preemptions,
            s.prefix_hit_tokens,
            s.prompt_tokens_evaluated,
            s.kv_cells_used,
            s.kv_cells_total,
            s.cached_prefix_cells,
            s.cached_prefixes
        );
    }
}

impl Backend for EngineBackend {
    fn name(&self) -> &str {
        "engine"
    }

    fn run(&self, prompt: &[i32], n_predict: usize, on_token: &mut dyn FnMut(Instant)) -> Result<Completion, String> {
        let prompt: Vec<Token> = prompt.iter().map(|&t| Token(t)).collect();
        let request = Request::tokens(prompt).max_tokens(n_predict).stop_at_eog(false);
        let completion = self.engine.submit(request).map_err(|e| e.to_string())?;
        for event in completion {
            match event {
                Event::Piece(piece) => {
                    if piece.token.is_some() {
                        on_token(Instant::now());
                    }
                }
                Event::Done(done) => {
                    if !matches!(done.reason, FinishReason::Length) {
                        return Err(format!("the request ended early: {}", done.reason));
                    }
                    return Ok(Completion {
                        reported_tokens: Some(done.usage.completion_tokens),
                        cached_prompt_tokens: Some(done.usage.cached_tokens),
                    });
                }
            }
        }
        Err("the completion ended without a final event".to_owned())
    }
}
