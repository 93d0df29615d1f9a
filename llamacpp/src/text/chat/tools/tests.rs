//! Canned outputs in every syntax: read whole, and streamed split at every
//! character boundary (and a character at a time), with the same result.

use super::stream::gather;
use super::stream::parse;
use super::{ParsedCall, ToolChoice, ToolEvent, ToolFormat, ToolStream};
use crate::error::Error;

fn weather() -> ParsedCall {
    ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }
}

fn add() -> ParsedCall {
    ParsedCall { name: "add".into(), arguments: r#"{"a":1,"b":2}"#.into() }
}

/// `(format, output, text, calls)`: each syntax as its template writes a
/// call to `get_weather` and one to `add`.
fn cases() -> Vec<(ToolFormat, &'static str, &'static str, Vec<ParsedCall>)> {
    use ToolFormat::*;
    vec![
        (
            Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            "Let me check.\n",
            vec![weather(), add()],
        ),
        (
            Generic,
            "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}</tool_call>",
            "",
            vec![add()],
        ),
        (Llama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", vec![weather()]),
        (
            Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
            "",
            vec![weather(), add()],
        ),
        (Llama3, "It is sunny.", "It is sunny.", vec![]),
        (
            MistralList,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}, \
             {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
            "",
            vec![weather(), add()],
        ),
        (
            MistralArgs,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 1, \"b\": 2}",
            "",
            vec![weather(), add()],
        ),
        (
            FunctionaryV31,
            "Sure. <function=get_weather>{\"city\": \"Paris\"}</function><function=add>{\"a\": 1, \"b\": 2}</function>",
            "Sure. ",
            vec![weather(), add()],
        ),
        (
            FunctionaryV32,
            "all\nSure.>>>get_weather\n{\"city\": \"Paris\"}>>>add\n{\"a\": 1, \"b\": 2}",
            "Sure.",
            vec![weather(), add()],
        ),
        (FunctionaryV32, "get_weather\n{\"city\": \"Paris\"}", "", vec![weather()]),
        (FunctionaryV32, "all\nNo call.", "No call.", vec![]),
        (
            DeepSeekR1,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n\
             <｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1, \"b\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "",
            vec![weather(), add()],
        ),
        (
            DeepSeekV3,
            "Looking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>\
             <｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 1, \"b\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Looking.",
            vec![weather(), add()],
        ),
        (
            CommandR7b,
            "I will look.<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}},\n    \
             {\"tool_call_id\": \"1\", \"tool_name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}\n]<|END_ACTION|>",
            "I will look.",
            vec![weather(), add()],
        ),
        (
            CommandRPlus,
            "Action: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": {\"city\": \"Paris\"}\n    }\n]\n```",
            "",
            vec![weather()],
        ),
        (
            KimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>\
             <|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>{\"a\": 1, \"b\": 2}<|tool_call_end|><|tool_calls_section_end|>",
            "",
            vec![weather(), add()],
        ),
        // An opener with no complete call after it is text.
        (Hermes, "Use <tool_call> tags.", "Use <tool_call> tags.", vec![]),
        (
            Hermes,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,",
            vec![],
        ),
        // A tail that could have opened a call, but did not.
        (Hermes, "a < b and <tool", "a < b and <tool", vec![]),
    ]
}

/// Streams `pieces` through a reader: the text and calls released.
fn streamed(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ParsedCall>) {
    let mut reader = ToolStream::new(format, true);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(reader.push(piece));
    }
    events.extend(reader.finish());
    gather(events)
}

#[test]
fn each_syntax_is_read_whole_and_split_at_every_character() {
    for (format, output, text, calls) in cases() {
        let expected = (text.to_owned(), calls);
        assert_eq!(parse(format, true, output), expected, "{format:?} whole: {output:?}");
        for (i, _) in output.char_indices().skip(1) {
            let split = streamed(format, &[&output[..i], &output[i..]]);
            assert_eq!(split, expected, "{format:?} split at byte {i}: {output:?}");
        }
        let chars: Vec<String> = output.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(format, &pieces), expected, "{format:?} a character at a time");
    }
}

#[test]
fn text_before_the_calls_streams_before_they_complete() {
    let mut reader = ToolStream::new(ToolFormat::Hermes, true);
    // "<tool" may open a call: held back; the text before it is not.
    assert_eq!(reader.push("Hello <tool"), vec![ToolEvent::Text("Hello ".into())]);
    assert_eq!(reader.push("_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}"), vec![]);
    assert_eq!(reader.push("</tool_call>"), vec![ToolEvent::Call(add())]);
    assert_eq!(reader.finish(), vec![]);
    assert!(reader.called());
}

#[test]
fn without_parallel_calls_only_the_first_is_kept() {
    let (format, output, _, _) = cases().swap_remove(0);
    assert_eq!(parse(format, false, output).1, vec![weather()]);
}

/// The syntax each chat template shipped with llama.cpp is read in
/// (`vendor/llama.cpp/models/templates`, fetched by the build of
/// llamacpp-sys).
#[test]
fn templates_choose_their_syntax() {
    use ToolFormat::*;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendor/llama.cpp/models/templates");
    let expected = [
        ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", Hermes),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", Hermes),
        ("Qwen-Qwen2.5-7B-Instruct", Hermes),
        ("Qwen-QwQ-32B", Hermes),
        ("Qwen-Qwen3-0.6B", Hermes),
        ("meta-llama-Llama-3.1-8B-Instruct", Llama3),
        ("meta-llama-Llama-3.2-3B-Instruct", Llama3),
        ("meta-llama-Llama-3.3-70B-Instruct", Llama3),
        ("mistralai-Mistral-Nemo-Instruct-2407", MistralList),
        ("Mistral-Small-3.2-24B-Instruct-2506", MistralArgs),
        ("unsloth-mistral-Devstral-Small-2507", MistralArgs),
        ("meetkai-functionary-medium-v3.1", FunctionaryV31),
        ("meetkai-functionary-medium-v3.2", FunctionaryV32),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", DeepSeekR1),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", DeepSeekR1),
        ("deepseek-ai-DeepSeek-V3.1", DeepSeekV3),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", CommandR7b),
        ("CohereForAI-c4ai-command-r-plus-tool_use", CommandRPlus),
        ("moonshotai-Kimi-K2", KimiK2),
        ("Kimi-K2-Instruct", KimiK2),
        ("google-gemma-2-2b-it", Generic),
        ("microsoft-Phi-3.5-mini-instruct", Generic),
        ("Qwen3-Coder", Generic),
    ];
    for (name, format) in expected {
        let path = dir.join(format!("{name}.jinja"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (build llamacpp-sys first: it fetches the pinned tree)", path.display())
        });
        assert_eq!(ToolFormat::from_template(Some(&source)), format, "{name}");
    }
    assert_eq!(ToolFormat::from_template(None), Generic);
}

#[test]
fn tool_choice_words_parse() {
    assert_eq!("none".parse::<ToolChoice>().unwrap(), ToolChoice::None);
    assert_eq!("auto".parse::<ToolChoice>().unwrap(), ToolChoice::Auto);
    assert_eq!("required".parse::<ToolChoice>().unwrap(), ToolChoice::Required);
    let e = "any".parse::<ToolChoice>().unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { name: "tool_choice", .. }), "{e}");
}
