//! Tool calls forced on the default model, and thoughts split from the answer.

use super::*;

/// `tool_choice` that requires a call forces one through a grammar built
/// from the tools' parameter schemas: the default model (a base model with
/// no template, so the server's generic `<tool_call>` syntax) answers with
/// calls whose arguments validate, whole and streamed (OpenAI's deltas:
/// id and name first, then the arguments), `finish_reason: "tool_calls"`.
#[test]
fn forced_tool_calls_name_a_tool_and_validate_against_its_schema() {
    let server = Server::start(&[]);
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false});
    let add = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
        {"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": add}},
    ]);
    let schema_of = |name: &str| if name == "get_weather" { &weather } else { &add };
    let ask = |choice: Value, stream: bool| {
        json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": tools,
               "tool_choice": choice, "parallel_tool_calls": false, "max_tokens": 96, "temperature": 0,
               "stream": stream})
    };

    for choice in [json!("required"), json!({"type": "function", "function": {"name": "add"}})] {
        let (status, reply) = server.post("/v1/chat/completions", &ask(choice.clone(), false));
        assert_eq!(status, 200, "{reply}");
        let c = &reply["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{reply}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "parallel_tool_calls false: {reply}");
        let name = calls[0]["function"]["name"].as_str().unwrap();
        if choice != "required" {
            assert_eq!(name, "add");
        }
        assert_eq!(calls[0]["type"], "function");
        let id = calls[0]["id"].as_str().unwrap();
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(jsonschema::is_valid(schema_of(name), &args), "{name}({args})");

        // Streamed: the same call, assembled from deltas as the SDKs do.
        let chunks = server.stream("/v1/chat/completions", &ask(choice, true));
        let (mut id, mut name, mut arguments, mut finish) = (None, None, String::new(), None);
        for data in chunks.iter().filter(|d| *d != "[DONE]") {
            let chunk: Value = serde_json::from_str(data).unwrap();
            let choice = &chunk["choices"][0];
            for d in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(d["index"], 0);
                if let Some(i) = d["id"].as_str() {
                    assert!(id.replace(i.to_owned()).is_none(), "one id per call");
                    name = Some(d["function"]["name"].as_str().unwrap().to_owned());
                } else {
                    assert!(id.is_some(), "the id and name come first");
                }
                arguments.push_str(d["function"]["arguments"].as_str().unwrap());
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{chunks:?}");
        assert_eq!(name.as_deref(), Some(calls[0]["function"]["name"].as_str().unwrap()), "{chunks:?}");
        assert_eq!(arguments, calls[0]["function"]["arguments"].as_str().unwrap(), "greedy: the same call");
    }

    // With parallel calls allowed, a base model forced to call keeps
    // calling until max_tokens: every complete call validates.
    let mut parallel = ask(json!("required"), false);
    parallel["parallel_tool_calls"] = json!(true);
    let (status, reply) = server.post("/v1/chat/completions", &parallel);
    assert_eq!(status, 200, "{reply}");
    let calls = reply["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{reply}");
    for call in calls {
        let name = call["function"]["name"].as_str().unwrap();
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(jsonschema::is_valid(schema_of(name), &args), "{name}({args})");
    }

    // tool_choice none: no call is read, the answer is text.
    let (status, reply) = server.post("/v1/chat/completions", &ask(json!("none"), false));
    assert_eq!(status, 200, "{reply}");
    assert!(reply["choices"][0]["message"].get("tool_calls").is_none(), "{reply}");
    assert!(reply["choices"][0]["message"]["content"].is_string(), "{reply}");

    // A forced call and response_format cannot both hold.
    let mut both = ask(json!("required"), false);
    both["response_format"] = json!({"type": "json_object"});
    let (s, b) = server.post("/v1/chat/completions", &both);
    assert_error(s, &b, 400);
    assert_eq!(b["error"]["param"], "tool_choice");
}

/// With a template that opens the model's thoughts in its prompt (QwQ's,
/// through `--chat-template-file`), the thoughts come back in
/// `reasoning_content` and the answer in `content`, whole and streamed
/// alike; `reasoning_budget` closes them after that many tokens;
/// `reasoning_format: "none"` leaves them in the text.
#[test]
fn thoughts_come_apart_from_the_answer_and_keep_to_their_budget() {
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../vendor/llama.cpp/models/templates/Qwen-QwQ-32B.jinja");
    let server = Server::start(&["--chat-template-file", template]);
    let ask = |extra: Value, stream: bool| {
        let mut body = json!({"messages": [{"role": "user", "content": "Why is the sky blue?"}],
                              "max_tokens": 24, "temperature": 0, "stream": stream});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let (status, reply) = server.post("/v1/chat/completions", &ask(json!({"reasoning_budget": 4}), false));
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    let thoughts = message["reasoning_content"].as_str().unwrap_or_else(|| panic!("{reply}"));
    let content = message["content"].as_str().unwrap();
    assert!(!thoughts.is_empty() && !thoughts.contains("think>"), "{reply}");
    assert!(!content.contains("</think>"), "{reply}");

    let chunks = server.stream("/v1/chat/completions", &ask(json!({"reasoning_budget": 4}), true));
    let (mut streamed_thoughts, mut streamed_content) = (String::new(), String::new());
    for data in chunks.iter().filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        streamed_thoughts.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        streamed_content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    assert_eq!((streamed_thoughts.as_str(), streamed_content.as_str()), (thoughts, content));

    let (status, reply) =
        server.post("/v1/chat/completions", &ask(json!({"reasoning_budget": 4, "reasoning_format": "none"}), false));
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{reply}");
    assert!(message["content"].as_str().unwrap().contains("</think>"), "{reply}");

    let (status, reply) = server.post("/v1/chat/completions", &ask(json!({"reasoning_budget": -2}), false));
    assert_eq!((status, reply["error"]["param"].as_str()), (400, Some("reasoning_budget")), "{reply}");
}
