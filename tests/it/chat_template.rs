//! `llamacpp::chat::ChatTemplate` renders every chat template llama.cpp ships
//! (`vendor/llama.cpp/models/templates/*.jinja`, real models' templates)
//! exactly as Python's jinja2 renders them with Hugging Face's settings
//! (`tests/chat_template/render_jinja2.py`, jinja2 pinned in
//! `scripts/requirements-test.txt`): byte-equal output, or both refuse.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use llamacpp::Error;
use llamacpp::chat::{ChatMessage, ChatTemplate, RenderOptions};
use serde_json::{Value, json};

const NOW: u64 = 1_764_547_200; // 2025-12-01, for strftime_now
const BOS: &str = "<s>";
const EOS: &str = "</s>";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Value {
    let path = root().join("tests/chat_template").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn templates() -> Vec<PathBuf> {
    let dir = root().join("vendor/llama.cpp/models/templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the llamacpp-sys build extracts it)", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    files.sort();
    files
}

/// What rendering gave: the text, a refusal by `raise_exception`, or
/// another error.
#[derive(Debug, PartialEq)]
enum Outcome {
    Text(String),
    Raised(String),
    Error(String),
}

struct Case {
    template: PathBuf,
    conversation: &'static str,
    messages: Value,
    tools: Option<Value>,
    add_generation_prompt: bool,
}

/// The conversations each template renders: with a system turn; without
/// one (and without the generation prompt); content as a list of text
/// parts; a tool call and its result, with a tool list.
const CONVERSATIONS: usize = 4;

fn cases() -> Vec<Case> {
    let conversations: [(&str, Value, Option<Value>, bool); CONVERSATIONS] = [
        ("multi_turn", fixture("multi_turn.json"), None, true),
        ("no_system", fixture("no_system.json"), None, false),
        ("content_parts", fixture("content_parts.json"), None, true),
        ("tool_call", fixture("tool_call.json"), Some(fixture("tools.json")), true),
    ];
    let mut cases = Vec::new();
    for template in templates() {
        for (conversation, messages, tools, add_generation_prompt) in &conversations {
            cases.push(Case {
                template: template.clone(),
                conversation,
                messages: messages.clone(),
                tools: tools.clone(),
                add_generation_prompt: *add_generation_prompt,
            });
        }
    }
    cases
}

fn render_jinja2(cases: &[Case]) -> Vec<Outcome> {
    let python = llama_suite::python::python().unwrap_or_else(|e| panic!("no Python with jinja2: {e}"));
    let input: Vec<Value> = cases
        .iter()
        .map(|c| {
            json!({"template": c.template, "messages": c.messages, "tools": c.tools,
                   "add_generation_prompt": c.add_generation_prompt, "bos_token": BOS, "eos_token": EOS, "now": NOW})
        })
        .collect();
    let mut child = Command::new(&python)
        .arg(root().join("tests/chat_template/render_jinja2.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    child.stdin.take().unwrap().write_all(serde_json::to_string(&input).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "render_jinja2.py failed: {}", out.status);
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    results
        .into_iter()
        .map(|r| {
            let (kind, text) =
                r.as_object().unwrap().iter().next().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).unwrap();
            match kind.as_str() {
                "ok" => Outcome::Text(text),
                "raised" => Outcome::Raised(text),
                _ => Outcome::Error(text),
            }
        })
        .collect()
}

fn render_here(case: &Case) -> Outcome {
    let source = std::fs::read_to_string(&case.template).unwrap();
    let mut options = RenderOptions::default()
        .add_generation_prompt(case.add_generation_prompt)
        .bos_token(BOS)
        .eos_token(EOS)
        .now(UNIX_EPOCH + Duration::from_secs(NOW));
    if let Some(tools) = &case.tools {
        options = options.tools(tools.clone());
    }
    match ChatTemplate::new(&source).and_then(|t| t.render_json(&case.messages, &options)) {
        Ok(text) => Outcome::Text(text),
        Err(Error::ChatTemplateRaised(m)) => Outcome::Raised(m),
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// Both rendered the same bytes, or both refused the same way (raised
/// with the same message, or failed).
fn agree(python: &Outcome, here: &Outcome) -> bool {
    match (python, here) {
        (Outcome::Text(a), Outcome::Text(b)) | (Outcome::Raised(a), Outcome::Raised(b)) => a == b,
        (Outcome::Error(_), Outcome::Error(_)) => true,
        _ => false,
    }
}

fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let around = |s: &str| {
        // Widen to character boundaries (`floor_char_boundary` needs Rust 1.91).
        let mut start = at.saturating_sub(40);
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + 40).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        format!("{:?}", &s[start..end])
    };
    format!("first difference at byte {at}: jinja2 {} vs here {}", around(a), around(b))
}

/// Renderings that cannot match, each with the reason (the README lists
/// them too). Exactly these differ: a new difference, or one of these
/// starting to match, fails the test.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[(
    "meetkai-functionary-medium-v3.1.jinja",
    "tool_call",
    "jinja2's `|safe` strings are Markup, and `Markup + str` HTML-escapes the str (the tool's JSON becomes \
     `{&#34;name&#34;: …`); minijinja's `+` concatenates, so the JSON comes out as written",
)];

/// Renderings that fail with an error other than `raise_exception` both
/// here and in jinja2 (template, conversation): mostly templates that
/// concatenate a message's content as a string and get the content-parts
/// list, or iterate a `tools` that the conversation does not pass.
const BOTH_FAIL: &[(&str, &str)] = &[
    ("Bielik-11B-v3.0-Instruct.jinja", "content_parts"),
    ("ByteDance-Seed-OSS.jinja", "content_parts"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "multi_turn"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "no_system"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "content_parts"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "tool_call"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "content_parts"),
    ("Kimi-K2-Instruct.jinja", "tool_call"),
    ("Kimi-K2-Thinking.jinja", "tool_call"),
    ("LFM2-8B-A1B.jinja", "content_parts"),
    ("LFM2.5-Instruct.jinja", "content_parts"),
    ("MiMo-VL.jinja", "content_parts"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "content_parts"),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "content_parts"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "multi_turn"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "no_system"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "content_parts"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "multi_turn"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "no_system"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "content_parts"),
    ("Qwen-QwQ-32B.jinja", "content_parts"),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "content_parts"),
    ("Qwen-Qwen3-0.6B.jinja", "content_parts"),
    ("Qwen3-Coder.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "content_parts"),
    ("deepseek-ai-DeepSeek-V4.jinja", "content_parts"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "multi_turn"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "no_system"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "content_parts"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "tool_call"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "content_parts"),
    ("inclusionai-ling-3.0-flash.jinja", "content_parts"),
    ("llama-cpp-deepseek-r1.jinja", "content_parts"),
    ("llama-cpp-deepseek-r1.jinja", "tool_call"),
    ("llama-cpp-rwkv-world.jinja", "content_parts"),
    ("meetkai-functionary-medium-v3.1.jinja", "content_parts"),
    ("meetkai-functionary-medium-v3.2.jinja", "content_parts"),
    ("meetkai-functionary-medium-v3.2.jinja", "tool_call"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "content_parts"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "content_parts"),
    ("openai-gpt-oss-120b.jinja", "content_parts"),
    ("openbmb-MiniCPM5-1B.jinja", "content_parts"),
    ("poolside-Laguna-S-2.1.jinja", "content_parts"),
    ("poolside-Laguna-XS-2.1.jinja", "content_parts"),
    ("poolside-Laguna-XS.2.jinja", "content_parts"),
    ("upstage-Solar-Open-100B.jinja", "content_parts"),
];

#[test]
fn every_template_renders_as_jinja2_does() {
    let cases = cases();
    assert!(
        cases.len() >= CONVERSATIONS * 70,
        "expected llama.cpp's 70+ templates, found {}",
        cases.len() / CONVERSATIONS
    );
    let expected = render_jinja2(&cases);
    assert_eq!(expected.len(), cases.len());
    let mut mismatches = Vec::new();
    let mut differing = Vec::new();
    let (mut texts, mut refusals) = (0, 0);
    let mut both_failed = Vec::new();
    for (case, python) in cases.iter().zip(&expected) {
        let here = render_here(case);
        let file = case.template.file_name().unwrap().to_string_lossy().into_owned();
        if agree(python, &here) {
            match python {
                Outcome::Text(_) => texts += 1,
                Outcome::Raised(_) => refusals += 1,
                Outcome::Error(_) => both_failed.push((file, case.conversation)),
            }
            continue;
        }
        let why = match (python, &here) {
            (Outcome::Text(a), Outcome::Text(b)) => first_difference(a, b),
            _ => format!("jinja2 {python:?}\n      here {here:?}"),
        };
        mismatches.push(format!("{file} / {}: {why}", case.conversation));
        differing.push((file, case.conversation));
    }
    let templates = cases.len() / CONVERSATIONS;
    let mut bad_templates: Vec<&str> = differing.iter().map(|(f, _)| f.as_str()).collect();
    bad_templates.dedup();
    eprintln!(
        "chat templates: {} of {} templates agree with jinja2 on every conversation; {} of {} renderings agree \
         ({texts} byte-equal texts, {refusals} refused by both, {} failed in both)",
        templates - bad_templates.len(),
        templates,
        texts + refusals + both_failed.len(),
        cases.len(),
        both_failed.len(),
    );
    for m in &mismatches {
        eprintln!("  MISMATCH {m}");
    }
    let known: Vec<(String, &str)> = KNOWN_DIFFERENCES.iter().map(|(f, c, _)| ((*f).to_owned(), *c)).collect();
    assert_eq!(differing, known, "the renderings that differ from jinja2 are not the known ones");
    // Two failures agree whatever their causes, so which renderings fail
    // on both sides is pinned: a new failure here that jinja2 happens to
    // share is not counted as agreement silently.
    let both_failed: Vec<(&str, &str)> = both_failed.iter().map(|(f, c)| (f.as_str(), *c)).collect();
    assert_eq!(both_failed, BOTH_FAIL, "the renderings that fail in both are not the known ones");
    // Most conversations render: the comparison is of real prompts.
    assert!(texts >= CONVERSATIONS * 50, "only {texts} renderings produced text");
}

/// The CLI prints the prompt and nothing else, exits 3 when the template
/// raises and 1 on any other error.
#[test]
fn the_cli_renders_and_reports_errors_by_exit_status() {
    let exe = std::env::current_exe().unwrap();
    let cli = exe.parent().unwrap().parent().unwrap().join("examples/chat_template");
    assert!(cli.exists(), "{} is built by `cargo test`", cli.display());
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let template = write(
        "t.jinja",
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
         {{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}[assistant]{% endif %}{{ tools | tojson }}",
    );
    let user = write("user.json", r#"[{"role": "user", "content": "Grüße"}]"#);
    let system = write("system.json", r#"[{"role": "system", "content": "x"}]"#);
    let tools = write("tools.json", r#"[{"name": "f"}]"#);
    let run = |args: &[&std::ffi::OsStr]| Command::new(&cli).args(args).output().unwrap();
    let p = |p: &PathBuf| p.as_os_str().to_owned();
    let ok = run(&[
        "--template".as_ref(),
        &p(&template),
        "--messages".as_ref(),
        &p(&user),
        "--tools".as_ref(),
        &p(&tools),
        "--add-generation-prompt".as_ref(),
        "--bos-token".as_ref(),
        "<s>".as_ref(),
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(String::from_utf8(ok.stdout).unwrap(), "<s>[user] Grüße\n[assistant][{\"name\": \"f\"}]");
    assert!(ok.stderr.is_empty());

    let raised = run(&["--template".as_ref(), &p(&template), "--messages".as_ref(), &p(&system)]);
    assert_eq!(raised.status.code(), Some(3));
    assert!(raised.stdout.is_empty());
    let err = String::from_utf8(raised.stderr).unwrap();
    assert_eq!(err, "error: the template refused the conversation: System role not supported\n");

    let bad = write("bad.jinja", "{% for %}");
    let broken = run(&["--template".as_ref(), &p(&bad), "--messages".as_ref(), &p(&user)]);
    assert_eq!(broken.status.code(), Some(1));
    let err = String::from_utf8(broken.stderr).unwrap();
    assert!(err.starts_with("error: chat template error: syntax error") && err.lines().count() == 1, "{err:?}");
    let missing = run(&["--template".as_ref(), &p(&template), "--messages".as_ref(), "/nonexistent.json".as_ref()]);
    assert_eq!(missing.status.code(), Some(1));
}

/// A compiled template is reused across renders and threads, and renders
/// typed messages (tool calls, tool results, text parts) as the same
/// conversation written as JSON.
#[test]
fn typed_messages_render_as_their_json() {
    use llamacpp::chat::{ContentPart, FunctionCall, MessageContent, ToolCall};
    let source =
        std::fs::read_to_string(root().join("vendor/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja")).unwrap();
    let template = ChatTemplate::new(&source).unwrap();
    let mut call = ChatMessage::assistant("");
    call.tool_calls.push(ToolCall {
        id: Some("call_0001".into()),
        kind: "function".into(),
        function: FunctionCall { name: "get_weather".into(), arguments: json!({"city": "Paris", "unit": "celsius"}) },
    });
    let mut result = ChatMessage::tool("call_0001", "{\"temperature\": 18, \"sky\": \"cloudy\"}");
    result.name = Some("get_weather".into());
    let user = ChatMessage::user("What's the weather in Paris right now?");
    let typed = [ChatMessage::system("You can look up the weather."), user, call, result];
    let json = json!([
        {"role": "system", "content": "You can look up the weather."},
        {"role": "user", "content": "What's the weather in Paris right now?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0001", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}", "tool_call_id": "call_0001", "name": "get_weather"},
    ]);
    let options = RenderOptions::default().add_generation_prompt(true).tools(fixture("tools.json"));
    let from_json = template.render_json(&json, &options).unwrap();
    assert!(from_json.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"), "{from_json}");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (template, typed, options) = (template.clone(), typed.clone(), options.clone());
            std::thread::spawn(move || template.render(&typed, &options).unwrap())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), from_json);
    }
    // Deserialized OpenAI-style messages are the same values.
    let parsed: Vec<ChatMessage> = serde_json::from_value(json).unwrap();
    assert_eq!(parsed, typed);
    let parts: ChatMessage = serde_json::from_value(
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
    )
    .unwrap();
    assert_eq!(
        parts.content,
        Some(MessageContent::Parts(vec![
            ContentPart::Text { text: "a".into() },
            ContentPart::Text { text: "b".into() }
        ]))
    );
    assert_eq!(parts.text(), "ab");
}

/// Template text assembled from Jinja fragments (most of it invalid) never
/// panics the compiler or the renderer: it renders or returns an error.
#[test]
fn arbitrary_templates_render_or_fail_cleanly() {
    use proptest::prelude::*;
    const FRAGMENTS: &[&str] = &[
        "{%",
        "%}",
        "{%-",
        "-%}",
        "{{",
        "}}",
        "{#",
        "#}",
        " ",
        "\n",
        "for m in messages",
        "endfor",
        "if ",
        "else",
        "endif",
        "generation",
        "endgeneration",
        "set x = ",
        "x",
        "m",
        "m.content",
        "m['role']",
        "tools",
        "none",
        "raise_exception('no')",
        "|tojson",
        "|tojson(indent=2)",
        "|map(attribute='role')",
        "|selectattr('role')",
        "|list",
        "|length",
        "|trim",
        "|string",
        "|first",
        ".strip()",
        ".split(',')",
        ".items()",
        "(",
        ")",
        "[",
        "]",
        "1",
        "'a'",
        "~",
        "+",
        " is none",
        " is iterable",
        " and ",
        " not ",
        "loop.index",
        "break",
        "continue",
        "strftime_now('%Y')",
        "namespace(a=1)",
        "range(3)",
        "macro f()",
        "endmacro",
        "f()",
        "{% generation %}",
    ];
    let messages = [ChatMessage::system("s"), ChatMessage::user("u"), ChatMessage::assistant("a")];
    let options = RenderOptions::default().tools(json!([{"type": "function", "function": {"name": "f"}}]));
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 5000,
        failure_persistence: None,
        ..Default::default()
    });
    let source = proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..40).prop_map(|f| f.concat());
    let (compiled, rendered) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(&source, |source| {
            if let Ok(template) = ChatTemplate::new(&source) {
                compiled.set(compiled.get() + 1);
                rendered.set(rendered.get() + usize::from(template.render(&messages, &options).is_ok()));
                let _ = template.render(&[], &RenderOptions::default());
            }
            Ok(())
        })
        .unwrap();
    let (compiled, rendered) = (compiled.get(), rendered.get());
    eprintln!("arbitrary templates: {compiled} of 5000 compiled, {rendered} rendered");
    assert!(compiled > 0 && rendered > 0, "the fragments should make some valid templates");
}
