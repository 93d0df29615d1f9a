//! One step of the worker: the decode, sampling and events, and the end
//! of a request.

use super::*;

impl<'m> Worker<'m> {
    /// One decode over the planned tokens, then sampling.
    pub(super) fn step(&mut self) -> Result<()> {
        let mut attempts = 0;
        loop {
            if !self.plan_with_room() {
                return Ok(());
            }
            self.batch.clear();
            for (seq, &n) in self.running.iter().zip(&self.plan) {
                if n == 0 {
                    continue;
                }
                let from = seq.n_cached;
                let slot = seq.slot.expect("running sequences have a slot");
                let last = from + n == seq.tokens.len();
                self.batch.push_sequence(&seq.tokens[from..from + n], from as Pos, slot, Logits::from(last))?;
            }
            match self.ctx.decode(&self.batch) {
                Ok(()) => break,
                // The accounting said it fits, but llama.cpp found no slot
                // (a pool fragmented by padding): free more and retry.
                Err(Error::NoKvSlot) if attempts < 8 => {
                    attempts += 1;
                    if !self.make_room() {
                        return Ok(());
                    }
                }
                Err(e @ Error::Poisoned { .. }) => return Err(e),
                Err(e) => {
                    if matches!(e, Error::Exception { .. }) {
                        return Err(e);
                    }
                    // This batch's sequences fail; the others go on.
                    let why = e.to_string();
                    let planned: Vec<usize> = (0..self.running.len()).filter(|&i| self.plan[i] > 0).rev().collect();
                    for i in planned {
                        let mut seq = self.running.remove(i);
                        if let Some(slot) = seq.slot.take() {
                            self.release_slot(slot);
                        }
                        self.finish(seq, FinishReason::Failed(why.clone()));
                    }
                    return Ok(());
                }
            }
        }
        self.stats.steps += 1;
        self.shared.steps.store(self.stats.steps, Ordering::Release);
        ::metrics::counter!("llama_engine_steps_total").increment(1);

        // Record what went in, and sample where the batch asked for logits.
        let mut row = 0usize;
        let mut to_sample = Vec::new();
        for (i, seq) in self.running.iter_mut().enumerate() {
            let n = self.plan[i];
            if n == 0 {
                continue;
            }
            if !seq.decoding() {
                self.stats.prompt_tokens_evaluated += n as u64;
                ::metrics::counter!("llama_engine_prompt_tokens_evaluated_total").increment(n as u64);
            }
            seq.n_cached += n;
            seq.cells.append(seq.own_run, n);
            let slot = seq.slot.expect("running sequences have a slot");
            self.index.extend(slot, &seq.tokens[..seq.n_cached]);
            row += n;
            if seq.n_cached == seq.tokens.len() {
                to_sample.push((i, row - 1));
            }
        }
        let mut ended = Vec::new();
        for (i, row) in to_sample {
            let seq = &mut self.running[i];
            let outcome =
                catch_unwind(AssertUnwindSafe(|| sample(&mut self.ctx, seq, row, self.stats.steps, &mut self.outbox)));
            let outcome = match outcome {
                Ok(o) => o,
                Err(panic) => Err(Error::InvalidArgument(format!("panic: {}", panic_message(&*panic)))),
            };
            match outcome {
                Ok(Sampled { reason, first, gap }) => {
                    self.stats.completion_tokens += 1;
                    ::metrics::counter!("llama_engine_completion_tokens_total").increment(1);
                    if let Some(ttft) = first {
                        self.samples.ttft.push(ttft);
                    }
                    if let Some(gap) = gap {
                        self.samples.inter_token.push(gap);
                    }
                    if let Some(reason) = reason {
                        ended.push((i, reason));
                    }
                }
                Err(e) => ended.push((i, FinishReason::Failed(e.to_string()))),
            }
        }
        for (i, reason) in ended.into_iter().rev() {
            let seq = self.running.remove(i);
            self.finish(seq, reason);
        }
        Ok(())
    }

    /// Ends a request: flushes its text, sends the final event, and keeps
    /// its cells as a cached prefix (or frees them).
    pub(super) fn finish(&mut self, mut seq: Seq<'m>, reason: FinishReason) {
        if !matches!(reason, FinishReason::Stop(_)) {
            let rest = seq.detokenizer.finish();
            if !rest.is_empty() {
                seq.stop.push(&rest, &mut seq.out);
            }
            seq.stop.flush(&mut seq.out);
        }
        if !seq.out.is_empty() || seq.out_token.is_some() {
            let piece = seq.take_piece();
            self.outbox.push((seq.events.clone(), Event::Piece(piece)));
        }
        let now = Instant::now();
        let total = now - seq.submitted;
        let gaps = seq.generated.saturating_sub(1) as u32;
        let finish = Finish {
            usage: Usage {
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens,
                completion_tokens: seq.generated,
            },
            timings: Timings {
                queued: seq.admitted.map_or(total, |a| a - seq.submitted),
                time_to_first_token: seq.first_token.map(|t| t - seq.submitted),
                inter_token_mean: if gaps > 0 { seq.inter_token_sum / gaps } else { Duration::ZERO },
                inter_token_max: seq.inter_token_max,
                total,
                steps_to_first_token: seq.steps_to_first_token,
                preemptions: seq.preemptions,
            },
            reason,
        };
        log::debug!("request {} finished: {} ({:?})", seq.id, finish.reason, finish.usage);
        ::metrics::counter!("llama_engine_requests_total", "reason" => reason_label(&finish.reason)).increment(1);
        self.outbox.push((seq.events.clone(), Event::Done(finish)));
        self.samples.end_to_end.push(total);
        self.stats.requests_finished += 1;
        if seq.queued {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(slot) = seq.slot.take() {
            if self.prefix_sharing && self.max_cached > 0 && seq.n_cached > 0 {
                seq.tokens.truncate(seq.n_cached);
                self.cached.push(Cached { slot, tokens: seq.tokens, cells: seq.cells, last_used: self.tick });
                self.tick += 1;
                self.trim_cache();
            } else {
                self.release_slot(slot);
            }
        }
    }

    pub(super) fn finish_all(&mut self, reason: FinishReason) {
        while let Some(seq) = self.running.pop() {
            self.finish(seq, reason.clone());
        }
        while let Some(seq) = self.waiting.pop_front() {
            self.finish(seq, reason.clone());
        }
    }
}

fn reason_label(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop(_) => "stop",
        FinishReason::EndOfGeneration => "eog",
        FinishReason::Cancelled => "cancelled",
        FinishReason::ContextFull => "context_full",
        FinishReason::Shutdown => "shutdown",
        _ => "failed",
    }
}

/// What sampling one token did.
struct Sampled {
    /// The request ends.
    reason: Option<FinishReason>,
    /// Time to first token, if this was the first.
    first: Option<Duration>,
    /// Gap since the previous token, if any.
    gap: Option<Duration>,
}

/// Samples a sequence's next token from batch row `row`, releases its
/// text, and says whether the request ends.
fn sample(
    ctx: &mut Context<'_>,
    seq: &mut Seq<'_>,
    row: usize,
    step: u64,
    outbox: &mut Vec<(async_channel::Sender<Event>, Event)>,
) -> Result<Sampled> {
    let token = seq.sampler.sample(ctx, row)?;
    if let Some(top) = seq.top_logprobs {
        seq.out_logprob = Some(token_logprob(ctx.logits(row)?, token, top));
    }
    let now = Instant::now();
    seq.generated += 1;
    let mut sampled = Sampled { reason: None, first: None, gap: None };
    match seq.last_token {
        None => {
            seq.first_token = Some(now);
            seq.steps_to_first_token = Some(step - seq.submit_step);
            sampled.first = Some(now - seq.submitted);
        }
        Some(last) => {
            let gap = now - last;
            seq.inter_token_sum += gap;
            seq.inter_token_max = seq.inter_token_max.max(gap);
            sampled.gap = Some(gap);
        }
    }
    seq.last_token = Some(now);
    let vocab = ctx.model().vocab();
    if seq.stop_at_eog && vocab.is_eog(token) {
        sampled.reason = Some(FinishReason::EndOfGeneration);
        return Ok(sampled);
    }
    seq.tokens.push(token);
    seq.out_token = Some(token);
    seq.piece.clear();
    seq.detokenizer.push(token, &mut seq.piece)?;
    if let Some(i) = seq.stop.push(&seq.piece, &mut seq.out) {
        sampled.reason = Some(FinishReason::Stop(seq.stop.stops()[i].clone()));
    } else if seq.max_tokens.is_some_and(|max| seq.generated >= max) {
        sampled.reason = Some(FinishReason::Length);
    } else if seq.tokens.len() > seq.max_context {
        // The token just sampled would need a cell beyond the cap.
        sampled.reason = Some(FinishReason::ContextFull);
    } else {
        let piece = seq.take_piece();
        outbox.push((seq.events.clone(), Event::Piece(piece)));
    }
    Ok(sampled)
}

impl Seq<'_> {
    /// The released text, the token and its log-probabilities, as a piece.
    fn take_piece(&mut self) -> Piece {
        Piece { text: std::mem::take(&mut self.out), token: self.out_token.take(), logprob: self.out_logprob.take() }
    }
}

/// `token`'s log-probability in the log-softmax of `logits`, with the `top`
/// most likely tokens, in one pass over the vocabulary (no sort of it).
fn token_logprob(logits: &[f32], token: Token, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Summed in f64: 262,144 terms lose precision in f32.
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = max + sum.ln() as f32;
    // The best `top` (id, logit) pairs, best first; ties keep the lower id.
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(top + 1);
    for (id, &l) in logits.iter().enumerate() {
        if best.len() == top && best.last().is_none_or(|&(_, worst)| l <= worst) {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= l);
        best.insert(at, (id, l));
        best.truncate(top);
    }
    let logprob = logits.get(token.0 as usize).map_or(f32::NEG_INFINITY, |&l| l - log_z);
    let top = best.into_iter().map(|(id, l)| (Token(id as i32), l - log_z)).collect();
    TokenLogprob { token, logprob, top }
}
