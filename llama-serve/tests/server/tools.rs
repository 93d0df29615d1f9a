//! Tool calls forced on the default model.

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
