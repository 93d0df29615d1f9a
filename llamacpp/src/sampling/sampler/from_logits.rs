//! Running a chain on a logits row: the shortcuts (argmax, top-k
//! preselection) and the grammar check that spares masking the vocabulary.

use super::scan::{argmax, scan_top_k};
use super::{Kind, SamplePath, Sampler, TokenData, grammar_allows, resume_pending_panic};
use crate::error::{Error, Result};
use crate::llama::ffi::check_shim;
use crate::llama::thread::SendPtr;
use crate::llama::types::Token;
use crate::sampling::constraint::Guide;
use crate::sys;

/// How many of the best tokens a greedy chain behind grammars checks one
/// by one, when the best is refused, before masking the vocabulary.
const BEST_ALLOWED_TRIES: usize = 32;

/// Up to how many allowed tokens a constrained chain runs on the allowed
/// candidates alone (beyond, on the masked row, where top-k preselection
/// skips materialising all candidates).
const CANDIDATE_LIST_MAX: usize = 4096;

impl Sampler<'_> {
    /// Runs the chain on a logits row (without accepting the result).
    ///
    /// A grammar masks every candidate it forbids, which costs 45–140 ms
    /// per token on a 262,144-token vocabulary. Unless the chain was built
    /// with [`grammar_first`](super::SamplerChain::grammar_first), the chain
    /// first runs without its grammars and the pick is checked against
    /// each grammar alone (one candidate, well under a millisecond); only a
    /// pick some grammar forbids is redone with the grammars masking, as
    /// llama.cpp's own `common_sampler` does. For a greedy chain the token
    /// is the same either way.
    ///
    /// The flag says whether every grammar was asked about the token and
    /// allows it (then accepting it needs no second check).
    pub(super) fn select(&mut self, logits: &[f32]) -> Result<(Token, SamplePath, bool)> {
        if let Some(mut guide) = self.guide.take() {
            let picked = self.select_in_mask(&mut guide, logits);
            self.guide = Some(guide);
            let (token, path) = picked?;
            return Ok((token, path, true));
        }
        if !self.grammar_first && self.kinds.contains(&Kind::Grammar) {
            let (token, path) = self.run_chain(logits, true)?;
            let mut allowed = true;
            for i in 0..self.kinds.len() {
                if self.kinds[i] == Kind::Grammar {
                    let child = SendPtr(self.children[i].0.as_ptr());
                    if !grammar_allows(child, token)? {
                        allowed = false;
                        break;
                    }
                }
            }
            if allowed {
                return Ok((token, path, true));
            }
            // Greedy behind the grammars alone: the masked argmax is the
            // best allowed token, found among the best few without masking.
            if self.kinds.iter().all(|&k| k == Kind::Grammar || k == Kind::Greedy)
                && let Some(token) = self.best_allowed(logits)?
            {
                return Ok((token, SamplePath::Greedy, true));
            }
        }
        let (token, path) = self.run_chain(logits, false)?;
        Ok((token, path, false))
    }

    /// The highest-logit token every grammar allows, if it is among the
    /// best [`BEST_ALLOWED_TRIES`] (ties go to the lower id, as greedy's
    /// argmax over a masked row does); `None` sends the caller to masking.
    fn best_allowed(&mut self, logits: &[f32]) -> Result<Option<Token>> {
        // The best candidates, best first: one pass, a short sorted list.
        let mut best: Vec<(f32, i32)> = Vec::with_capacity(BEST_ALLOWED_TRIES + 1);
        for (id, &l) in logits.iter().enumerate() {
            if l.is_nan() || (best.len() == BEST_ALLOWED_TRIES && best.last().is_some_and(|&(worst, _)| l <= worst)) {
                continue;
            }
            let at = best.partition_point(|&(b, _)| b >= l);
            best.insert(at, (l, id as i32));
            best.truncate(BEST_ALLOWED_TRIES);
        }
        // Equal logits stay in id order (ids come in ascending, and an
        // equal one goes after those already kept), as greedy breaks ties.
        for &(logit, id) in &best {
            if logit == f32::NEG_INFINITY {
                return Ok(None);
            }
            let token = Token(id);
            let mut allowed = true;
            for k in 0..self.kinds.len() {
                if self.kinds[k] == Kind::Grammar && !grammar_allows(SendPtr(self.children[k].0.as_ptr()), token)? {
                    allowed = false;
                    break;
                }
            }
            if allowed {
                return Ok(Some(token));
            }
        }
        Ok(None)
    }

    /// Runs the chain on a logits row (without accepting the result), or
    /// with `skip_grammars` the chain without its grammars.
    fn run_chain(&mut self, logits: &[f32], skip_grammars: bool) -> Result<(Token, SamplePath)> {
        let mut kinds = self.kinds.iter().filter(|&&k| !(skip_grammars && k == Kind::Grammar));
        let (first_kind, second_kind) = (kinds.next().copied(), kinds.next().copied());
        if first_kind == Some(Kind::Greedy) && second_kind.is_none() {
            return Ok((Token(argmax(logits) as i32), SamplePath::Greedy));
        }
        let top_k = match first_kind {
            Some(Kind::TopK(k)) if k > 0 && (k as usize) < logits.len() => Some(k as usize),
            _ => None,
        };
        // The number of leading samplers (grammars skipped or not) that the
        // candidate preparation already did: the top-k one.
        let (first, path) = match top_k {
            Some(k) if self.preselect_top_k(logits, k) => {
                let top_k_at = self.kinds.iter().position(|&k| matches!(k, Kind::TopK(_))).unwrap_or(0);
                (top_k_at + 1, SamplePath::TopK)
            }
            _ => {
                self.scratch.clear();
                self.scratch.extend(logits.iter().enumerate().map(|(i, &logit)| TokenData {
                    id: i as i32,
                    logit,
                    p: 0.0,
                }));
                (0, SamplePath::Full)
            }
        };
        self.run_children(first, path, skip_grammars, logits.len())
    }

    /// Runs the chain's samplers from the `first` on the candidates in
    /// `scratch` (sorted for [`SamplePath::TopK`]), skipping grammars if
    /// asked, and returns the selected token.
    fn run_children(
        &mut self,
        first: usize,
        path: SamplePath,
        skip_grammars: bool,
        n_vocab: usize,
    ) -> Result<(Token, SamplePath)> {
        let mut cur = sys::llama_token_data_array {
            data: self.scratch.as_mut_ptr(),
            size: self.scratch.len(),
            selected: -1,
            sorted: path == SamplePath::TopK,
        };
        for (i, &(child, has_apply)) in self.children.iter().enumerate().skip(first) {
            if !has_apply || (skip_grammars && self.kinds[i] == Kind::Grammar) {
                continue;
            }
            // SAFETY: `child` is a live sampler owned by our chain; `cur`
            // points into `scratch` (or into storage a sampler set), valid
            // and exclusively ours during the call; the shim catches
            // exceptions.
            let code = unsafe { sys::shim::llama_rs_sampler_apply(child.as_ptr(), &mut cur) };
            resume_pending_panic();
            check_shim(code, "llama_sampler_apply")?;
            // Built-in samplers assert on an empty candidate list (softmax:
            // `GGML_ASSERT(cur_p->size > 0)`), which a custom sampler can
            // leave behind.
            if cur.size == 0 || cur.data.is_null() {
                return Err(Error::NoCandidates);
            }
        }
        let Some(selected) = usize::try_from(cur.selected).ok().filter(|&s| s < cur.size) else {
            return Err(Error::NoSelector);
        };
        // SAFETY: `selected < size`, and `data` holds `size` entries (samplers
        // may replace `data`, but must keep it valid until sampling ends).
        let chosen = unsafe { *cur.data.add(selected) };
        // A custom sampler may have written any id into the candidates.
        if chosen.id < 0 || chosen.id as usize >= n_vocab {
            return Err(Error::InvalidToken { token: chosen.id, n_vocab: n_vocab as i32 });
        }
        if !skip_grammars
            && self.kinds.contains(&Kind::Grammar)
            && (chosen.logit.is_nan() || chosen.logit == f32::NEG_INFINITY)
        {
            return Err(Error::Grammar("the grammar allows none of the candidate tokens".into()));
        }
        Ok((Token(chosen.id), path))
    }

    /// Runs the chain on the tokens the constraint allows: a pure greedy
    /// chain takes the best allowed logit; otherwise the chain sees only
    /// the allowed candidates when they are few, or the whole row with the
    /// forbidden logits at -inf (so that top-k preselection still works).
    /// Either way a random pick follows the constrained distribution.
    fn select_in_mask(&mut self, guide: &mut Guide, logits: &[f32]) -> Result<(Token, SamplePath)> {
        let mask = guide.mask()?;
        let n_vocab = logits.len();
        let (token, path) = if self.kinds == [Kind::Greedy] {
            let mut best: Option<(f32, usize)> = None;
            mask.iter_set_entries(|i| {
                if let Some(&l) = logits.get(i)
                    && !l.is_nan()
                    && best.is_none_or(|(b, _)| l > b)
                {
                    best = Some((l, i));
                }
            });
            let id = best.map(|(_, i)| i).or_else(|| mask.first_bit_set()).unwrap_or(0);
            (Token(id as i32), SamplePath::Greedy)
        } else if mask.num_set() <= CANDIDATE_LIST_MAX {
            self.scratch.clear();
            let scratch = &mut self.scratch;
            mask.iter_set_entries(|i| {
                if let Some(&logit) = logits.get(i) {
                    scratch.push(TokenData { id: i as i32, logit, p: 0.0 });
                }
            });
            self.run_children(0, SamplePath::Full, false, n_vocab)?
        } else {
            let mut masked = std::mem::take(&mut self.masked);
            masked.clear();
            masked.extend_from_slice(logits);
            mask.iter_unset_entries(|i| {
                if let Some(l) = masked.get_mut(i) {
                    *l = f32::NEG_INFINITY;
                }
            });
            let picked = self.run_chain(&masked, false);
            self.masked = masked;
            picked?
        };
        // A sampler of the chain (a custom one) may pick any id.
        if !mask.is_allowed(token.0 as u32) {
            return Err(Error::Grammar(format!("token {token} was picked, but the constraint forbids it")));
        }
        Ok((token, path))
    }

    /// Fills `scratch` with the `k` best candidates, sorted by descending
    /// logit, exactly as llama.cpp's top-k leaves them. Returns false (and
    /// the caller takes the full path) when ties make llama.cpp's order
    /// ambiguous, so both paths always agree.
    fn preselect_top_k(&mut self, logits: &[f32], k: usize) -> bool {
        // Keep the k+1 best in a min-heap: the extra one tells whether the
        // k-th place is tied.
        let keep = k + 1;
        let heap = &mut self.heap;
        heap.clear();
        // Fill the heap from the first `keep` logits.
        let filled = keep.min(logits.len());
        heap.extend(logits[..filled].iter().enumerate().map(|(i, &x)| (x, i as i32)));
        heap.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        if !scan_top_k(logits, filled, heap) {
            return false;
        }
        if heap.iter().any(|e| e.0.is_nan()) {
            return false;
        }
        heap.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        // For k > 128 llama.cpp buckets logits with `int(6.4 * x + 64)`,
        // which overflows for huge values and misplaces them: leave those
        // rows to llama.cpp's own code.
        if k > 128 && heap[0].0 >= 3.0e8 {
            return false;
        }
        // Distinct values only: then the top k and their order are unique.
        if heap.windows(2).any(|w| w[0].0 == w[1].0) {
            return false;
        }
        self.scratch.clear();
        self.scratch.extend(heap[..k].iter().map(|&(logit, id)| TokenData { id, logit, p: 0.0 }));
        true
    }
}
