//! Images in requests (`--mmproj`, feature `mtmd`), with the tiny
//! synthetic projector sized for the default model: a base64 image in a
//! Chat Completions `image_url` part, a Responses `input_image` and a
//! Messages `image` block are served end to end, as the engine answers
//! the same conversation with the same image; remote URLs, undecodable
//! images, too many images and servers without a projector are 400s in
//! OpenAI's error shape.

use llamacpp::chat::ChatOptions;
use llamacpp::mtmd::ProjectorParams;
use llamacpp::testing::{ProjectorSpec, tiny_projector_path};

use super::*;

fn test_jpeg() -> Vec<u8> {
    let path = std::path::Path::new(llamacpp::sys::SOURCE_DIR).join("tools/mtmd/test-1.jpeg");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/jpeg;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn messages(url: Option<&str>) -> Value {
    let mut parts = vec![json!({"type": "text", "text": "What is in this picture?"})];
    if let Some(url) = url {
        parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    json!([{"role": "user", "content": parts}])
}

#[test]
fn a_base64_image_is_served_as_the_engine_answers_it() {
    let model = Arc::new(Model::load(model_path(), &ModelParams::default()).unwrap());
    let spec = ProjectorSpec::mlp(model.n_embd_inp() as u32);
    let mmproj = tiny_projector_path(&spec).unwrap();
    let server = Server::start(&["--mmproj", mmproj.to_str().unwrap()]);
    let jpeg = test_jpeg();
    let ask = |messages: Value| {
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 12, "temperature": 0}))
    };

    let (status, with_image) = ask(messages(Some(&data_url(&jpeg))));
    assert_eq!(status, 200, "{with_image}");
    let (status, without) = ask(messages(None));
    assert_eq!(status, 200, "{without}");
    let tokens = |body: &Value| body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(tokens(&with_image), tokens(&without) + spec.n_image_tokens(), "the image's tokens count: {with_image}");
    let served = with_image["choices"][0]["message"]["content"].as_str().unwrap().to_owned();

    // The same conversation through the Responses and Messages APIs.
    let b64 = base64::engine::general_purpose::STANDARD.encode(&jpeg);
    let (status, response) = server.post(
        "/v1/responses",
        &json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is in this picture?"},
            {"type": "input_image", "image_url": data_url(&jpeg)}]}],
            "max_output_tokens": 12, "temperature": 0}),
    );
    assert_eq!(status, 200, "{response}");
    let message = response["output"].as_array().unwrap().iter().find(|i| i["type"] == "message").unwrap();
    assert_eq!(message["content"][0]["text"].as_str(), Some(served.as_str()), "{response}");
    assert_eq!(response["usage"]["input_tokens"].as_u64(), Some(tokens(&with_image) as u64), "{response}");
    let (status, reply) = server.post(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64}}]}],
            "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["content"][0]["text"].as_str(), Some(served.as_str()), "{reply}");
    assert_eq!(reply["usage"]["input_tokens"].as_u64(), Some(tokens(&with_image) as u64), "{reply}");
    drop(server);

    // The engine, as the server runs it, on the same conversation and image.
    let config = EngineConfig::default()
        .n_ctx(4096)
        .max_running(4)
        .n_threads(THREADS)
        .projector(&mmproj, ProjectorParams::default().n_threads(THREADS));
    let engine = Engine::start(Arc::clone(&model), config).unwrap();
    let format = model.chat_format(None).unwrap();
    let prompt =
        format.prompt_json(&model, &messages(Some("data:image/jpeg;base64,")), &ChatOptions::default()).unwrap();
    let image = engine.media_from_bytes(&jpeg).unwrap();
    let out = engine.submit(Request::chat(&prompt).with_media([image]).max_tokens(12)).unwrap().wait();
    assert_eq!(out.text, served);
}

#[test]
fn images_the_server_cannot_take_are_400s() {
    let model = Model::load(model_path(), &ModelParams::default()).unwrap();
    let mmproj = tiny_projector_path(&ProjectorSpec::mlp(model.n_embd_inp() as u32)).unwrap();
    let server = Server::start(&["--mmproj", mmproj.to_str().unwrap(), "--max-media", "2"]);
    let jpeg = test_jpeg();
    let ask = |messages: Value| server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 2}));
    for (url, why) in [
        ("https://example.com/cat.jpg".to_owned(), "not fetched"),
        (data_url(&jpeg[..100]), "truncated"),
        (data_url(b"not an image at all"), "image"),
        ("data:image/png;base64,%%%".to_owned(), "base64"),
    ] {
        let (status, body) = ask(messages(Some(&url)));
        assert_error(status, &body, 400);
        assert_eq!(body["error"]["param"], "messages", "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(why), "{why}: {body}");
    }
    let three = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(&jpeg)}},
        {"type": "image_url", "image_url": {"url": data_url(&jpeg)}},
        {"type": "image_url", "image_url": {"url": data_url(&jpeg)}},
        {"type": "text", "text": "Which differs?"},
    ]}]);
    let (status, body) = ask(three);
    assert_error(status, &body, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("--max-media"), "{body}");
    // The server still answers.
    let (status, _) = ask(messages(Some(&data_url(&jpeg))));
    assert_eq!(status, 200);
    drop(server);

    let plain = Server::start(&[]);
    let (status, body) =
        plain.post("/v1/chat/completions", &json!({"messages": messages(Some(&data_url(&jpeg))), "max_tokens": 2}));
    assert_error(status, &body, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("--mmproj"), "{body}");
}
