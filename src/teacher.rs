//! Checks for batched decoding that do not depend on exact rounding.
//!
//! Batched and single-sequence decoding round differently inside ggml, so
//! a greedy stream run among others can pick a different token where the
//! top two are nearly tied, and from there continue differently. The
//! teacher-forced check asks instead whether every token a stream chose was
//! (nearly) the best choice given the tokens before it: it re-scores the
//! stream in a single-sequence run and measures, at each position, how far
//! the chosen token's logit is below the best one. A stream that read
//! another sequence's cells, or the wrong positions, fails it by far more
//! than rounding can explain.

use llamacpp::{Batch, ContextParams, KvType, Logits, Model, Output, Sampler, Token};

/// The result of re-scoring one stream.
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherForced {
    /// For each generated token: the best logit at its position minus the
    /// chosen token's (0 when the chosen one is the best).
    pub gaps: Vec<f32>,
    /// For each generated token: the best logit at its position minus the
    /// second best (how decisive the position is).
    pub margins: Vec<f32>,
}

impl TeacherForced {
    /// The first position whose best and second-best logits are within
    /// `eps` of each other: where rounding alone may change a greedy
    /// choice, so two correct runs may part there.
    pub fn first_near_tie(&self, eps: f32) -> Option<usize> {
        self.margins.iter().position(|&m| m < eps)
    }

    /// The largest gap (0 for no tokens).
    pub fn worst(&self) -> f32 {
        self.gaps.iter().copied().fold(0.0, f32::max)
    }
}

/// The `n` greedy tokens after `prompt` in a fresh context with `params`,
/// one decode per token: the single-sequence run that batched, split or
/// remote runs are compared with.
///
/// # Errors
/// The context's, the decodes' or the sampler's error.
pub fn greedy(model: &Model, params: &ContextParams, prompt: &[Token], n: usize) -> llamacpp::Result<Vec<Token>> {
    let mut ctx = model.new_context(params)?;
    ctx.decode(&Batch::from_tokens(prompt, 0))?;
    let mut sampler = Sampler::greedy();
    let mut out = Vec::with_capacity(n);
    for pos in prompt.len()..prompt.len() + n {
        let token = sampler.sample(&mut ctx, Output::Last)?;
        out.push(token);
        ctx.decode(&Batch::from_tokens(&[token], pos as i32))?;
    }
    Ok(out)
}

/// Re-scores `generated` after `prompt` in a fresh single-sequence context
/// (one decode with logits at the last prompt token and every generated
/// token but the last).
///
/// # Errors
/// The context's or the decode's error.
pub fn rescore(model: &Model, prompt: &[Token], generated: &[Token]) -> llamacpp::Result<TeacherForced> {
    rescore_with_kv(model, KvType::F16, prompt, generated)
}

/// [`rescore`] with a KV cache of type `kv` (F32 keeps the synthetic
/// model's comparisons free of F16 rounding).
///
/// # Errors
/// The context's or the decode's error.
pub fn rescore_with_kv(
    model: &Model,
    kv: KvType,
    prompt: &[Token],
    generated: &[Token],
) -> llamacpp::Result<TeacherForced> {
    let total = prompt.len() + generated.len();
    let n = total.max(1) as u32;
    let params = ContextParams::default().n_ctx(n + 1).n_batch(n).n_ubatch(n.min(512)).n_threads(2).kv_type(kv);
    let mut ctx = model.new_context(&params)?;
    let mut batch = Batch::new(total, 1);
    let mut all = prompt.to_vec();
    all.extend_from_slice(generated);
    for (i, &t) in all.iter().enumerate().take(total.saturating_sub(1)) {
        batch.push(t, i as i32, &[0], Logits::from(i + 1 >= prompt.len()))?;
    }
    if batch.is_empty() {
        return Ok(TeacherForced { gaps: Vec::new(), margins: Vec::new() });
    }
    ctx.decode(&batch)?;
    let mut gaps = Vec::with_capacity(generated.len());
    let mut margins = Vec::with_capacity(generated.len());
    for (k, &chosen) in generated.iter().enumerate() {
        let row = (prompt.len() - 1 + k) as i32;
        let logits = ctx.logits(Output::Index(row as usize))?;
        let (mut best, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &l in logits {
            if l > best {
                second = best;
                best = l;
            } else if l > second {
                second = l;
            }
        }
        gaps.push(best - logits[chosen.0 as usize]);
        margins.push(best - second);
    }
    Ok(TeacherForced { gaps, margins })
}
