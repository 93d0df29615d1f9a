//! `llamacpp::chat::Conversation` and the engine's chat requests: the KV
//! cache kept between turns (turn N prefills only what turn N added),
//! thoughts split and held to a budget, tool calls forced, read and
//! answered, and the same reply from a conversation, a fresh context, the
//! engine and the stream form.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use llama_suite::model_cache::model_path;
use llamacpp::chat::{
    ChatEvent, ChatFormat, ChatMessage, ChatOptions, ChatTemplate, Conversation, Reasoning, ReasoningFormat, Tool,
    ToolChoice, Tools,
};
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::generate::{FinishReason, GenerateOptions, Session};
use llamacpp::testing::{TinyModelSpec, tiny_llama_path};
use llamacpp::{AddBos, ContextParams, Model, ModelParams, SamplingParams, Special};
use serde_json::json;

fn tiny() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        Model::load(tiny_llama_path(&TinyModelSpec::default()).unwrap(), &ModelParams::default()).unwrap()
    })
}

fn gemma() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = model_path().unwrap_or_else(|e| panic!("the real model is needed: {e}"));
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A template shipped with llama.cpp, as a chat format.
fn shipped(name: &str) -> ChatFormat {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("vendor/llama.cpp/models/templates/{name}.jinja"));
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ChatFormat::Jinja {
        template: ChatTemplate::new(&source).unwrap(),
        bos_token: String::new(),
        eos_token: String::new(),
    }
}

/// A reply's events: (thoughts, text, calls, the Done event's usage and
/// reason), each kind's texts joined, checking that Done comes last.
type Gathered = (String, String, Vec<llamacpp::chat::ToolCall>, llamacpp::engine::Usage, FinishReason);

fn gather(events: Vec<ChatEvent>) -> Gathered {
    let (mut thoughts, mut text, mut calls, mut done) = (String::new(), String::new(), Vec::new(), None);
    for e in events {
        assert!(done.is_none(), "an event after Done: {e:?}");
        match e {
            ChatEvent::Reasoning(t) => thoughts.push_str(&t),
            ChatEvent::Text(t) => text.push_str(&t),
            ChatEvent::ToolCall(c) => calls.push(c),
            ChatEvent::Done { reason, usage } => done = Some((usage, reason)),
            other => panic!("{other:?}"),
        }
    }
    let (usage, reason) = done.expect("no Done event");
    (thoughts, text, calls, usage, reason)
}

fn common_prefix(a: &[llamacpp::Token], b: &[llamacpp::Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Turn 2 reuses the whole KV cache of turn 1 (its prompt and reply) and
/// prefills only the tokens turn 2 added; its greedy reply is the one a
/// fresh context gives for the whole conversation.
#[test]
fn gemma_second_turn_prefills_only_its_own_tokens_and_answers_as_a_fresh_context() {
    let model = gemma();
    let options = GenerateOptions::default().max_tokens(24);
    let mut chat = Conversation::new(model).unwrap().generate_options(options.clone());
    let first: Vec<ChatEvent> = chat.send("What is the capital of France?").unwrap().map(Result::unwrap).collect();
    let (_, first_text, _, first_usage, _) = gather(first);
    assert!(!first_text.is_empty());
    assert_eq!(first_usage.cached_tokens, 0, "turn 1 starts from an empty cache");
    let after_first = chat.cached_tokens().to_vec();
    assert_eq!(chat.messages().len(), 2, "the reply joined the history");
    assert_eq!(chat.messages()[1].text(), first_text);

    chat.user("And the capital of Italy?");
    let format = model.chat_format(None).unwrap();
    let prompt2 = format.prompt(model, chat.messages(), &ChatOptions::default()).unwrap().tokens;
    let (_, second_text, _, usage, _) = gather(chat.reply().unwrap().map(Result::unwrap).collect());
    let reused = common_prefix(&after_first, &prompt2);
    let prefilled = usage.prompt_tokens - usage.cached_tokens;
    eprintln!(
        "turn 1: {} prompt + {} reply tokens in the cache; turn 2: {} prompt tokens, {} reused, {} prefilled",
        first_usage.prompt_tokens,
        after_first.len() - first_usage.prompt_tokens,
        usage.prompt_tokens,
        usage.cached_tokens,
        prefilled
    );
    assert_eq!(usage.prompt_tokens, prompt2.len());
    // Everything turn 1 left in the cache is turn 2's prefix: its prompt
    // and its reply, re-tokenized from the history, are the same tokens.
    assert_eq!(reused, after_first.len(), "turn 2's prompt starts with all of turn 1's cache");
    assert_eq!(usage.cached_tokens, reused);
    assert_eq!(prefilled, prompt2.len() - after_first.len());
    // What turn 2 added: the end of the reply's turn, the user's turn and
    // the start of the model's: the user's words and a few markup tokens.
    let words = model.vocab().tokenize("And the capital of Italy?", AddBos::No).unwrap().len();
    assert!(prefilled <= words + 12, "{prefilled} prefilled for a {words}-token message");

    let mut fresh = Conversation::new(model).unwrap().generate_options(options);
    for m in &chat.messages()[..3] {
        fresh.push(m.clone());
    }
    let (_, fresh_text, _, fresh_usage, _) = gather(fresh.reply().unwrap().map(Result::unwrap).collect());
    assert_eq!(fresh_usage.cached_tokens, 0);
    assert_eq!(fresh_text, second_text, "the cached turn answers as a fresh context does");
}

/// The budget sampler forces the closing marker after exactly `budget`
/// tokens of thought: the first tokens are those of an unlimited run, then
/// come the tokens of `\n</think>\n\n`. The engine holds a request to it
/// the same way.
#[test]
fn gemma_a_reasoning_budget_closes_the_thoughts_after_that_many_tokens() {
    let model = gemma();
    let vocab = model.vocab();
    let prompt = vocab.tokenize("Let me think step by step about why the sky is blue.", AddBos::Yes).unwrap();
    let run = |sampling: SamplingParams, n: usize| {
        let mut ctx = model.new_context(&ContextParams::default().n_ctx(256)).unwrap();
        let mut sampler = sampling.sampler(model).unwrap();
        let mut session = Session::new();
        let options = GenerateOptions::default().max_tokens(n).stop_at_eog(false).special(Special::Markup);
        let mut generation = session.generate(&mut ctx, &mut sampler, &prompt, &options).unwrap();
        let mut text = String::new();
        for piece in &mut generation {
            text.push_str(&piece.unwrap());
        }
        text
    };
    let budget = 5;
    let thought = run(SamplingParams::default(), budget);
    let close = "\n</think>\n\n";
    let forced = vocab.tokenize_special(close, AddBos::No).unwrap().len();
    let budgeted = SamplingParams::default().reasoning_budget(ReasoningFormat::Think.budget(true, budget).unwrap());
    let text = run(budgeted.clone(), budget + forced + 4);
    assert!(text.starts_with(&format!("{thought}{close}")), "{text:?} after {thought:?}");
    assert_ne!(run(SamplingParams::default(), budget + forced), format!("{thought}{close}"), "the control");

    let engine = Engine::start(Arc::new(Model::load(model_path().unwrap(), &ModelParams::default()).unwrap()), {
        EngineConfig::default().n_ctx(512)
    })
    .unwrap();
    let request =
        Request::tokens(prompt.clone()).max_tokens(budget + forced).stop_at_eog(false).special(Special::Markup);
    let out = engine.submit(request.sampling(budgeted)).unwrap().wait();
    assert!(out.text.ends_with(close), "{:?}", out.text);
}

/// On a template that opens the thoughts in its prompt (QwQ), the reply
/// starts with thoughts; a budget of 3 closes them after 3 tokens and the
/// rest is the answer. Off, the prompt itself holds an empty thought.
#[test]
fn opened_thoughts_are_split_and_budgeted_and_can_be_switched_off() {
    let model = tiny();
    let qwq = shipped("Qwen-QwQ-32B");
    assert_eq!(qwq.reasoning_format(), ReasoningFormat::Think);
    let messages = [ChatMessage::user("hi")];
    let prompt = qwq.prompt(model, &messages, &ChatOptions::default()).unwrap();
    assert!(prompt.thoughts_opened);
    let budget = ChatOptions::default().reasoning(Reasoning::default().budget(3));
    let mut chat = Conversation::new(model)
        .unwrap()
        .format(qwq.clone())
        .options(budget)
        .generate_options(GenerateOptions::default().max_tokens(24));
    let events: Vec<ChatEvent> = chat.send("hi").unwrap().map(Result::unwrap).collect();
    let first_text = events.iter().position(|e| matches!(e, ChatEvent::Text(_)));
    let last_thought = events.iter().rposition(|e| matches!(e, ChatEvent::Reasoning(_)));
    assert!(last_thought.is_some() && first_text.is_some_and(|t| t > last_thought.unwrap()), "{events:?}");
    let (thoughts, text, _, usage, _) = gather(events);
    assert_eq!(usage.completion_tokens, 24);
    let reply = &chat.messages()[1];
    assert_eq!((reply.reasoning_content.as_deref(), reply.text()), (Some(thoughts.as_str()), text.clone()));
    // The three thought tokens are the thoughts (whitespace trimmed).
    let cached = chat.cached_tokens();
    let thought_tokens = &cached[prompt.tokens.len()..prompt.tokens.len() + 3];
    let three = model.vocab().detokenize(thought_tokens, AddBos::No, Special::Plain).unwrap();
    assert_eq!(thoughts, three.trim());

    let off = ChatOptions::default().reasoning(Reasoning::default().enabled(false));
    let prompt = qwq.prompt(model, &messages, &off).unwrap();
    let text = model.vocab().detokenize(&prompt.tokens, AddBos::No, Special::Markup).unwrap();
    assert!(text.ends_with("<think>\n</think>"), "{text:?}");
    assert!(!prompt.thoughts_opened);
}

/// A required call on a model that could never write one by itself: the
/// constraint forces a call to the tool, with arguments its schema
/// accepts; it joins the history with an id, the tool's answer follows,
/// and the next reply's prompt renders both.
#[test]
fn a_required_tool_call_is_made_answered_and_rendered() {
    let model = tiny();
    let add = Tool::new(
        "add",
        "Adds two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"]}),
    );
    let tools = Tools::new([add]).unwrap().choice(ToolChoice::Required).unwrap().parallel(false);
    let qwen3 = shipped("Qwen-Qwen3-0.6B");
    let options = ChatOptions::default().tools(tools);
    let mut chat = Conversation::new(model)
        .unwrap()
        .format(qwen3.clone())
        .options(options.clone())
        .generate_options(GenerateOptions::default().max_tokens(200));
    let (_, _, calls, _, reason) = gather(chat.send("What is 2 + 3?").unwrap().map(Result::unwrap).collect());
    assert_eq!(reason, FinishReason::EndOfGeneration, "the constraint ends the reply after the call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    let id = call.id.as_deref().unwrap_or_default();
    assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id:?}");
    assert_eq!(call.function.name, "add");
    let args = call.function.arguments.as_object().unwrap();
    assert!(args["a"].is_i64() && args["b"].is_i64(), "{args:?}");
    assert_eq!(chat.messages()[1].tool_calls, calls);

    chat.tool_result(call, "5");
    let next = qwen3.prompt(model, chat.messages(), &options).unwrap().tokens;
    let next = model.vocab().detokenize(&next, AddBos::No, Special::Markup).unwrap();
    assert!(next.contains("<tool_response>\n5\n</tool_response>"), "{next}");
    assert!(next.contains("\"name\": \"add\""), "{next}");
}

/// The engine's chat request and the stream form give the conversation's
/// reply exactly (the synthetic model: batched decoding rounds the same).
#[test]
fn the_engine_and_the_stream_answer_as_the_conversation() {
    let model = tiny();
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("hello there")];
    let limits = GenerateOptions::default().max_tokens(16);
    let run = |stream: bool| {
        let mut chat = Conversation::new(model).unwrap().generate_options(limits.clone());
        for m in &messages {
            chat.push(m.clone());
        }
        let turn = chat.reply().unwrap();
        let events: Vec<ChatEvent> = if stream {
            futures::executor::block_on(futures::StreamExt::collect(futures::StreamExt::map(turn, Result::unwrap)))
        } else {
            turn.map(Result::unwrap).collect()
        };
        gather(events)
    };
    let (_, text, _, usage, _) = run(false);
    let (_, streamed, _, _, _) = run(true);
    assert_eq!(streamed, text);
    assert_eq!(usage.completion_tokens, 16);

    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    let shared = Arc::new(Model::load(path, &ModelParams::default()).unwrap());
    let engine = Engine::start(shared.clone(), EngineConfig::default().n_ctx(512)).unwrap();
    let prompt = shared.chat_format(None).unwrap().prompt(&shared, &messages, &ChatOptions::default()).unwrap();
    let blocking: Vec<ChatEvent> = engine.chat(Request::chat(&prompt).max_tokens(16)).unwrap().collect();
    let (_, engine_text, _, engine_usage, _) = gather(blocking);
    assert_eq!(engine_text, text);
    assert_eq!(engine_usage.prompt_tokens, usage.prompt_tokens);
    let stream = engine.chat(Request::chat(&prompt).max_tokens(16)).unwrap();
    let (_, async_text, _, _, _) = gather(futures::executor::block_on(futures::StreamExt::collect(stream)));
    assert_eq!(async_text, text);
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct Country {
    name: String,
    capital: String,
    /// In millions.
    population: u32,
    languages: Vec<String>,
    continent: Continent,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
enum Continent {
    Africa,
    Asia,
    Europe,
    America,
    Oceania,
}

/// A typed answer: generated under the schema schemars derives from the
/// type, read into it; the same turn cut short by `max_tokens` is
/// `Error::JsonCutShort`, not a serde error; the reply joins the history
/// as the document's text.
#[test]
fn gemma_typed_json_answers_round_trip_and_a_cut_short_one_says_so() {
    let model = gemma();
    let mut chat = Conversation::new(model).unwrap().generate_options(GenerateOptions::default().max_tokens(200));
    chat.user("Describe France as JSON.");
    let france: Country = chat.reply_json().unwrap();
    assert!(!france.name.is_empty() && !france.capital.is_empty(), "{france:?}");
    let text = chat.messages().last().unwrap().text();
    let again: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(again["capital"].as_str(), Some(france.capital.as_str()), "{text}");

    let mut short = Conversation::new(model).unwrap().generate_options(GenerateOptions::default().max_tokens(4));
    short.user("Describe France as JSON.");
    match short.reply_json::<Country>() {
        Err(llamacpp::Error::JsonCutShort { tokens: 4, reason: FinishReason::Length }) => {}
        other => panic!("{other:?}"),
    }
    let done: Result<Country, _> = model.chat_json(
        &[ChatMessage::user("Describe Spain as JSON.")],
        &llamacpp::CompleteOptions::default().max_tokens(4),
    );
    assert!(matches!(done, Err(llamacpp::Error::JsonCutShort { .. })), "{done:?}");
}
