//! The tool-call syntaxes of the chat templates llama.cpp ships
//! (`models/templates`), told apart by the markers each template writes,
//! and how each one's calls are read out of a model's output.

use serde_json::Value;

use super::ParsedCall;

/// A tool-call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes 2 Pro / 3, Qwen 2.5, QwQ, Qwen 3:
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>`.
    Hermes,
    /// Llama 3.1–3.3: a bare `{"name": …, "parameters": …}` as the whole
    /// reply (or after `<|python_tag|>`).
    Llama3,
    /// Mistral Nemo: `[TOOL_CALLS][{"name": …, "arguments": …}, …]`.
    MistralList,
    /// Mistral Small 3.2, Devstral: `[TOOL_CALLS]name[ARGS]{…}`.
    MistralArgs,
    /// Functionary v3.1 (Llama 3.1): `<function=name>{…}</function>`.
    FunctionaryV31,
    /// Functionary v3.2: after the prompt's `>>>`, `name\n{…}` per call,
    /// `all\n` for text.
    FunctionaryV32,
    /// DeepSeek R1 (distills): `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{…}\n```<｜tool▁call▁end｜>`.
    DeepSeekR1,
    /// DeepSeek V3.1+: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`.
    DeepSeekV3,
    /// Command R7B: `<|START_ACTION|>[{"tool_name": …, "parameters": …}]<|END_ACTION|>`.
    CommandR7b,
    /// Command R+: `Action: ```json\n[{"tool_name": …, "parameters": …}]\n````.
    CommandRPlus,
    /// Kimi K2: `<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`.
    KimiK2,
    /// A template that shows no tool syntax, or the model has none: the
    /// server describes the tools in a system message and asks for
    /// Hermes' `<tool_call>` syntax, the one most fine-tunes learned.
    Generic,
}

const DEEPSEEK_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat {
    /// The syntax a chat template teaches, from the markers in its source
    /// (`None`: the model has no template). Templates that name a syntax
    /// not listed here (Qwen3-Coder's XML parameters, …) get
    /// [`ToolFormat::Generic`].
    pub fn from_template(source: Option<&str>) -> ToolFormat {
        let Some(t) = source else {
            return ToolFormat::Generic;
        };
        let has = |m: &str| t.contains(m);
        if has("tool_calls_section_begin") {
            ToolFormat::KimiK2
        } else if has("tool▁calls▁begin") {
            if has("```json") { ToolFormat::DeepSeekR1 } else { ToolFormat::DeepSeekV3 }
        } else if has("[TOOL_CALLS]") {
            if has("[ARGS]") { ToolFormat::MistralArgs } else { ToolFormat::MistralList }
        } else if has("<|START_ACTION|>") {
            ToolFormat::CommandR7b
        } else if has("Action:") && has("tool_name") {
            ToolFormat::CommandRPlus
        } else if has("<tool_call>") && !has("<parameter=") {
            ToolFormat::Hermes
        } else if has("<function=") && has("<|start_header_id|>") {
            ToolFormat::FunctionaryV31
        } else if has(">>>") && has("all") {
            ToolFormat::FunctionaryV32
        } else if has("<|start_header_id|>") && has("\"parameters\"") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the syntax's markers are control tokens, whose text the
    /// engine must keep in the output for the parser to see them.
    pub fn markers_are_tokens(self) -> bool {
        matches!(
            self,
            ToolFormat::MistralList
                | ToolFormat::MistralArgs
                | ToolFormat::DeepSeekR1
                | ToolFormat::DeepSeekV3
                | ToolFormat::CommandR7b
                | ToolFormat::KimiK2
                | ToolFormat::Llama3
                | ToolFormat::FunctionaryV31
        )
    }

    /// Texts that open the calls wherever they appear in the output.
    pub(super) fn openers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => &["<tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::MistralList | ToolFormat::MistralArgs => &["[TOOL_CALLS]"],
            ToolFormat::FunctionaryV31 => &["<function="],
            ToolFormat::FunctionaryV32 => &[">>>"],
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV3 => &["<｜tool▁calls▁begin｜>", DEEPSEEK_CALL_BEGIN],
            ToolFormat::CommandR7b => &["<|START_ACTION|>"],
            ToolFormat::CommandRPlus => &["Action:"],
            ToolFormat::KimiK2 => &["<|tool_calls_section_begin|>", "<|tool_call_begin|>"],
        }
    }

    /// How the output's start is read, before any opener: some syntaxes
    /// start their calls at the very beginning without one.
    pub(super) fn leading(self, text: &str) -> Leading {
        match self {
            ToolFormat::Llama3 => match text.trim_start().chars().next() {
                None => Leading::Undecided,
                Some('{') => Leading::Calls,
                Some(_) => Leading::Text { skip: 0 },
            },
            // The prompt ends with `>>>`: the first line names the
            // recipient, `all` for text to the user.
            ToolFormat::FunctionaryV32 => {
                if text.starts_with("all\n") {
                    Leading::Text { skip: 4 }
                } else if "all\n".starts_with(text) {
                    Leading::Undecided
                } else {
                    Leading::Calls
                }
            }
            _ => Leading::Text { skip: 0 },
        }
    }

    /// The complete calls in `section` (the output from where the calls
    /// open). A call still being written is not among them, and a call
    /// once returned stays the same as the section grows.
    pub(super) fn calls(self, section: &str) -> Vec<ParsedCall> {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => {
                enclosed(section, "<tool_call>", "</tool_call>").filter_map(|body| json_call(body.trim())).collect()
            }
            ToolFormat::Llama3 => {
                let body = section.strip_prefix("<|python_tag|>").unwrap_or(section);
                json_values(body, ";").iter().filter_map(call_from_json).collect()
            }
            ToolFormat::MistralList => {
                let body = section.strip_prefix("[TOOL_CALLS]").unwrap_or(section);
                match json_values(body, "").first() {
                    Some(Value::Array(items)) => items.iter().filter_map(call_from_json).collect(),
                    Some(one @ Value::Object(_)) => call_from_json(one).into_iter().collect(),
                    _ => Vec::new(),
                }
            }
            ToolFormat::MistralArgs => section
                .split("[TOOL_CALLS]")
                .skip(1)
                .map_while(|part| {
                    let (name, args) = part.split_once("[ARGS]")?;
                    let value = json_values(args, "").into_iter().next()?;
                    named(name.trim(), &value)
                })
                .collect(),
            ToolFormat::FunctionaryV31 => section
                .split("<function=")
                .skip(1)
                .map_while(|part| {
                    let (name, rest) = part.split_once('>')?;
                    let (args, _) = rest.split_once("</function>")?;
                    named(name.trim(), &serde_json::from_str(args.trim()).ok()?)
                })
                .collect(),
            ToolFormat::FunctionaryV32 => {
                let mut calls = Vec::new();
                for part in section.strip_prefix(">>>").unwrap_or(section).split(">>>") {
                    let Some((name, args)) = part.split_once('\n') else { break };
                    if name.trim() == "all" {
                        continue;
                    }
                    let Some(value) = json_values(args, "").into_iter().next() else { break };
                    match named(name.trim(), &value) {
                        Some(call) => calls.push(call),
                        None => break,
                    }
                }
                calls
            }
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV3 => {
                enclosed(section, DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END)
                    .filter_map(|body| {
                        let (head, rest) = body.split_once(DEEPSEEK_SEP)?;
                        // R1 writes the type, then the name on the next line
                        // and the arguments in a fenced block; V3 the name.
                        let (name, args) = if head.trim() == "function" {
                            let (name, args) = rest.split_once('\n')?;
                            (name, fenced(args))
                        } else {
                            (head, rest)
                        };
                        named(name.trim(), &serde_json::from_str(args.trim()).ok()?)
                    })
                    .collect()
            }
            ToolFormat::CommandR7b => enclosed(section, "<|START_ACTION|>", "<|END_ACTION|>")
                .flat_map(|body| list_of_calls(body.trim()))
                .collect(),
            ToolFormat::CommandRPlus => {
                let body = section.strip_prefix("Action:").unwrap_or(section);
                match body.trim_start().strip_prefix("```json").and_then(|b| b.split_once("```")) {
                    Some((list, _)) => list_of_calls(list.trim()),
                    None => Vec::new(),
                }
            }
            ToolFormat::KimiK2 => enclosed(section, "<|tool_call_begin|>", "<|tool_call_end|>")
                .filter_map(|body| {
                    let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
                    // `functions.name:0`
                    let name = id.trim().strip_prefix("functions.").unwrap_or(id.trim());
                    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
                    named(name, &serde_json::from_str(args.trim()).ok()?)
                })
                .collect(),
        }
    }
}

/// How the start of an output is read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Leading {
    /// Too little text to tell.
    Undecided,
    /// Text to the user, after `skip` bytes of syntax.
    Text { skip: usize },
    /// The calls start here.
    Calls,
}

/// The bodies between each `open` and the `close` after it (complete
/// ones only).
fn enclosed<'a>(text: &'a str, open: &'a str, close: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.split(open).skip(1).map_while(move |part| part.split_once(close).map(|(body, _)| body))
}

/// The JSON values at the start of `text`, one after another (separated by
/// whitespace and `sep`), up to the first that is incomplete or invalid.
fn json_values(text: &str, sep: &str) -> Vec<Value> {
    let mut values = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(value)) = stream.next() else { break };
        // A number at the end of the text may still grow.
        if value.is_number() && stream.byte_offset() == rest.len() {
            break;
        }
        rest = rest[stream.byte_offset()..].trim_start();
        values.push(value);
        if !sep.is_empty() {
            match rest.strip_prefix(sep) {
                Some(r) => rest = r.trim_start(),
                None => break,
            }
        }
    }
    values
}

/// The inside of a ```` ```json ```` fence, or the text as it is.
fn fenced(text: &str) -> &str {
    let t = text.trim();
    let t = t.strip_prefix("```json").or_else(|| t.strip_prefix("```")).unwrap_or(t);
    t.strip_suffix("```").unwrap_or(t)
}

/// One call written as a JSON object.
fn json_call(text: &str) -> Option<ParsedCall> {
    call_from_json(&serde_json::from_str(text).ok()?)
}

/// A call object: the name under `name`, `tool_name` or `function`, the
/// arguments under `arguments` or `parameters` (an object, or JSON text).
fn call_from_json(v: &Value) -> Option<ParsedCall> {
    let name = ["name", "tool_name", "function"].iter().find_map(|k| v.get(k)?.as_str())?;
    let args =
        ["arguments", "parameters"].iter().find_map(|k| v.get(k)).cloned().unwrap_or(Value::Object(Default::default()));
    let args = match args {
        Value::String(text) => serde_json::from_str(&text).ok()?,
        other => other,
    };
    named(name, &args)
}

/// A JSON list of call objects (Command R).
fn list_of_calls(text: &str) -> Vec<ParsedCall> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items.iter().filter_map(call_from_json).collect(),
        _ => Vec::new(),
    }
}

/// A call, if the name is a plausible function name and the arguments an
/// object.
fn named(name: &str, args: &Value) -> Option<ParsedCall> {
    let plausible = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    (plausible && args.is_object()).then(|| ParsedCall { name: name.to_owned(), arguments: args.to_string() })
}
