//! A limit on a reply's thoughts: the sampler that counts the tokens
//! between the thought markers and, once the budget is spent, forces the
//! closing text. The markers are text here; the chat floor knows which
//! ones a template writes (`ReasoningFormat::budget`).

use super::{Candidates, CustomSampler};
use crate::error::Result;
use crate::llama::types::Token;
use crate::llama::vocab::{AddBos, Vocab};

/// A limit on a reply's thoughts ([`SamplingParams::reasoning_budget`](super::SamplingParams::reasoning_budget)):
/// after `tokens` tokens of thought, the closing text is forced. Made for a
/// template's markers by
/// `ReasoningFormat::budget`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningBudget {
    pub(crate) open: String,
    pub(crate) close: String,
    pub(crate) forced_close: String,
    pub(crate) opened: bool,
    pub(crate) tokens: usize,
}

impl ReasoningBudget {
    /// At most `tokens` tokens of thought between `open` and `close` (the
    /// texts of the markers, control tokens included); once they are spent
    /// `forced_close` is written in the model's name. `opened`: the prompt
    /// ends inside the thoughts.
    pub fn new(
        open: impl Into<String>,
        close: impl Into<String>,
        forced_close: impl Into<String>,
        opened: bool,
        tokens: usize,
    ) -> ReasoningBudget {
        ReasoningBudget { open: open.into(), close: close.into(), forced_close: forced_close.into(), opened, tokens }
    }

    /// The most tokens of thought.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// The sampler that holds a reply to its reasoning budget: it follows the
/// thoughts by the tokens of their markers (as the model's vocabulary
/// spells them), counts the tokens in between, and once the budget is
/// spent allows only the tokens of the closing text, one after another.
/// First in the chain, so the samplers after it see one candidate left.
#[derive(Clone, Debug)]
pub(crate) struct BudgetSampler {
    open: Vec<Token>,
    close: Vec<Token>,
    forced: Vec<Token>,
    budget: usize,
    opened: bool,
    thinking: bool,
    /// The thoughts ended (closed by the model or by force): no more
    /// counting.
    done: bool,
    spent: usize,
    /// The next forced token, while forcing.
    forcing: Option<usize>,
    /// The last tokens accepted, as long as the longest marker.
    recent: Vec<Token>,
}

impl BudgetSampler {
    pub(crate) fn new(vocab: &Vocab, budget: &ReasoningBudget) -> Result<BudgetSampler> {
        let tokens = |text: &str| vocab.tokenize_special(text, AddBos::No);
        Ok(BudgetSampler {
            open: tokens(&budget.open)?,
            close: tokens(&budget.close)?,
            forced: tokens(&budget.forced_close)?,
            budget: budget.tokens,
            opened: budget.opened,
            thinking: budget.opened,
            done: false,
            spent: 0,
            forcing: None,
            recent: Vec::new(),
        })
    }
}

impl CustomSampler for BudgetSampler {
    fn name(&self) -> &str {
        "reasoning-budget"
    }

    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        if self.forcing.is_none() && self.thinking && !self.done && self.spent >= self.budget {
            self.forcing = Some(0);
        }
        let Some(next) = self.forcing.and_then(|i| self.forced.get(i)) else { return };
        for c in candidates.data_mut() {
            if c.id != next.0 {
                c.logit = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: Token) {
        if let Some(i) = self.forcing {
            if i + 1 >= self.forced.len() {
                self.forcing = None;
                self.thinking = false;
                self.done = true;
            } else {
                self.forcing = Some(i + 1);
            }
            return;
        }
        if self.done {
            return;
        }
        self.recent.push(token);
        let keep = self.open.len().max(self.close.len());
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
        if !self.thinking {
            if self.recent == self.open {
                self.thinking = true;
            } else if !self.open.starts_with(&self.recent) {
                // Thoughts are read at the start of a reply only.
                self.done = true;
            }
        } else if !self.close.is_empty() && self.recent.ends_with(&self.close) {
            self.thinking = false;
            self.done = true;
        } else {
            self.spent += 1;
        }
    }

    fn reset(&mut self) {
        *self = BudgetSampler {
            thinking: self.opened,
            done: false,
            spent: 0,
            forcing: None,
            recent: Vec::new(),
            open: std::mem::take(&mut self.open),
            close: std::mem::take(&mut self.close),
            forced: std::mem::take(&mut self.forced),
            ..*self
        };
    }

    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(self.clone())
    }
}
