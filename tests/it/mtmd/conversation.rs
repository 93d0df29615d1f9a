//! A multi-turn `Conversation` with a projector: the image in its
//! place as the engine runs it, kept in the cache across turns, given
//! attached or as a `data:` URL, and the errors.

use std::sync::Arc;

use base64::Engine as _;
use llamacpp::chat::{ChatEvent, ChatMessage, ContentPart, Conversation};
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::generate::GenerateOptions;
use llamacpp::{ContextParams, KvType};

use super::*;

const N: usize = 8;

fn mlp_path() -> std::path::PathBuf {
    tiny_projector_path(&ProjectorSpec::mlp(TinyModelSpec::default().n_embd)).unwrap()
}

/// F32 cells and the engine test's batch sizes: runs differ from the
/// engine's only in the order of f32 sums, and on the tiny model not
/// at all.
fn chat(model: &Model) -> Conversation<'_> {
    let context = ContextParams::default().n_ctx(512).n_batch(64).n_ubatch(64).n_threads(1).kv_type(KvType::F32);
    let projector = Projector::load(model, mlp_path(), &params()).unwrap();
    Conversation::with_context(model, &context)
        .unwrap()
        .system("Be brief.")
        .generate_options(GenerateOptions::default().max_tokens(N).stop_at_eog(false))
        .projector(projector)
        .unwrap()
}

fn text(turn: llamacpp::chat::Turn<'_, '_>) -> (String, llamacpp::generate::Usage) {
    let reply = turn.finish().unwrap();
    (reply.text(), reply.usage)
}

#[test]
fn an_image_turn_equals_the_engine_and_stays_cached_for_the_next() {
    let model = Arc::new(tiny_model());
    let mut conversation = chat(&model);
    let (first, usage) = text(conversation.send_media("What is in this picture?", [image(5, 16)]).unwrap());

    // The engine, on the same messages and image.
    let config = EngineConfig::default()
        .n_ctx(2048)
        .n_batch(64)
        .n_ubatch(64)
        .n_threads(1)
        .kv_type(KvType::F32)
        .projector(mlp_path(), params());
    let engine = Engine::start(Arc::clone(&model), config).unwrap();
    let format = model.chat_format(None).unwrap();
    let messages = &conversation.messages()[..2];
    let prompt = format.prompt(&model, messages, &Default::default()).unwrap();
    assert_eq!(prompt.media_at.len(), 1);
    let request = Request::chat(&prompt).with_media([image(5, 16)]).max_tokens(N).stop_at_eog(false);
    let done = engine.submit(request).unwrap().wait();
    assert_eq!(first, done.text, "the conversation's reply is the engine's");
    assert_eq!(usage.prompt_tokens, done.finish.usage.prompt_tokens, "image embeddings count as prompt tokens");
    let n_image = ProjectorSpec::mlp(64).n_image_tokens();
    assert_eq!(usage.prompt_tokens, prompt.tokens.len() + n_image, "the text and the image (no delimiters in LLaVA's)");

    // The next turn reuses the cache through the image: nothing before
    // the new message is decoded again.
    let (second, usage) = text(conversation.send("And the colours?").unwrap());
    let image_end = prompt.media_at[0] + n_image;
    assert!(usage.cached_tokens > image_end, "the image is reused from the cache: {usage:?}");

    // A fresh conversation given the same history decodes it all and
    // answers the same.
    let mut fresh = chat(&model);
    let history = conversation.messages().to_vec();
    let picture = fresh.attach(image(5, 16));
    for m in &history[1..history.len() - 1] {
        fresh.push(m.clone());
    }
    assert_eq!(
        fresh.messages()[1].content,
        Some(llamacpp::chat::MessageContent::Parts(vec![picture, ContentPart::text("What is in this picture?"),]))
    );
    let (again, usage) = text(fresh.reply().unwrap());
    assert_eq!(usage.cached_tokens, 0);
    assert_eq!(again, second, "a reply after cached media equals one after decoding them");
}

#[test]
fn a_data_url_part_is_the_same_image_as_the_file_attached() {
    let model = tiny_model();
    let file = std::path::Path::new(sys::SOURCE_DIR).join("tools/mtmd/test-1.jpeg");
    let bytes = std::fs::read(&file).unwrap();
    let url = format!("data:image/jpeg;base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes));

    let mut by_url = chat(&model);
    by_url.push(ChatMessage::parts("user", [ContentPart::image_url(url), ContentPart::text("Describe it.")]));
    let mut events = Vec::new();
    for event in by_url.reply().unwrap() {
        events.push(event.unwrap());
    }
    let Some(ChatEvent::Done { usage, .. }) = events.last() else { panic!("{events:?}") };
    assert!(usage.prompt_tokens > ProjectorSpec::mlp(64).n_image_tokens(), "{usage:?}");
    let url_text: String =
        events.iter().filter_map(|e| if let ChatEvent::Text(t) = e { Some(t.as_str()) } else { None }).collect();

    let mut attached = chat(&model);
    let projector = Projector::load(&model, mlp_path(), &params()).unwrap();
    let medium = Media::from_file(&projector, &file).unwrap();
    let (text, _) = text(attached.send_media("Describe it.", [medium]).unwrap());
    assert_eq!(url_text, text);
}

#[test]
fn media_a_conversation_cannot_use_are_errors() {
    let model = tiny_model();
    let part = ContentPart::image_url("data:image/png;base64,AAAA");
    let message = ChatMessage::parts("user", [part, ContentPart::text("What is it?")]);

    // No projector: refused, not run without the image.
    let mut plain = Conversation::new(&model).unwrap();
    plain.push(message.clone());
    let Err(err) = plain.reply() else { panic!("an image part without a projector is refused") };
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("projector")), "{err}");

    // Bytes that are no image, a remote URL, a medium never attached.
    let mut with = chat(&model);
    with.push(message);
    let Err(err) = with.reply() else { panic!("four bytes are no image") };
    assert!(matches!(err, Error::Media(_)), "{err}");
    let mut remote = chat(&model);
    remote.push(ChatMessage::parts("user", [ContentPart::image_url("https://example.com/a.png")]));
    let Err(err) = remote.reply() else { panic!("nothing is fetched") };
    assert!(matches!(&err, Error::Media(m) if m.contains("not fetched")), "{err}");
    let mut unknown = chat(&model);
    unknown.push(ChatMessage::parts("user", [ContentPart::image_url("media:0123"), ContentPart::text("a")]));
    let Err(err) = unknown.reply() else { panic!("a medium it does not hold") };
    assert!(matches!(&err, Error::Media(m) if m.contains("does not hold")), "{err}");

    // The same conversation answers once the bad message is gone: a
    // refused `send_media` keeps no message, `pop` takes one back.
    assert_eq!(with.pop().map(|m| m.role), Some("user".to_owned()));
    let before = with.messages().len();
    let clip = Media::audio_pcm(&[0.0; 1600]).unwrap();
    let refused = with.send_media("What do you hear?", [clip]).map(drop);
    assert!(matches!(&refused, Err(Error::Media(_))), "a clip for a projector without audio: {refused:?}");
    assert_eq!(with.messages().len(), before, "the refused message is not kept");
    let (text, usage) = text(with.send_media("What is it?", [image(3, 16)]).unwrap());
    assert!(!text.is_empty() && usage.prompt_tokens > 4, "{usage:?}");

    // A medium attached before the message that places it.
    let mut early = chat(&model);
    let first = early.attach(image(1, 16));
    let second = early.attach(image(2, 16));
    early.push(ChatMessage::parts("user", [first, ContentPart::text("One.")]));
    early.reply().unwrap().finish().unwrap();
    early.push(ChatMessage::parts("user", [second, ContentPart::text("Two.")]));
    assert!(early.reply().unwrap().finish().is_ok(), "an attached medium stays until its message comes");

    // A projector loaded for another model.
    let other = other_tiny_model();
    let path = tiny_projector_path(&ProjectorSpec::mlp(32)).unwrap();
    let foreign = Projector::load(&other, path, &params()).unwrap();
    let conversation = Conversation::new(&model).unwrap();
    // Lifetimes tie a projector to its model's borrow, not to which
    // model: the check is at run time.
    let err = conversation.projector(foreign).unwrap_err();
    assert!(matches!(err, Error::WrongModel(_)), "{err}");
}
