//! Anthropic's Messages API (`/v1/messages`): the answer's blocks, and
//! the stream's events in order with their indices and final usage, equal
//! to the whole answer; thoughts as `thinking` blocks on a template that
//! thinks.

use super::*;

/// The streamed events' payloads (`data:` lines; Anthropic's stream has
/// no `[DONE]`).
fn events(server: &Server, body: &Value) -> Vec<Value> {
    server.stream("/v1/messages", body).iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

#[test]
fn thinking_text_and_the_stream_events_in_order() {
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../vendor/llama.cpp/models/templates/Qwen-QwQ-32B.jinja");
    let server = Server::start(&["--chat-template-file", template]);
    let body = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 24,
               "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 4}, "stream": stream})
    };
    let (status, whole) = server.post("/v1/messages", &body(false));
    assert_eq!(status, 200, "{whole}");
    assert_eq!((whole["type"].as_str(), whole["role"].as_str()), (Some("message"), Some("assistant")), "{whole}");
    let content = whole["content"].as_array().unwrap();
    let kinds: Vec<&str> = content.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["thinking", "text"], "{whole}");
    let thinking = content[0]["thinking"].as_str().unwrap();
    let text = content[1]["text"].as_str().unwrap();
    assert!(!thinking.is_empty() && !thinking.contains("think>") && !text.contains("</think>"), "{whole}");
    assert_eq!(whole["stop_reason"], "max_tokens", "{whole}");
    assert_eq!(whole["usage"]["output_tokens"], 24, "{whole}");
    let input_tokens = whole["usage"]["input_tokens"].as_u64().unwrap();

    let events = events(&server, &body(true));
    let names: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    // message_start, then each block's start, deltas and stop, then the
    // message's delta and stop.
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut open: Option<u64> = None;
    for e in &events[1..events.len() - 2] {
        let index = e["index"].as_u64().unwrap();
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!((open, index), (None, blocks.len() as u64), "blocks open in order, one at a time");
                open = Some(index);
                blocks.push((e["content_block"]["type"].as_str().unwrap().to_owned(), String::new()));
            }
            "content_block_delta" => {
                assert_eq!(open, Some(index), "a delta of the open block");
                let delta = &e["delta"];
                let piece = match delta["type"].as_str().unwrap() {
                    "thinking_delta" => delta["thinking"].as_str(),
                    "text_delta" => delta["text"].as_str(),
                    other => panic!("{other}"),
                };
                blocks.last_mut().unwrap().1.push_str(piece.unwrap());
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(index));
            }
            other => panic!("{other} between the message's start and end"),
        }
    }
    assert_eq!(open, None, "every block stopped");
    let streamed: Vec<(&str, &str)> = blocks.iter().map(|(k, t)| (k.as_str(), t.as_str())).collect();
    assert_eq!(streamed, [("thinking", thinking), ("text", text)], "the stream adds up to the whole answer");
    assert_eq!(events[0]["message"]["usage"]["input_tokens"].as_u64(), Some(input_tokens));
    let delta = &events[events.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens", "{delta}");
    assert_eq!(delta["usage"]["output_tokens"], 24, "{delta}");

    let (status, count) = server.post("/v1/messages/count_tokens", &body(false));
    assert_eq!((status, count["input_tokens"].as_u64()), (200, Some(input_tokens)), "{count}");
}

#[test]
fn messages_errors_have_anthropics_shape() {
    let server = Server::start(&[]);
    let ask = json!([{"role": "user", "content": "Hi"}]);
    for (body, says) in [
        (json!({"messages": ask}), "max_tokens: field required"),
        (json!({"messages": ask, "max_tokens": 0}), "at least 1"),
        (json!({"messages": [], "max_tokens": 8}), "at least one message"),
        (json!({"messages": ask, "max_tokens": 8, "tool_choice": {"type": "every"}}), "tool_choice"),
    ] {
        let (status, reply) = server.post("/v1/messages", &body);
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
        assert!(reply["error"]["message"].as_str().unwrap().contains(says), "{reply}");
    }
}
