//! Every endpoint, streamed and not, every error status, keys and rate
//! limits, a full queue and loading, cancellation on disconnect, graceful
//! shutdown, and greedy outputs equal to the engine's.

use super::*;

#[test]
fn every_endpoint_answers_as_openai_does() {
    let server = Server::start(&["--embeddings"]);
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "gemma-3-270m-q4_k_m");

    // Completions: plain, streamed (the same greedy text), token ids, echo.
    let body = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let (status, plain) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["object"], "text_completion");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    assert_eq!(plain["choices"][0]["finish_reason"], "length");
    assert_eq!(plain["usage"]["completion_tokens"], 12);
    assert_eq!(plain["usage"]["total_tokens"], plain["usage"]["prompt_tokens"].as_u64().unwrap() + 12);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", &streamed);
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let parsed: Vec<Value> = chunks[..chunks.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
    let joined: String = parsed.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(joined, text, "streamed and plain greedy completions agree");
    assert_eq!(parsed.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert!(parsed.iter().all(|c| c["id"] == parsed[0]["id"]));

    let model = Model::load(model_path(), &ModelParams::default().vocab_only(true)).unwrap();
    let ids: Vec<i32> =
        model.vocab().tokenize("The capital of France is", AddBos::Yes).unwrap().iter().map(|t| t.0).collect();
    let body = json!({"prompt": ids, "max_tokens": 4, "temperature": 0, "echo": true, "logprobs": 2});
    let (status, by_ids) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{by_ids}");
    let choice = &by_ids["choices"][0];
    // Echo: the prompt's text, then the 4 generated tokens, which are the
    // logprobs' tokens joined and the start of the greedy text above.
    let echoed = choice["text"].as_str().unwrap();
    let continuation = echoed.strip_prefix("The capital of France is").unwrap_or_else(|| panic!("no echo: {choice}"));
    assert!(!continuation.is_empty(), "echo without a continuation: {choice}");
    let logprob_tokens: Vec<&str> =
        choice["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(logprob_tokens.len(), 4);
    assert_eq!(continuation, logprob_tokens.concat(), "the continuation is the generated tokens: {choice}");
    assert!(text.starts_with(continuation), "greedy from the same tokens: {choice}");
    assert_eq!(choice["logprobs"]["top_logprobs"][0].as_object().unwrap().len(), 2);

    // Chat: plain and streamed with usage; n = 2; log-probabilities.
    let chat = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 10, "temperature": 0});
    let (status, reply) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/chat/completions", &streamed);
    let parsed: Vec<Value> = chunks[..chunks.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
    assert_eq!(parsed[0]["choices"][0]["delta"]["role"], "assistant");
    let joined: String = parsed.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str()).collect();
    assert_eq!(joined, content);
    let usage = parsed.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], reply["usage"]["completion_tokens"]);
    // The same prompt again: its tokens come from the prefix cache.
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{usage}");

    let mut two = chat.clone();
    two["n"] = json!(2);
    two["temperature"] = json!(1.0);
    two["seed"] = json!(7);
    two["logprobs"] = json!(true);
    two["top_logprobs"] = json!(3);
    let (status, both) = server.post("/v1/chat/completions", &two);
    assert_eq!(status, 200, "{both}");
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!((choices[0]["index"].as_u64(), choices[1]["index"].as_u64()), (Some(0), Some(1)));
    let total: u64 = both["usage"]["completion_tokens"].as_u64().unwrap();
    let mut counted = 0;
    for c in choices {
        let entries = c["logprobs"]["content"].as_array().unwrap();
        counted += entries.len() as u64;
        for e in entries {
            assert!(e["logprob"].as_f64().unwrap() <= 0.0);
            assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 3);
        }
    }
    assert_eq!(counted, total, "one logprob entry per generated token");
    assert_eq!(both["usage"]["prompt_tokens"], reply["usage"]["prompt_tokens"], "the prompt counted once");

    // response_format json_schema: the answer validates.
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false});
    let json_chat = json!({"messages": [{"role": "user", "content": "Describe a person as JSON."}], "max_tokens": 80,
        "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}});
    let (status, reply) = server.post("/v1/chat/completions", &json_chat);
    assert_eq!(status, 200, "{reply}");
    let doc: Value = serde_json::from_str(reply["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(jsonschema::is_valid(&schema, &doc), "{doc}");

    // Embeddings: float and base64 are the same vectors, in order.
    let (status, floats) = server.post("/v1/embeddings", &json!({"input": ["a cat", "a dog", "a cat"]}));
    assert_eq!(status, 200, "{floats}");
    let vectors: Vec<Vec<f64>> = floats["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();
    assert_eq!(vectors.len(), 3);
    assert_eq!(vectors[0], vectors[2]);
    assert_ne!(vectors[0], vectors[1]);
    let norm: f64 = vectors[0].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "normalised: {norm}");
    let (_, b64) = server.post("/v1/embeddings", &json!({"input": "a dog", "encoding_format": "base64"}));
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let decoded: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    // JSON carries each f32 as its shortest decimal: the same f32 back.
    assert_eq!(decoded, vectors[1].iter().map(|&x| x as f32).collect::<Vec<_>>());
    // At most 2048 texts per request, as OpenAI allows; refused before any
    // is embedded.
    let (s, b) = server.post("/v1/embeddings", &json!({"input": vec!["x"; 2049]}));
    assert_error(s, &b, 400);
    assert_eq!(b["error"]["param"], "input");

    let metrics = server.metrics();
    for name in [
        "llama_engine_ttft_seconds",
        "llama_engine_kv_cells_total",
        "llama_engine_completion_tokens_total",
        "llama_server_requests_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[test]
fn greedy_outputs_equal_the_engines() {
    let prompts = ["The capital of France is", "Water boils at", "def fibonacci(n):"];
    let server = Server::start(&[]);
    let served: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, r) = server.post("/v1/completions", &json!({"prompt": p, "max_tokens": 24, "temperature": 0}));
            assert_eq!(status, 200, "{r}");
            r["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    drop(server);
    let model = Arc::new(Model::load(model_path(), &ModelParams::default()).unwrap());
    let engine = Engine::start(model, EngineConfig::default().n_ctx(4096).max_running(4).n_threads(THREADS)).unwrap();
    for (p, served) in prompts.iter().zip(&served) {
        let out = engine.submit(Request::text(*p).max_tokens(24)).unwrap().wait();
        assert_eq!(&out.text, served, "prompt {p:?}");
    }
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let server = Server::start(&["--body-limit", "4000", "--ctx", "512", "--parallel", "1"]);
    let raw = |body: &str| read(server.post_with("/v1/completions", body.to_owned(), None));
    let (s, b) = raw("{not json");
    assert_error(s, &b, 400);
    let (s, b) = raw(r#"{"prompt": "x", "temperature": "hot"}"#);
    assert_error(s, &b, 400);
    let (s, b) = raw(r#"{"max_tokens": 3}"#);
    assert_error(s, &b, 400);
    let (s, b) = raw(&json!({"prompt": "x ".repeat(2500)}).to_string());
    assert_error(s, &b, 413);

    // JSON only: a web page's "simple" cross-site request (text/plain, a
    // form: no CORS preflight) is refused before it runs anything; a
    // charset parameter is fine.
    let typed = |content_type: &str| {
        let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
        read(
            server
                .agent
                .post(format!("{}/v1/completions", server.base))
                .header("Content-Type", content_type)
                .send(body)
                .unwrap(),
        )
    };
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "text/plain; charset=application/json"] {
        let (s, b) = typed(content_type);
        assert_error(s, &b, 415);
        assert_eq!(b["error"]["code"], "unsupported_media_type", "{content_type}");
    }
    assert_eq!(typed("application/json; charset=utf-8").0, 200);

    // A body announced over the limit is answered from its Content-Length
    // at once, not waited for.
    let addr = server.base.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Content-Length: 1000000000\r\n\r\n{\"prompt\"",
        )
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).expect("an answer before the announced body");
    assert_eq!(&head, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&head));
    let (s, b) = server.post("/v1/completions", &json!({"prompt": "word ".repeat(600)}));
    assert_error(s, &b, 400);
    assert!(b["error"]["message"].as_str().unwrap().contains("tokens"), "{b}");
    let (s, b) = server.post("/v1/completions", &json!({"prompt": "x", "n": 0}));
    assert_error(s, &b, 400);
    assert_eq!(b["error"]["param"], "n");
    let (s, b) = server.post("/v1/completions", &json!({"prompt": "x", "logit_bias": {"abc": 1}}));
    assert_error(s, &b, 400);
    let (s, b) = server.post("/v1/completions", &json!({"prompt": [1, 99_999_999]}));
    assert_error(s, &b, 400);
    let (s, b) = server.post("/v1/chat/completions", &json!({"messages": [{"content": "no role"}]}));
    assert_error(s, &b, 400);
    // Roles are OpenAI's, and content fits the role: nothing else reaches
    // the template (which renders whatever it is given).
    for message in [
        json!({"role": "wizard", "content": "x"}),
        json!({"role": "", "content": "x"}),
        json!({"role": "user<|im_end|>", "content": "x"}),
        json!({"role": "user", "content": null}),
        json!({"role": "user"}),
        json!({"role": "system", "content": 42}),
        json!({"role": "assistant", "content": null}),
    ] {
        let (s, b) = server.post("/v1/chat/completions", &json!({"messages": [message], "max_tokens": 1}));
        assert_error(s, &b, 400);
        assert_eq!(b["error"]["param"], "messages", "{message}");
    }
    let call = json!({"role": "assistant", "content": null,
                      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    let messages = json!([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}, call,
                          {"role": "tool", "tool_call_id": "c1", "content": "{}"}]);
    let (s, b) = server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 1}));
    assert_eq!(s, 200, "every role, and an assistant's tool call without content: {b}");
    let unsupported = json!({"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "hostname-ish", "not": {}}}});
    let (s, b) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "response_format": unsupported}),
    );
    assert_error(s, &b, 400);
    assert_eq!(b["error"]["param"], "response_format");
    let (s, b) = server.post("/v1/nope", &json!({}));
    assert_error(s, &b, 404);
    let (s, b) = server.post("/v1/embeddings", &json!({"input": "x"}));
    assert_error(s, &b, 404);
    // The server still serves.
    let (s, _) = server.post("/v1/completions", &json!({"prompt": "ok", "max_tokens": 2}));
    assert_eq!(s, 200);
}

#[test]
fn api_keys_and_rate_limits_refuse_with_401_and_429() {
    // One request per 100 s (a burst of one): however slowly this thread
    // sends them, only the first of six passes.
    let server = Server::start(&["--api-key", "sesame", "--rate-limit", "0.01"]);
    assert_eq!(server.get("/health").0, 200, "/health needs no key");
    let models = |key: Option<&str>| {
        let mut req = server.agent.get(format!("{}/v1/models", server.base));
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let resp = req.call().unwrap();
        let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let (s, b) = read(resp);
        (s, b, retry)
    };
    let (s, b, _) = models(None);
    assert_error(s, &b, 401);
    let (s, b, _) = models(Some("sesame!"));
    assert_error(s, &b, 401);
    let statuses: Vec<(u16, Option<String>)> = (0..6)
        .map(|_| {
            let (s, _, retry) = models(Some("sesame"));
            (s, retry)
        })
        .collect();
    assert_eq!(statuses[0].0, 200, "{statuses:?}");
    assert!(statuses[1..].iter().all(|(s, _)| *s == 429), "the bucket is empty after one: {statuses:?}");
    assert!(statuses[1..].iter().all(|(_, retry)| retry.as_deref().is_some_and(|r| r.parse::<u64>().unwrap() >= 1)));
}

#[test]
fn a_full_queue_answers_429_and_loading_answers_503() {
    // A model that takes ten minutes to load is still loading whenever
    // this thread asks.
    let loading = Server::spawn(&["--load-delay-ms", "600000"]);
    let (s, b) = loading.get("/health");
    assert_error(s, &b, 503);
    let resp = loading.post_with("/v1/completions", json!({"prompt": "x"}).to_string(), None);
    assert!(resp.headers().get("retry-after").is_some());
    let (s, b) = read(resp);
    assert_error(s, &b, 503);
    drop(loading);
    let server = Server::start(&["--parallel", "1", "--max-queue", "1"]);
    // One running, one waiting: the next ones are refused at once. Neither
    // ends early (no end-of-generation stop, 3,000 tokens).
    let long = json!({"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "ignore_eos": true,
                      "stream": true});
    // The second is sent once the first runs, so it waits rather than
    // racing the first for the one queue place.
    let first = server.post_with("/v1/completions", long.to_string(), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&server.metrics(), "llama_engine_running", "") != Some(1.0) {
        assert!(Instant::now() < deadline, "the first stream never started running");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = server.post_with("/v1/completions", long.to_string(), None);
    let streams = [first, second];
    assert!(streams.iter().all(|r| r.status() == 200), "{:?}", streams.iter().map(|r| r.status()).collect::<Vec<_>>());
    let resp = server.post_with("/v1/completions", long.to_string(), None);
    assert_eq!(resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned()).as_deref(), Some("1"));
    let (s, b) = read(resp);
    assert_error(s, &b, 429);
    assert_eq!(b["error"]["code"], "queue_full");
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let server = Server::start(&[]);
    let body = json!({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 3000, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let resp = server.post_with("/v1/chat/completions", body.to_string(), None);
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut line = String::new();
    let mut data_lines = 0;
    while data_lines < 4 {
        line.clear();
        reader.read_line(&mut line).unwrap();
        data_lines += usize::from(line.starts_with("data: "));
    }
    assert_eq!(metric(&server.metrics(), "llama_engine_running", ""), Some(1.0));
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = server.metrics();
        if metric(&m, "llama_engine_running", "") == Some(0.0)
            && metric(&m, "llama_engine_requests_total", "reason=\"cancelled\"") == Some(1.0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the request was not cancelled:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let tokens = metric(&server.metrics(), "llama_engine_completion_tokens_total", "").unwrap();
    assert!(tokens < 3000.0, "it stopped early: {tokens} tokens");
}

#[test]
fn sigterm_lets_requests_in_flight_finish_then_exits_0() {
    // A grace period longer than the request takes on a loaded machine.
    let mut server = Server::start(&["--shutdown-grace", "600"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": true});
    let resp = server.post_with("/v1/completions", body.to_string(), None);
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        reader.read_line(&mut first).unwrap();
    }
    let status = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(status.success());
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"finish_reason\":\"length\""), "the request finished: {rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code.code(), Some(0));
}

#[test]
fn speculative_decoding_by_flag_and_per_request_reports_its_drafts_in_usage() {
    // A copy task: the model repeats the passage, the drafts come from it.
    let prompt = include_str!("../../../benches/prompts/copy.txt");
    let passage = prompt.split("Passage:\n").nth(1).unwrap().split("\n\nCopy:").next().unwrap();
    let server = Server::start(&["--spec"]);
    let ask = |speculative: Option<bool>| {
        let mut body = json!({"prompt": prompt, "max_tokens": 48, "temperature": 0});
        if let Some(on) = speculative {
            body["speculative"] = json!(on);
        }
        let (status, r) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{r}");
        let text = r["choices"][0]["text"].as_str().unwrap().to_owned();
        // The 48 tokens copy the passage on, with or without drafts.
        assert!(passage.contains(text.trim_end()), "{text:?}");
        let details = &r["usage"]["completion_tokens_details"];
        (
            details["accepted_prediction_tokens"].as_u64().unwrap(),
            details["rejected_prediction_tokens"].as_u64().unwrap(),
        )
    };
    let (accepted, _) = ask(None);
    assert!(accepted >= 24, "{accepted} of 48 tokens from drafts with --spec");
    assert_eq!(ask(Some(false)), (0, 0));
    let metrics = server.metrics();
    let accepted_total = metric(&metrics, "llama_engine_draft_tokens_accepted_total", "").unwrap();
    assert_eq!(accepted_total, accepted as f64);
    drop(server);
    let server = Server::start(&[]);
    let (status, r) = server
        .post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 48, "temperature": 0, "speculative": true}));
    assert_eq!(status, 200, "{r}");
    assert!(r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].as_u64().unwrap() >= 24, "{r}");
}
