//! A grammar that admits only calls in the model's syntax, with arguments
//! valid against each tool's parameter schema: what `tool_choice:
//! "required"` or a named function runs under, so that even a base model
//! answers with a call a client can execute.

use super::format::ToolFormat;
use super::request::{ToolChoice, Tools};
use crate::openai::ApiError;

/// How a syntax writes its calls: the text around them, and one call with
/// its name and arguments (rule names in GBNF).
struct Shape {
    open: &'static str,
    separator: &'static str,
    close: &'static str,
}

impl ToolFormat {
    fn shape(self) -> Shape {
        let s = |open, separator, close| Shape { open, separator, close };
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => s("", "\n", ""),
            ToolFormat::Llama3 => s("", "; ", ""),
            ToolFormat::MistralList => s("[TOOL_CALLS][", ", ", "]"),
            ToolFormat::MistralArgs | ToolFormat::FunctionaryV31 | ToolFormat::DeepSeekV3 => s("", "", ""),
            ToolFormat::FunctionaryV32 => s("", ">>>", ""),
            ToolFormat::DeepSeekR1 => s("<｜tool▁calls▁begin｜>", "", "<｜tool▁calls▁end｜>"),
            ToolFormat::CommandR7b => s("<|START_ACTION|>[", ", ", "]<|END_ACTION|>"),
            ToolFormat::CommandRPlus => s("Action: ```json\n[", ", ", "]\n```"),
            ToolFormat::KimiK2 => s("<|tool_calls_section_begin|>", "", "<|tool_calls_section_end|>"),
        }
    }

    /// One call to `name` (a literal-safe name) with arguments `args` (a
    /// rule), as a GBNF sequence.
    fn call(self, name: &str, args: &str) -> String {
        let (before, between, after) = match self {
            ToolFormat::Hermes | ToolFormat::Generic => {
                ("<tool_call>\\n{\\\"name\\\": \\\"", "\\\", \\\"arguments\\\": ", "}\\n</tool_call>")
            }
            ToolFormat::Llama3 => ("{\\\"name\\\": \\\"", "\\\", \\\"parameters\\\": ", "}"),
            ToolFormat::MistralList => ("{\\\"name\\\": \\\"", "\\\", \\\"arguments\\\": ", "}"),
            ToolFormat::MistralArgs => ("[TOOL_CALLS]", "[ARGS]", ""),
            ToolFormat::FunctionaryV31 => ("<function=", ">", "</function>"),
            ToolFormat::FunctionaryV32 => ("", "\\n", ""),
            ToolFormat::DeepSeekR1 => {
                ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\\n```json\\n", "\\n```<｜tool▁call▁end｜>")
            }
            ToolFormat::DeepSeekV3 => ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
            ToolFormat::CommandR7b | ToolFormat::CommandRPlus => {
                ("{\\\"tool_name\\\": \\\"", "\\\", \\\"parameters\\\": ", "}")
            }
            ToolFormat::KimiK2 => {
                ("<|tool_call_begin|>functions.", ":0<|tool_call_argument_begin|>", "<|tool_call_end|>")
            }
        };
        let after = if after.is_empty() { String::new() } else { format!(" \"{after}\"") };
        format!("\"{before}{name}{between}\" {args}{after}")
    }
}

/// The grammar of what a forced request may answer: one call (or, with
/// `parallel_tool_calls`, one or more) to the required tool or any tool,
/// each tool's arguments valid against its `parameters`.
///
/// # Errors
/// A 400 (`tools`) if a tool's parameters cannot be turned into a grammar.
pub fn forcing_grammar(format: ToolFormat, tools: &Tools) -> Result<String, ApiError> {
    let mut rules = String::new();
    let mut calls = Vec::new();
    for (i, (name, parameters)) in tools.functions.iter().enumerate() {
        if let ToolChoice::Named(wanted) = &tools.choice
            && wanted != name
        {
            continue;
        }
        let grammar = llama::json_schema::schema_to_grammar(parameters)
            .map_err(|e| ApiError::bad_request(format!("tools[{i}]: parameters: {e}")).param("tools"))?;
        let prefix = format!("tool{i}-");
        rules.push_str(&prefixed(&grammar, &prefix));
        rules.push('\n');
        calls.push(format.call(name, &format!("{prefix}root")));
    }
    let shape = format.shape();
    // GBNF has no empty literal: absent parts are left out.
    let literal = |text: &str| if text.is_empty() { String::new() } else { format!("\"{}\" ", escape(text)) };
    let more = if tools.parallel { format!("({}call)* ", literal(shape.separator)) } else { String::new() };
    Ok(format!(
        "root ::= {}call {more}{}\ncall ::= {}\n{rules}",
        literal(shape.open),
        literal(shape.close),
        calls.join(" | ")
    ))
}

/// A GBNF literal's inside.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `grammar` with every rule name prefixed, so that several grammars can
/// share one file. Names are GBNF's words (letters, digits, `-`, `_`)
/// outside literals, character classes, repetition counts and comments.
fn prefixed(grammar: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(grammar.len() * 2);
    let mut chars = grammar.chars().peekable();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    while let Some(c) = chars.next() {
        match c {
            '"' | '[' => {
                let end = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if d == end {
                        break;
                    }
                }
            }
            '{' | '#' => {
                let end = if c == '{' { '}' } else { '\n' };
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == end {
                        break;
                    }
                }
            }
            c if word(c) => {
                out.push_str(prefix);
                out.push(c);
                while let Some(&d) = chars.peek().filter(|&&d| word(d)) {
                    out.push(d);
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_prefixed_outside_literals_classes_and_counts() {
        let g = "root ::= \"a-b \\\" x\" item{2,3} [a-z\\]] # note root\nitem ::= [0-9]+ | \"root\"";
        assert_eq!(
            prefixed(g, "t0-"),
            "t0-root ::= \"a-b \\\" x\" t0-item{2,3} [a-z\\]] # note root\nt0-item ::= [0-9]+ | \"root\""
        );
    }
}
