//! A chat turn's output read as it streams: thoughts, answer text and
//! tool calls apart ([`ChatParser`], yielding [`ChatEvent`]s).

use super::reasoning::{Part, ReasoningFormat, ReasoningSplit};
use super::tools::{ParsedCall, ToolEvent, ToolFormat, ToolStream};
use super::{FunctionCall, ToolCall};
use crate::text::generate::FinishReason;
use crate::text::generate::Usage;

/// What a chat turn yields, in order: thoughts, text and tool calls as
/// they are read, then one [`ChatEvent::Done`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ChatEvent {
    /// A piece of the answer.
    Text(String),
    /// A piece of the model's thoughts.
    Reasoning(String),
    /// A complete tool call (its arguments a JSON object).
    ToolCall(ToolCall),
    /// The turn ended ([`ChatParser`] never yields it; a turn's runner
    /// does).
    Done {
        /// Why.
        reason: FinishReason,
        /// Token counts: the prompt, how much of it was already in the
        /// KV cache, the tokens generated.
        usage: Usage,
    },
}

/// Reads a chat turn's output: with [`ChatParser::reasoning`], thoughts at
/// its start apart from the answer; with [`ChatParser::tools`], the tool
/// calls out of the answer. Text is released as soon as it cannot be
/// part of a marker; a call when it is complete. Pushing the output in any
/// pieces gives the same events, joined, as pushing it whole.
///
/// ```
/// use llamacpp::chat::{ChatEvent, ChatParser, ReasoningFormat, ToolFormat};
/// let mut parser = ChatParser::new()
///     .reasoning(ReasoningFormat::Think, false)
///     .tools(ToolFormat::Hermes, true);
/// let mut events = parser.push("<think>Paris is in France.</think>\n\nLet me check.\n<tool_call>\n");
/// events.extend(parser.push("{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
/// events.extend(parser.finish());
/// assert_eq!(events[0], ChatEvent::Reasoning("Paris is in France.".into()));
/// assert_eq!(events[1], ChatEvent::Text("Let me check.\n".into()));
/// let ChatEvent::ToolCall(call) = &events[2] else { panic!() };
/// assert_eq!((call.function.name.as_str(), &call.function.arguments), ("weather", &serde_json::json!({"city": "Paris"})));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ChatParser {
    reasoning: Option<ReasoningSplit>,
    tools: Option<ToolStream>,
    /// Reused between pushes.
    parts: Vec<(Part, String)>,
}

impl ChatParser {
    /// A parser that passes the output through as text.
    pub fn new() -> ChatParser {
        ChatParser::default()
    }

    /// Splits thoughts in `format`'s markers from the answer; `opened`:
    /// the prompt ends inside the thoughts (its template wrote the opening
    /// marker), so the output starts with thoughts.
    #[must_use]
    pub fn reasoning(mut self, format: ReasoningFormat, opened: bool) -> Self {
        self.reasoning = ReasoningSplit::new(format, opened);
        self
    }

    /// Reads calls in `format`'s syntax out of the answer (only the first
    /// unless `parallel`).
    #[must_use]
    pub fn tools(mut self, format: ToolFormat, parallel: bool) -> Self {
        self.tools = Some(ToolStream::new(format, parallel));
        self
    }

    /// Whether the output read so far ends inside the thoughts.
    pub fn thinking(&self) -> bool {
        self.reasoning.as_ref().is_some_and(ReasoningSplit::thinking)
    }

    /// Reads the next piece of output.
    pub fn push(&mut self, piece: &str) -> Vec<ChatEvent> {
        let mut parts = std::mem::take(&mut self.parts);
        match &mut self.reasoning {
            Some(split) => split.push(piece, &mut parts),
            None => parts.push((Part::Answer, piece.to_owned())),
        }
        let events = self.route(&mut parts, false);
        self.parts = parts;
        events
    }

    /// The output has ended: what was held back is released (a call that
    /// never completed, with none before it, as text).
    pub fn finish(&mut self) -> Vec<ChatEvent> {
        let mut parts = std::mem::take(&mut self.parts);
        if let Some(split) = &mut self.reasoning {
            split.finish(&mut parts);
        }
        self.route(&mut parts, true)
    }

    fn route(&mut self, parts: &mut Vec<(Part, String)>, finish: bool) -> Vec<ChatEvent> {
        let mut events = Vec::new();
        for (part, text) in parts.drain(..) {
            match (part, &mut self.tools) {
                (Part::Reasoning, _) => events.push(ChatEvent::Reasoning(text)),
                (Part::Answer, Some(tools)) => events.extend(tools.push(&text).into_iter().map(tool_event)),
                (Part::Answer, None) => events.push(ChatEvent::Text(text)),
            }
        }
        if finish && let Some(tools) = &mut self.tools {
            events.extend(tools.finish().into_iter().map(tool_event));
        }
        // Empty texts are no events.
        events.retain(|e| !matches!(e, ChatEvent::Text(t) | ChatEvent::Reasoning(t) if t.is_empty()));
        events
    }
}

fn tool_event(event: ToolEvent) -> ChatEvent {
    match event {
        ToolEvent::Text(text) => ChatEvent::Text(text),
        ToolEvent::Call(call) => ChatEvent::ToolCall(tool_call(call)),
    }
}

fn tool_call(ParsedCall { name, arguments }: ParsedCall) -> ToolCall {
    // The parser wrote the arguments from a JSON object.
    let arguments = serde_json::from_str(&arguments).unwrap_or_default();
    ToolCall { id: None, kind: "function".to_owned(), function: FunctionCall { name, arguments } }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Events with the texts of each kind joined: (thoughts, text, calls).
    fn joined(events: &[ChatEvent]) -> (String, String, Vec<(String, serde_json::Value)>) {
        let (mut thoughts, mut text, mut calls) = (String::new(), String::new(), Vec::new());
        for e in events {
            match e {
                ChatEvent::Reasoning(t) => thoughts.push_str(t),
                ChatEvent::Text(t) => text.push_str(t),
                ChatEvent::ToolCall(c) => calls.push((c.function.name.clone(), c.function.arguments.clone())),
                ChatEvent::Done { .. } => panic!("a parser yields no Done"),
            }
        }
        (thoughts, text, calls)
    }

    fn run(parser: impl Fn() -> ChatParser, pieces: &[&str]) -> (String, String, Vec<(String, serde_json::Value)>) {
        let mut p = parser();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        // Thoughts come before any text or call.
        let first_answer = events.iter().position(|e| !matches!(e, ChatEvent::Reasoning(_)));
        if let Some(i) = first_answer {
            assert!(events[i..].iter().all(|e| !matches!(e, ChatEvent::Reasoning(_))), "{events:?}");
        }
        joined(&events)
    }

    /// Canned outputs of each template family: `(format, tool syntax,
    /// opened by the prompt, output, thoughts, text, calls)`.
    #[allow(clippy::type_complexity)]
    fn cases() -> Vec<(ReasoningFormat, ToolFormat, bool, &'static str, &'static str, &'static str, usize)> {
        use ReasoningFormat::*;
        vec![
            // DeepSeek R1 distills: the prompt opens `<think>\n`.
            (
                Think,
                ToolFormat::DeepSeekR1,
                true,
                "Okay, 2 + 2.\nThat is 4.\n</think>\n\nThe answer is 4.",
                "Okay, 2 + 2.\nThat is 4.",
                "The answer is 4.",
                0,
            ),
            (
                Think,
                ToolFormat::DeepSeekR1,
                true,
                "I need the weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "I need the weather.",
                "",
                1,
            ),
            // Qwen 3: the model opens its thoughts; a call after them.
            (
                Think,
                ToolFormat::Hermes,
                false,
                "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "The user wants the weather in Paris.",
                "",
                1,
            ),
            // Qwen 3 with thinking off: an empty thought, then the answer.
            (Think, ToolFormat::Hermes, false, "<think>\n\n</think>\n\nHello!", "", "Hello!", 0),
            // QwQ: opened by the prompt.
            (Think, ToolFormat::Hermes, true, "Hmm < 3 of them? </think>\nThree.", "Hmm < 3 of them?", "Three.", 0),
            // No thoughts at all.
            (Think, ToolFormat::Hermes, false, "  Just an answer <thin", "", "Just an answer <thin", 0),
            // Unclosed thoughts stay thoughts.
            (Think, ToolFormat::Hermes, true, "still thinking about it", "still thinking about it", "", 0),
            (
                SeedThink,
                ToolFormat::Generic,
                false,
                "<seed:think>Let me see.</seed:think>Yes.",
                "Let me see.",
                "Yes.",
                0,
            ),
            (
                CommandR,
                ToolFormat::CommandR7b,
                false,
                "<|START_THINKING|>I should call add.<|END_THINKING|><|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}]<|END_ACTION|>",
                "I should call add.",
                "",
                1,
            ),
            (Mistral, ToolFormat::MistralArgs, false, "[THINK]Simple.[/THINK]It is 4.", "Simple.", "It is 4.", 0),
            (Gemma4, ToolFormat::Generic, false, "<|channel>thought\nShort.<channel|>Answer.", "Short.", "Answer.", 0),
        ]
    }

    #[test]
    fn each_family_splits_whole_and_at_every_character() {
        for (format, tools, opened, output, thoughts, text, n_calls) in cases() {
            let parser = || ChatParser::new().reasoning(format, opened).tools(tools, true);
            let whole = run(parser, &[output]);
            assert_eq!((whole.0.as_str(), whole.1.as_str()), (thoughts, text), "{format:?}: {output:?}");
            assert_eq!(whole.2.len(), n_calls, "{format:?}: {output:?}");
            for (i, _) in output.char_indices().skip(1) {
                assert_eq!(run(parser, &[&output[..i], &output[i..]]), whole, "{format:?} split at {i}: {output:?}");
            }
            let chars: Vec<String> = output.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(run(parser, &pieces), whole, "{format:?} a character at a time: {output:?}");
        }
    }

    #[test]
    fn a_call_after_thoughts_has_its_arguments() {
        let (thoughts, text, calls) = run(
            || ChatParser::new().reasoning(ReasoningFormat::Think, false).tools(ToolFormat::Hermes, true),
            &[cases()[2].3],
        );
        assert_eq!((thoughts.as_str(), text.as_str()), ("The user wants the weather in Paris.", ""));
        assert_eq!(calls, vec![("get_weather".to_owned(), json!({"city": "Paris"}))]);
    }

    #[test]
    fn thoughts_stream_before_they_close() {
        let mut p = ChatParser::new().reasoning(ReasoningFormat::Think, false);
        assert_eq!(p.push("<thi"), vec![]);
        assert!(!p.thinking());
        assert_eq!(p.push("nk>\nStep one"), vec![ChatEvent::Reasoning("Step one".into())]);
        assert!(p.thinking());
        // Whitespace and a possible start of `</think>` wait.
        assert_eq!(p.push(".\n</th"), vec![ChatEvent::Reasoning(".".into())]);
        assert_eq!(p.push("ink>\n\nDone"), vec![ChatEvent::Text("Done".into())]);
        assert!(!p.thinking());
    }

    #[test]
    fn without_reasoning_everything_is_text() {
        let (thoughts, text, _) = run(ChatParser::new, &["<think>x</think>y"]);
        assert_eq!((thoughts.as_str(), text.as_str()), ("", "<think>x</think>y"));
    }

    /// The thought format of each shipped template with thought markers.
    #[test]
    fn templates_choose_their_reasoning_format() {
        use ReasoningFormat::*;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendor/llama.cpp/models/templates");
        let expected = [
            ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", Think),
            ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", Think),
            ("deepseek-ai-DeepSeek-V3.1", Think),
            ("Qwen-Qwen3-0.6B", Think),
            ("Qwen-QwQ-32B", Think),
            ("GLM-4.6", Think),
            ("HuggingFaceTB-SmolLM3-3B", Think),
            ("Kimi-K2-Thinking", Think),
            ("MiniMax-M2", Think),
            ("ByteDance-Seed-OSS", SeedThink),
            ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", CommandR),
            ("mistralai-Ministral-3-14B-Reasoning-2512", Mistral),
            ("google-gemma-4-31B-it", Gemma4),
            ("Qwen-Qwen2.5-7B-Instruct", None),
            ("meta-llama-Llama-3.1-8B-Instruct", None),
            ("google-gemma-2-2b-it", None),
        ];
        for (name, format) in expected {
            let path = dir.join(format!("{name}.jinja"));
            let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(ReasoningFormat::from_template(Some(&source)), format, "{name}");
        }
        assert_eq!(ReasoningFormat::from_template(Option::None), None);
    }
}
