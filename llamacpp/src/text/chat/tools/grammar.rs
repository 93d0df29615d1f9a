//! A constraint that admits only calls in the model's syntax, with
//! arguments valid against each tool's parameter schema: what
//! `tool_choice: "required"` or a named function runs under, so that even
//! a base model answers with a call a client can execute. It is a Lark
//! grammar for llguidance ([`crate::constraint`]), each tool's arguments an
//! inline `%json` schema with the tight options, and the syntax's markers
//! that are control tokens of the model written as those tokens.

use super::definition::{ToolChoice, Tools};
use super::format::ToolFormat;
use crate::error::{Error, Result};
use crate::llama::model::Model;
use crate::llama::vocab::{AddBos, Special, Vocab};
use crate::sampling::constraint::{Constraint, JsonOptions};
use crate::sampling::sampler::SamplerChain;

/// How a syntax writes its calls: the text around them and between them.
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

    /// The text of one call before the function's name, between the name
    /// and the arguments, and after them.
    fn call(self) -> (&'static str, &'static str, &'static str) {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => {
                ("<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>")
            }
            ToolFormat::Llama3 => ("{\"name\": \"", "\", \"parameters\": ", "}"),
            ToolFormat::MistralList => ("{\"name\": \"", "\", \"arguments\": ", "}"),
            ToolFormat::MistralArgs => ("[TOOL_CALLS]", "[ARGS]", ""),
            ToolFormat::FunctionaryV31 => ("<function=", ">", "</function>"),
            ToolFormat::FunctionaryV32 => ("", "\n", ""),
            ToolFormat::DeepSeekR1 => {
                ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n", "\n```<｜tool▁call▁end｜>")
            }
            ToolFormat::DeepSeekV3 => ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
            ToolFormat::CommandR7b | ToolFormat::CommandRPlus => ("{\"tool_name\": \"", "\", \"parameters\": ", "}"),
            ToolFormat::KimiK2 => {
                ("<|tool_call_begin|>functions.", ":0<|tool_call_argument_begin|>", "<|tool_call_end|>")
            }
        }
    }
}

/// `text` as a sequence of Lark elements: its runs of ordinary text as
/// string literals, and each control token of the model in it (which no
/// text can produce: `[TOOL_CALLS]`, `<|START_ACTION|>`, ...) as that token
/// (`<[id]>`). Empty for empty text. Tokenizing with control tokens
/// parsed tells which ones occur; the text is split at their markup.
fn lark_text(text: &str, vocab: &Vocab) -> Result<String> {
    let literal = |s: &str| serde_json::to_string(s).map_err(|e| Error::InvalidArgument(e.to_string()));
    let mut controls: Vec<(String, i32)> = Vec::new();
    for t in vocab.tokenize_special(text, AddBos::No)? {
        if vocab.is_control(t) {
            let markup = vocab.token_to_piece(t, Special::Markup)?;
            let markup = String::from_utf8_lossy(&markup).into_owned();
            if !markup.is_empty() && !controls.iter().any(|(m, _)| *m == markup) {
                controls.push((markup, t.0));
            }
        }
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = controls.iter().filter_map(|(m, id)| rest.find(m.as_str()).map(|at| (at, m.len(), *id))).min();
        match next {
            Some((at, len, id)) => {
                if at > 0 {
                    out.push(literal(&rest[..at])?);
                }
                out.push(format!("<[{id}]>"));
                rest = &rest[at + len..];
            }
            None => {
                out.push(literal(rest)?);
                rest = "";
            }
        }
    }
    Ok(out.join(" "))
}

/// The constraint of what a forced request may answer: one call (or, with
/// `parallel_tool_calls`, one or more) to the required tool or any tool,
/// each tool's arguments valid against its `parameters`.
///
/// # Errors
/// [`Error::InvalidParameter`] (`tools`) if a tool's parameters are a
/// schema llguidance refuses; the vocabulary's errors if the syntax's text
/// cannot be tokenized.
pub(crate) fn forcing_constraint(format: ToolFormat, tools: &Tools, model: &Model) -> Result<Constraint> {
    let vocab = model.vocab();
    let (before, between, after) = format.call();
    let mut rules = String::new();
    let mut calls = Vec::new();
    for (i, tool) in tools.functions().iter().enumerate() {
        let (name, parameters) = (&tool.name, &tool.parameters);
        if let ToolChoice::Named(wanted) = tools.tool_choice()
            && wanted != name
        {
            continue;
        }
        // Compiled alone first, so that a bad schema is the tool's error.
        let alone = Constraint::json_schema(parameters.clone()).with_json_options(JsonOptions::tight());
        SamplerChain::new()
            .constraint(model, &alone)
            .greedy()
            .build()
            .map_err(|e| Error::InvalidParameter { name: "tools", message: format!("tools[{i}]: parameters: {e}") })?;
        let schema = JsonOptions::tight().prepare(parameters);
        let head = lark_text(&format!("{before}{name}{between}"), vocab)?;
        let tail = lark_text(after, vocab)?;
        rules.push_str(&format!("call{i}: {head} args{i} {tail}\nargs{i}: %json {schema}\n"));
        calls.push(format!("call{i}"));
    }
    let shape = format.shape();
    let (open, separator, close) =
        (lark_text(shape.open, vocab)?, lark_text(shape.separator, vocab)?, lark_text(shape.close, vocab)?);
    let more = if tools.is_parallel() { format!("({separator} call)*") } else { String::new() };
    Ok(Constraint::lark(format!("start: {open} call {more} {close}\ncall: {}\n{rules}", calls.join(" | "))))
}

// They sample under the constraints (llguidance).
#[cfg(all(test, feature = "testing", feature = "constraints"))]
mod tests {
    use serde_json::json;

    use super::super::definition::Tool;
    use super::*;
    use crate::llama::model::ModelParams;
    use crate::llama::types::Token;
    use crate::testing::{TINY_CONTROL_TOKEN, TINY_CONTROL_TOKEN_ID, TinyModelSpec, tiny_llama_path};

    fn tiny() -> Model {
        Model::load(tiny_llama_path(&TinyModelSpec::default()).unwrap(), &ModelParams::default()).unwrap()
    }

    /// Whether `constraint` lets `text` be written in full, one byte token
    /// at a time (the tiny vocabulary's tokenizer adds a leading space),
    /// and then end.
    fn accepts(model: &Model, constraint: &Constraint, text: &str) -> bool {
        let vocab = model.vocab();
        let byte_token = |b: u8| {
            (0..vocab.n_tokens() as i32)
                .map(Token)
                .find(|&t| vocab.token_to_piece(t, Special::Plain).unwrap() == [b])
                .unwrap_or_else(|| panic!("no token for byte {b}"))
        };
        let mut sampler = SamplerChain::new().constraint(model, constraint).greedy().build().unwrap();
        let tokens: Vec<Token> = text.bytes().map(byte_token).collect();
        tokens.into_iter().chain(vocab.eos()).all(|t| match sampler.accept(t) {
            Ok(()) => true,
            Err(Error::Grammar(_)) => false,
            Err(e) => panic!("{e}"),
        })
    }

    const ALL: [ToolFormat; 12] = [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::MistralList,
        ToolFormat::MistralArgs,
        ToolFormat::FunctionaryV31,
        ToolFormat::FunctionaryV32,
        ToolFormat::DeepSeekR1,
        ToolFormat::DeepSeekV3,
        ToolFormat::CommandR7b,
        ToolFormat::CommandRPlus,
        ToolFormat::KimiK2,
        ToolFormat::Generic,
    ];

    /// In every syntax, a call to a tool with valid arguments passes, and
    /// a call to an unknown tool or with arguments its schema refuses
    /// does not; with parallel calls, two in a row pass.
    #[test]
    fn each_syntax_forces_a_valid_call() {
        let model = tiny();
        let add = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                         "required": ["a", "b"]});
        for format in ALL {
            for parallel in [false, true] {
                let tools = Tools::new([Tool::new("add", "adds", add.clone())])
                    .unwrap()
                    .choice(ToolChoice::Required)
                    .unwrap()
                    .parallel(parallel);
                let constraint = forcing_constraint(format, &tools, &model).unwrap();
                let (before, between, after) = format.call();
                let shape = format.shape();
                let call = |name: &str, args: &str| format!("{before}{name}{between}{args}{after}");
                let one = call("add", r#"{"a": 1, "b": 2}"#);
                let whole = |calls: &[String]| format!("{}{}{}", shape.open, calls.join(shape.separator), shape.close);
                let single = whole(std::slice::from_ref(&one));
                assert!(accepts(&model, &constraint, &single), "{format:?}: {single}");
                let two = whole(&[one.clone(), one.clone()]);
                assert_eq!(accepts(&model, &constraint, &two), parallel, "{format:?} parallel {parallel}: {two}");
                let wrong_name = whole(&[call("sub", r#"{"a": 1, "b": 2}"#)]);
                assert!(!accepts(&model, &constraint, &wrong_name), "{format:?}: {wrong_name}");
                let bad_args = whole(&[call("add", r#"{"a": "1", "b": 2}"#)]);
                assert!(!accepts(&model, &constraint, &bad_args), "{format:?}: {bad_args}");
            }
        }
    }

    #[test]
    fn control_tokens_in_the_syntax_are_written_as_tokens() {
        let model = tiny();
        let text = lark_text(&format!("a{TINY_CONTROL_TOKEN}b"), model.vocab()).unwrap();
        assert_eq!(text, format!("\"a\" <[{TINY_CONTROL_TOKEN_ID}]> \"b\""));
        let bad = Tools::new([Tool::new("f", "", json!({"type": "strin"}))])
            .unwrap()
            .choice(ToolChoice::Required)
            .unwrap()
            .parallel(false);
        let e = forcing_constraint(ToolFormat::Hermes, &bad, &model).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidParameter { name: "tools", message } if message.contains("tools[0]: parameters")),
            "{e:?}"
        );
    }
}
