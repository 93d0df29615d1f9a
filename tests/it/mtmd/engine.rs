//! Requests with images in the continuous-batching engine.

use std::sync::Arc;

use llama_suite::safe_api::greedy_continue;
use llamacpp::chat::{ChatMessage, ChatOptions, ContentPart};
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::{ContextParams, KvType};

use super::*;

const N: usize = 8;

fn mlp_path() -> std::path::PathBuf {
    tiny_projector_path(&ProjectorSpec::mlp(TinyModelSpec::default().n_embd)).unwrap()
}

/// F32 cells: batched and single-sequence runs then differ only in the
/// order of f32 sums (as in the engine's own equality tests).
fn engine(model: &Arc<Model>, n_ubatch: u32) -> Engine {
    let config = EngineConfig::default()
        .n_ctx(2048)
        .n_batch(64)
        .n_ubatch(n_ubatch)
        .n_threads(1)
        .kv_type(KvType::F32)
        .projector(mlp_path(), params());
    Engine::start(Arc::clone(model), config).unwrap()
}

/// What one sequence alone generates greedily: the prompt through
/// `Projector::eval` (text and image chunks as libmtmd tokenizes the
/// whole text), then N tokens.
fn alone<'m>(
    model: &'m Model,
    projector: &mut Projector<'m>,
    text: &str,
    media: &[&Media],
) -> (usize, Vec<llamacpp::Token>) {
    let params = ContextParams::default().n_ctx(512).n_batch(64).n_ubatch(64).n_threads(1).kv_type(KvType::F32);
    let mut ctx = model.new_context(&params).unwrap();
    let p = projector.tokenize(text, media, AddBos::Yes, Special::Markup).unwrap();
    projector.eval(&mut ctx, &p, 0).unwrap();
    let logits = ctx.logits(Output::Last).unwrap().to_vec();
    (p.n_tokens(), greedy_continue(&mut ctx, logits, p.n_pos() as i32, N).0)
}

#[test]
fn image_and_text_requests_batched_equal_each_run_alone() {
    let model = Arc::new(tiny_model());
    let mut projector = Projector::load(&model, mlp_path(), &params()).unwrap();
    let engine = engine(&model, 64);
    let cases: [(&str, &[u8]); 6] = [
        ("Hello <__media__> world", &[1]),
        ("Just some text, no image", &[]),
        ("Hello <__media__> world", &[2]),
        ("Two <__media__> and <__media__> images", &[3, 1]),
        ("<__media__> first, then text", &[4]),
        ("More text, and more", &[]),
    ];
    let submitted: Vec<_> = cases
        .iter()
        .map(|(text, seeds)| {
            let media = seeds.iter().map(|&s| image(s, 16));
            engine.submit(Request::media(*text, media).max_tokens(N).stop_at_eog(false)).unwrap()
        })
        .collect();
    for ((text, seeds), completion) in cases.iter().zip(submitted) {
        let media: Vec<Media> = seeds.iter().map(|&s| image(s, 16)).collect();
        let refs: Vec<&Media> = media.iter().collect();
        let (n_prompt, expected) = alone(&model, &mut projector, text, &refs);
        let done = completion.wait();
        assert_eq!(done.finish.usage.prompt_tokens, n_prompt, "{text}: image tokens count as prompt tokens");
        assert_eq!(done.tokens, expected, "{text} with images {seeds:?}");
    }
    let stats = engine.stats();
    assert_eq!(stats.requests_finished, cases.len() as u64, "{stats:?}");
}

/// Text before the image, longer than one block of the prefix index.
const HEAD: &str = "Look at this picture, which I took yesterday in the park by the river: ";

#[test]
fn a_cached_prefix_is_reused_through_an_identical_image_only() {
    let model = Arc::new(tiny_model());
    let engine = engine(&model, 64);
    let run = |seed: u8, tail: &str| {
        let request = Request::media(format!("{HEAD}<__media__> {tail}"), [image(seed, 16)]);
        engine.submit(request.max_tokens(2).stop_at_eog(false)).unwrap().wait().finish.usage
    };
    let first = run(1, "what is it?");
    assert_eq!(first.cached_tokens, 0);
    let head = model.vocab().tokenize(HEAD, AddBos::Yes).unwrap().len();
    assert!(head > 16, "longer than a block of the prefix index: {head}");
    let n_image = ProjectorSpec::mlp(64).n_image_tokens();
    let same = run(1, "and now?");
    assert!(same.cached_tokens >= head + n_image, "the same image is reused: {same:?}");
    let other = run(2, "what is it?");
    assert_eq!(other.cached_tokens, head, "another image is not: only the text before it is shared: {other:?}");
}

#[test]
fn media_requests_the_engine_cannot_serve_are_refused_at_submit() {
    let model = Arc::new(tiny_model());
    let plain = Engine::start(Arc::clone(&model), EngineConfig::default().n_ctx(512).n_threads(1)).unwrap();
    let err = plain.submit(Request::media("a <__media__> b", [image(1, 16)])).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("projector")), "{err}");
    assert!(!plain.takes_images());

    let engine = engine(&model, 64);
    assert!(engine.takes_images() && !engine.takes_audio());
    assert_eq!(engine.media_marker(), Some("<__media__>"));
    let err = engine.submit(Request::media("no marker here", [image(1, 16)])).unwrap_err();
    assert!(matches!(&err, Error::Media(m) if m.contains("0 media markers")), "{err}");
    let err = engine.submit(Request::media("ends with <__media__>", [image(1, 16)])).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("ends with a medium")), "{err}");

    // Gemma 3's images are attended to at once: 4 tokens in a micro-batch of 2.
    let gemma = tiny_projector_path(&ProjectorSpec::gemma3(64)).unwrap();
    let config = EngineConfig::default().n_ctx(512).n_batch(64).n_ubatch(2).n_threads(1).projector(gemma, params());
    let narrow = Engine::start(Arc::clone(&model), config).unwrap();
    let err = narrow.submit(Request::media("a <__media__> b", [image(1, 32)])).unwrap_err();
    assert!(matches!(&err, Error::InvalidBatch(m) if m.contains("n_ubatch")), "{err}");
}

/// A conversation whose user message has an image part: the prompt
/// says where the image goes, and the engine runs it there, as the
/// same tokens with the image between them run alone.
#[test]
fn a_chat_with_an_image_part_runs_with_the_image_in_its_place() {
    let model = Arc::new(tiny_model());
    let format = model.chat_format(None).unwrap();
    let messages = [
        ChatMessage::system("Be brief."),
        ChatMessage::parts(
            "user",
            [
                ContentPart::text("What is in"),
                ContentPart::image_url("data:image/png;base64,AAAA"),
                ContentPart::text("this picture?"),
            ],
        ),
    ];
    let prompt = format.prompt(&model, &messages, &ChatOptions::default()).unwrap();
    let [place] = prompt.media_at[..] else { panic!("one place: {:?}", prompt.media_at) };
    let vocab = model.vocab();
    let before = vocab.detokenize(&prompt.tokens[..place], AddBos::No, Special::Markup).unwrap();
    let after = vocab.detokenize(&prompt.tokens[place..], AddBos::No, Special::Markup).unwrap();
    assert!(before.ends_with("What is in"), "{before:?}");
    assert!(after.starts_with("this picture?"), "{after:?}");

    let engine = engine(&model, 64);
    let request = Request::chat(&prompt).with_media([image(5, 16)]).max_tokens(N).stop_at_eog(false);
    let done = engine.submit(request).unwrap().wait();
    // Alone: the text before, the image through Projector::eval, the
    // text after, then greedy.
    let mut projector = Projector::load(&model, mlp_path(), &params()).unwrap();
    let params = ContextParams::default().n_ctx(512).n_batch(64).n_ubatch(64).n_threads(1).kv_type(KvType::F32);
    let mut ctx = model.new_context(&params).unwrap();
    let picture = image(5, 16);
    let alone_image = projector.tokenize("<__media__>", &[&picture], AddBos::No, Special::Markup).unwrap();
    ctx.eval(&prompt.tokens[..place], 0).unwrap();
    projector.eval(&mut ctx, &alone_image, 0).unwrap();
    ctx.eval(&prompt.tokens[place..], 0).unwrap();
    let n_prompt = prompt.tokens.len() + alone_image.n_tokens();
    let logits = ctx.logits(Output::Last).unwrap().to_vec();
    let expected = greedy_continue(&mut ctx, logits, n_prompt as i32, N).0;
    assert_eq!(done.finish.usage.prompt_tokens, n_prompt);
    assert_eq!(done.tokens, expected);

    // Model::chat has no projector: an error, not the conversation
    // without its image (a Conversation takes one: `conversation::`).
    let err = model.chat(&messages, &llamacpp::CompleteOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");

    // Without its image the request is refused, as is one with two.
    let err = engine.submit(Request::chat(&prompt)).unwrap_err();
    assert!(matches!(&err, Error::Media(m) if m.contains("none came")), "{err}");
    let two = Request::chat(&prompt).with_media([image(5, 16), image(6, 16)]);
    assert!(matches!(engine.submit(two), Err(Error::Media(_))));
}
