//! Reasoning: the thoughts a model writes before its answer, in the
//! markers its chat template teaches ([`ReasoningFormat`]), split from the
//! answer as the output streams ([`ReasoningSplit`]), and the caller's
//! settings ([`Reasoning`]: on or off, a token budget, split or left in
//! the text).

use crate::sampling::sampler::ReasoningBudget;

/// How a model marks its thoughts, told by the markers its chat template
/// writes ([`ReasoningFormat::from_template`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReasoningFormat {
    /// No thought markers: the output is all answer.
    None,
    /// `<think>…</think>`: DeepSeek R1 and V3.1+, Qwen 3 and QwQ, GLM 4.5+,
    /// SmolLM 3, Kimi K2 Thinking, MiniMax M2, Nemotron, Granite, LFM 2.5
    /// and the others that write these tags.
    Think,
    /// `<seed:think>…</seed:think>`: ByteDance Seed-OSS.
    SeedThink,
    /// `<|START_THINKING|>…<|END_THINKING|>`: Command R7B, Command A.
    CommandR,
    /// `[THINK]…[/THINK]`: Magistral and Ministral reasoning models.
    Mistral,
    /// `<|channel>thought…<channel|>`: Gemma 4.
    Gemma4,
}

impl ReasoningFormat {
    /// The markers in a chat template's source (`None`: the model has no
    /// template). Templates whose thoughts are a channel of their own
    /// (gpt-oss's harmony) or plain-text headings (Apriel) are not read:
    /// [`ReasoningFormat::None`].
    pub fn from_template(source: Option<&str>) -> ReasoningFormat {
        let Some(t) = source else { return ReasoningFormat::None };
        if t.contains("<seed:think>") {
            ReasoningFormat::SeedThink
        } else if t.contains("<|START_THINKING|>") {
            ReasoningFormat::CommandR
        } else if t.contains("[THINK]") && t.contains("[/THINK]") {
            ReasoningFormat::Mistral
        } else if t.contains("<|channel>thought") {
            ReasoningFormat::Gemma4
        } else if t.contains("</think>") {
            ReasoningFormat::Think
        } else {
            ReasoningFormat::None
        }
    }

    /// The texts that open and close the thoughts (`None` for
    /// [`ReasoningFormat::None`]).
    pub fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            ReasoningFormat::None => None,
            ReasoningFormat::Think => Some(("<think>", "</think>")),
            ReasoningFormat::SeedThink => Some(("<seed:think>", "</seed:think>")),
            ReasoningFormat::CommandR => Some(("<|START_THINKING|>", "<|END_THINKING|>")),
            ReasoningFormat::Mistral => Some(("[THINK]", "[/THINK]")),
            ReasoningFormat::Gemma4 => Some(("<|channel>thought", "<channel|>")),
        }
    }

    /// What is written in the model's name when a budget ends its
    /// thoughts: the closing marker on a line of its own, then the
    /// separation its templates put before an answer.
    pub(crate) fn forced_close(self) -> Option<String> {
        let (_, close) = self.markers()?;
        Some(match self {
            ReasoningFormat::Think | ReasoningFormat::SeedThink => format!("\n{close}\n\n"),
            _ => close.to_owned(),
        })
    }

    /// A budget of `tokens` tokens of thought in these markers
    /// ([`SamplingParams::reasoning_budget`](crate::SamplingParams::reasoning_budget));
    /// `opened`: the prompt ends inside the thoughts. `None` for
    /// [`ReasoningFormat::None`].
    pub fn budget(self, opened: bool, tokens: usize) -> Option<ReasoningBudget> {
        let (open, close) = self.markers()?;
        Some(ReasoningBudget::new(open, close, self.forced_close()?, opened, tokens))
    }
}

/// The caller's reasoning settings, as a builder.
///
/// Defaults: thoughts on (as the template decides), no budget, split from
/// the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reasoning {
    pub(crate) enabled: bool,
    pub(crate) budget: Option<usize>,
    pub(crate) split: bool,
}

impl Default for Reasoning {
    fn default() -> Self {
        Reasoning { enabled: true, budget: None, split: true }
    }
}

impl Reasoning {
    /// Whether the model thinks before it answers. Off sets the template's
    /// `enable_thinking` to false where the template reads it (Qwen 3,
    /// DeepSeek, GLM, …: the prompt then holds an empty thought); on other
    /// templates with thought markers it is a budget of 0.
    #[must_use]
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self
    }

    /// The most tokens of thought: when the model has written that many,
    /// its thoughts are closed for it (the closing marker is decoded as if
    /// the model had written it) and it answers. 0 closes them before the
    /// first token.
    #[must_use]
    pub fn budget(mut self, tokens: usize) -> Self {
        self.budget = Some(tokens);
        self
    }

    /// Whether thoughts come apart from the answer (default true); false
    /// leaves them in the text, markers and all (llama-server's
    /// `reasoning_format: none`).
    #[must_use]
    pub fn split(mut self, on: bool) -> Self {
        self.split = on;
        self
    }

    /// The budget in effect: the one set, or 0 when thoughts are off.
    pub(crate) fn effective_budget(&self) -> Option<usize> {
        if self.enabled { self.budget } else { Some(0) }
    }
}

/// Which part of the output a piece of text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Reasoning,
    Answer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the thoughts may still open.
    Start,
    /// Inside the thoughts.
    Thinking,
    /// After them (or there were none): the answer.
    Answer,
}

/// Splits an output into thoughts and answer as it streams. Thoughts are
/// read at the start of the output only (after whitespace), or from the
/// very start when the prompt opened them. Whitespace around the thoughts
/// and before the answer is dropped, held back while it might be the
/// last before a marker, so a streamed output and a whole one split the
/// same.
#[derive(Clone, Debug)]
pub(crate) struct ReasoningSplit {
    open: &'static str,
    close: &'static str,
    state: State,
    /// Text read but not yet released.
    pending: String,
    /// Drop whitespace at the start of what is released next.
    skip_space: bool,
}

impl ReasoningSplit {
    /// A splitter for `format`'s markers; `opened`: the prompt ends inside
    /// the thoughts (the template wrote the opening marker).
    pub(crate) fn new(format: ReasoningFormat, opened: bool) -> Option<ReasoningSplit> {
        let (open, close) = format.markers()?;
        Some(ReasoningSplit {
            open,
            close,
            state: if opened { State::Thinking } else { State::Start },
            pending: String::new(),
            skip_space: true,
        })
    }

    /// Whether the output is inside the thoughts.
    pub(crate) fn thinking(&self) -> bool {
        self.state == State::Thinking
    }

    /// Reads the next piece of output.
    pub(crate) fn push(&mut self, piece: &str, out: &mut Vec<(Part, String)>) {
        self.pending.push_str(piece);
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(self.open) {
                        self.pending = rest.to_owned();
                        self.state = State::Thinking;
                        self.skip_space = true;
                    } else if self.open.starts_with(trimmed) {
                        return; // too little to tell
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => {
                    if self.skip_space {
                        self.pending = self.pending.trim_start().to_owned();
                        if self.pending.is_empty() {
                            return;
                        }
                        self.skip_space = false;
                    }
                    if let Some(at) = self.pending.find(self.close) {
                        let rest = self.pending.split_off(at);
                        let thought = std::mem::take(&mut self.pending);
                        release(out, Part::Reasoning, thought.trim_end());
                        self.pending = rest[self.close.len()..].to_owned();
                        self.state = State::Answer;
                        self.skip_space = true;
                    } else {
                        // Keep what may start the closing marker, and the
                        // whitespace before it.
                        let keep = held_back(&self.pending, self.close);
                        let body = &self.pending[..self.pending.len() - keep];
                        let cut = body.trim_end().len();
                        let text = self.pending[..cut].to_owned();
                        self.pending.drain(..cut);
                        release(out, Part::Reasoning, &text);
                        return;
                    }
                }
                State::Answer => {
                    if self.skip_space {
                        self.pending = self.pending.trim_start().to_owned();
                        if self.pending.is_empty() {
                            return;
                        }
                        self.skip_space = false;
                    }
                    let text = std::mem::take(&mut self.pending);
                    release(out, Part::Answer, &text);
                    return;
                }
            }
        }
    }

    /// The output has ended: what was held back is released (unclosed
    /// thoughts stay thoughts; a start that never opened is answer).
    pub(crate) fn finish(&mut self, out: &mut Vec<(Part, String)>) {
        let text = std::mem::take(&mut self.pending);
        match self.state {
            State::Thinking => release(out, Part::Reasoning, text.trim()),
            State::Start | State::Answer => {
                let text = if self.skip_space { text.trim_start() } else { &text };
                release(out, Part::Answer, text);
            }
        }
    }
}

fn release(out: &mut Vec<(Part, String)>, part: Part, text: &str) {
    if !text.is_empty() {
        out.push((part, text.to_owned()));
    }
}

/// The longest tail of `text` that is the start of `marker` (at a
/// character boundary).
fn held_back(text: &str, marker: &str) -> usize {
    (1..marker.len()).rev().filter(|&n| marker.is_char_boundary(n)).find(|&n| text.ends_with(&marker[..n])).unwrap_or(0)
}
