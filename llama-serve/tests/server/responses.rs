//! OpenAI's Responses API (`/v1/responses`): the output items, and the
//! stream's events in order with their sequence numbers, output indices
//! and final usage, equal to the whole answer; thoughts as a `reasoning`
//! item on a template that thinks (`effort: minimal`, 128 tokens of
//! thought, inside 160).

use super::*;

#[test]
fn reasoning_and_message_items_and_the_stream_events_in_order() {
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../vendor/llama.cpp/models/templates/Qwen-QwQ-32B.jinja");
    let server = Server::start(&["--chat-template-file", template]);
    let body = |stream: bool| {
        json!({"input": "Why is the sky blue?", "max_output_tokens": 160, "temperature": 0,
               "reasoning": {"effort": "minimal"}, "stream": stream})
    };
    let (status, whole) = server.post("/v1/responses", &body(false));
    assert_eq!(status, 200, "{whole}");
    assert_eq!((whole["object"].as_str(), whole["status"].as_str()), (Some("response"), Some("incomplete")), "{whole}");
    assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens", "{whole}");
    let output = whole["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message"], "{whole}");
    let thoughts = output[0]["content"][0]["text"].as_str().unwrap();
    let text = output[1]["content"][0]["text"].as_str().unwrap();
    assert!(!thoughts.is_empty() && !thoughts.contains("think>") && !text.contains("</think>"), "{whole}");
    assert_eq!(whole["usage"]["output_tokens"], 160, "{whole}");

    let events: Vec<Value> =
        server.stream("/v1/responses", &body(true)).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let names: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"].as_u64(), Some(i as u64), "numbered in order: {names:?}");
    }
    assert_eq!(&names[..2], ["response.created", "response.in_progress"], "{names:?}");
    assert_eq!(names.last(), Some(&"response.incomplete"), "{names:?}");
    // Each item: added, its part added, deltas, text done, part done, item done.
    let mut items: Vec<(String, String)> = Vec::new();
    let mut open: Option<u64> = None;
    for e in &events[2..events.len() - 1] {
        let index = e["output_index"].as_u64().unwrap();
        match e["type"].as_str().unwrap() {
            "response.output_item.added" => {
                assert_eq!((open, index), (None, items.len() as u64), "items open in order");
                open = Some(index);
                items.push((e["item"]["type"].as_str().unwrap().to_owned(), String::new()));
            }
            "response.content_part.added" | "response.content_part.done" => assert_eq!(open, Some(index)),
            "response.reasoning_text.delta" | "response.output_text.delta" => {
                assert_eq!(open, Some(index));
                items.last_mut().unwrap().1.push_str(e["delta"].as_str().unwrap());
            }
            "response.reasoning_text.done" | "response.output_text.done" => {
                assert_eq!(e["text"].as_str(), Some(items.last().unwrap().1.as_str()), "done carries the whole text");
            }
            "response.output_item.done" => assert_eq!(open.take(), Some(index)),
            other => panic!("{other}"),
        }
    }
    assert_eq!(open, None, "every item done");
    let streamed: Vec<(&str, &str)> = items.iter().map(|(k, t)| (k.as_str(), t.as_str())).collect();
    assert_eq!(streamed, [("reasoning", thoughts), ("message", text)], "the stream adds up to the whole answer");
    let last = &events[events.len() - 1]["response"];
    assert_eq!(last["usage"]["output_tokens"], 160, "{last}");
    assert_eq!(last["usage"]["input_tokens"], whole["usage"]["input_tokens"], "{last}");
    assert_eq!(last["output"].as_array().map(Vec::len), Some(2), "{last}");

    let (status, count) = server.post("/v1/responses/input_tokens", &body(false));
    assert_eq!((status, &count["input_tokens"]), (200, &whole["usage"]["input_tokens"]), "{count}");
}
