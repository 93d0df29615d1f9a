//! The endpoints driven in-process through `App::router` (no socket, no
//! process), on the tiny synthetic model: what a handler answers for a
//! request, including what the HTTP tests cannot reach as easily.

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use clap::Parser;
use llama_serve::{App, Args};
use llamacpp::testing::{TinyModelSpec, tiny_llama_path};
use serde_json::{Value, json};
use tower::ServiceExt;

fn app() -> &'static App {
    static APP: OnceLock<App> = OnceLock::new();
    APP.get_or_init(|| {
        let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
        let args = Args::try_parse_from([
            "llama-serve".as_ref(),
            "--model".as_ref(),
            path.as_os_str(),
            "--ctx".as_ref(),
            "1024".as_ref(),
            "--threads".as_ref(),
            "2".as_ref(),
            "--parallel".as_ref(),
            "2".as_ref(),
            "--embeddings".as_ref(),
        ])
        .unwrap();
        App::load(&args).unwrap()
    })
}

/// The status and JSON body of `method path` with `body` (JSON when given).
fn call(method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).unwrap();
    runtime().block_on(async {
        let response = app().router().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes))))
    })
}

/// The handlers run request preparation on tokio's blocking pool.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

#[test]
fn health_models_and_unknown_paths() {
    let (s, b) = call("GET", "/health", None);
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call("GET", "/v1/models", None);
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["object"], "list");
    assert_eq!(b["data"][0]["object"], "model");
    let (s, b) = call("GET", "/v1/nope", None);
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(b["error"]["code"], "not_found");
    let (s, _) = call("GET", "/v1/completions", None);
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn a_completion_counts_its_tokens_and_ends_by_length() {
    let body = json!({"prompt": [1, 300, 301, 302], "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (s, b) = call("POST", "/v1/completions", Some(body.clone()));
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["object"], "text_completion");
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    assert_eq!(b["usage"]["prompt_tokens"], 4);
    assert_eq!(b["usage"]["completion_tokens"], 5);
    // Greedy: the same text again.
    let (_, again) = call("POST", "/v1/completions", Some(body));
    assert_eq!(again["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn bad_requests_are_openai_errors() {
    for (body, param) in [
        (json!({"prompt": "x", "n": 0}), "n"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [1, 99_999_999]}), "prompt"),
    ] {
        let (s, b) = call("POST", "/v1/completions", Some(body.clone()));
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {b}");
        assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
        assert_eq!(b["error"]["param"], param, "{body}: {b}");
    }
    let (s, b) = call("POST", "/v1/chat/completions", Some(json!({"messages": [{"role": "wizard", "content": "x"}]})));
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(b["error"]["param"], "messages");
    let schema =
        json!({"type": "json_schema", "json_schema": {"schema": {"oneOf": [{"type": "string"}, {"type": "string"}]}}});
    let (s, b) = call(
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": [{"role": "user", "content": "x"}], "response_format": schema})),
    );
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(b["error"]["param"], "response_format");
}

#[test]
fn embeddings_are_unit_vectors_in_input_order() {
    let (s, b) = call("POST", "/v1/embeddings", Some(json!({"input": ["one", "two", "one"]})));
    assert_eq!(s, StatusCode::OK, "{b}");
    let vectors: Vec<Vec<f64>> = b["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
        })
        .collect();
    assert_eq!(vectors.len(), 3);
    for v in &vectors {
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    assert_eq!(vectors[0], vectors[2], "the same text, the same vector");
    assert_ne!(vectors[0], vectors[1]);
    let too_many: Vec<String> = (0..2049).map(|i| i.to_string()).collect();
    let (s, b) = call("POST", "/v1/embeddings", Some(json!({"input": too_many})));
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(b["error"]["param"], "input");
}

/// The `data:` payloads of a streamed response, parsed (`[DONE]` kept as
/// a string).
fn stream(path: &str, body: Value) -> Vec<Value> {
    let (s, text) = call("POST", path, Some(body));
    assert_eq!(s, StatusCode::OK, "{text}");
    let text = text.as_str().expect("an event stream is not JSON").to_owned();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| json!(d)))
        .collect()
}

#[test]
fn streamed_chat_chunks_have_openai_s_shape() {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
                      "ignore_eos": true, "n": 2, "stream": true, "stream_options": {"include_usage": true}});
    let events = stream("/v1/chat/completions", body);
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let chunks = &events[..events.len() - 1];
    for c in chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert!(c.get("usage").is_some(), "include_usage puts usage (null until the last) in every chunk: {c}");
    }
    // Each choice opens with the role, then 4 pieces, then `{}` with its
    // finish reason; the usage chunk comes last, without choices.
    for index in 0..2 {
        let mine: Vec<&Value> = chunks.iter().filter(|c| c["choices"][0]["index"] == index).collect();
        assert_eq!(mine[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(mine.len(), 1 + 4 + 1, "{mine:?}");
        let last = &mine[5]["choices"][0];
        assert_eq!(last["delta"], json!({}));
        assert_eq!(last["finish_reason"], "length");
        assert!(mine[1..5].iter().all(|c| c["choices"][0]["delta"]["content"].is_string() && c["usage"].is_null()));
    }
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    assert_eq!(usage["usage"]["total_tokens"], usage["usage"]["prompt_tokens"].as_u64().unwrap() + 8);
}

#[test]
fn streamed_text_completion_echoes_then_continues() {
    let body = json!({"prompt": [1, 300, 301], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "echo": true,
                      "logprobs": 2, "stream": true});
    let events = stream("/v1/completions", body);
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let chunks = &events[..events.len() - 1];
    assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c.get("usage").is_none()));
    let echo = &chunks[0]["choices"][0];
    assert!(echo["text"].as_str().is_some_and(|t| !t.is_empty()), "the echo comes first: {echo}");
    assert!(echo["logprobs"].is_null());
    let pieces = &chunks[1..4];
    for p in pieces {
        let lp = &p["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(1), "{p}");
        assert_eq!(lp["top_logprobs"][0].as_object().map(serde_json::Map::len), Some(2), "{p}");
    }
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    // The whole response says the same.
    let body = json!({"prompt": [1, 300, 301], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "echo": true});
    let (_, whole) = call("POST", "/v1/completions", Some(body));
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(whole["choices"][0]["text"].as_str(), Some(streamed.as_str()));
}
