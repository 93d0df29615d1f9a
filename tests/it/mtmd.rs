//! Images in through libmtmd (feature `mtmd`), on the tiny model with the
//! tiny synthetic projectors of `llamacpp::testing` (LLaVA's `mlp` head
//! and Gemma 3's): tokenizing around media markers, evaluation equal to
//! libmtmd's own helper (what llama-mtmd-cli runs), media-aware prompt
//! comparison, and bad inputs as errors.

use llama_suite::safe_api::{nmse, other_tiny_model, small_params, tiny_model};
use llama_suite::synthetic::{ProjectorSpec, TinyModelSpec, tiny_projector_path, write_tiny_projector};
use llamacpp::mtmd::{ChunkKind, Media, MediaPrompt, Projector, ProjectorParams};
use llamacpp::{AddBos, Attention, Context, Error, Model, Output, Special, sys};
use sha2::{Digest, Sha256};

fn params() -> ProjectorParams {
    ProjectorParams::default().n_threads(1)
}

fn mlp(model: &Model) -> Projector<'_> {
    let path = tiny_projector_path(&ProjectorSpec::mlp(TinyModelSpec::default().n_embd)).unwrap();
    Projector::load(model, path, &params()).unwrap()
}

/// A 16×16 image (the mlp projector's own size: no resampling) with a
/// pattern set by `seed`.
fn image(seed: u8, side: u32) -> Media {
    let rgb: Vec<u8> =
        (0..side * side * 3).map(|i| (i as u8).wrapping_mul(seed.wrapping_add(1)).wrapping_add(seed)).collect();
    Media::image_rgb(side, side, &rgb).unwrap()
}

fn prompt(projector: &Projector<'_>, media: &[&Media]) -> MediaPrompt {
    let markers: String = media.iter().map(|_| format!(" {}", projector.marker())).collect();
    let text = format!("Hello{markers} world");
    projector.tokenize(&text, media, AddBos::Yes, Special::Plain).unwrap()
}

fn eval_logits<'m>(projector: &mut Projector<'m>, ctx: &mut Context<'m>, prompt: &MediaPrompt) -> Vec<f32> {
    ctx.clear_kv();
    projector.eval(ctx, prompt, 0).unwrap();
    ctx.logits(Output::Last).unwrap().to_vec()
}

#[test]
fn an_image_becomes_its_own_chunk_between_text_chunks() {
    let model = tiny_model();
    let projector = mlp(&model);
    assert!(projector.supports_vision());
    assert!(!projector.supports_audio());
    assert_eq!(projector.audio_sample_rate(), None);
    assert!(!projector.uses_mrope());
    assert_eq!(projector.marker(), "<__media__>");

    let picture = image(1, 16);
    let p = prompt(&projector, &[&picture]);
    let kinds: Vec<ChunkKind> = p.chunks().map(|c| c.kind()).collect();
    assert_eq!(kinds, [ChunkKind::Text, ChunkKind::Image, ChunkKind::Text]);
    let chunks: Vec<_> = p.chunks().collect();
    let n_image = ProjectorSpec::mlp(64).n_image_tokens();
    assert_eq!(n_image, 4);
    assert_eq!(chunks[1].n_tokens(), n_image);
    assert_eq!(chunks[1].n_pos(), n_image);
    assert_eq!(chunks[1].media_id(), Some(picture.id()));
    assert!(chunks[1].tokens().is_empty());
    // The text around the marker is the vocabulary's tokenization of it.
    let before = model.vocab().tokenize("Hello ", AddBos::Yes).unwrap();
    assert_eq!(chunks[0].tokens(), &before[..]);
    assert_eq!(p.n_tokens(), chunks.iter().map(|c| c.n_tokens()).sum::<usize>());
    assert_eq!(p.n_pos(), p.n_tokens());
}

/// Our evaluation (text through `Context::eval`, media through the
/// checked decode) gives exactly the logits of libmtmd's own helper,
/// `mtmd_helper_eval_chunk_single` over every chunk (llama-mtmd-cli's
/// path), on the same image and prompt.
#[test]
fn evaluation_equals_libmtmds_own_helper_and_the_image_matters() {
    let model = tiny_model();
    let mut projector = mlp(&model);
    let (a, b) = (image(1, 16), image(2, 16));
    let pa = prompt(&projector, &[&a]);
    let mut ctx = model.new_context(&small_params()).unwrap();
    let ours = eval_logits(&mut projector, &mut ctx, &pa);

    let mut theirs_ctx = model.new_context(&small_params()).unwrap();
    let mut n_past = 0;
    let n = pa.chunks().len();
    for (i, chunk) in pa.chunks().enumerate() {
        let (mut next, mut code) = (n_past, 0);
        // SAFETY: a live projector, context and chunk of this model; the
        // context's n_batch (64) holds every chunk; the shim catches
        // exceptions.
        let shim = unsafe {
            sys::mtmd::llama_rs_mtmd_eval_chunk_single(
                projector.as_ptr(),
                theirs_ctx.as_ptr(),
                chunk.as_ptr(),
                n_past,
                0,
                64,
                i + 1 == n,
                &mut next,
                &mut code,
            )
        };
        assert_eq!((shim, code), (0, 0));
        n_past = next;
    }
    assert_eq!(n_past as usize, pa.n_pos());
    // SAFETY: the helper asked for the last token's logits; the row holds
    // the vocabulary's size.
    let theirs =
        unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(theirs_ctx.as_ptr(), -1), ours.len()).to_vec() };
    assert_eq!(ours, theirs, "our evaluation differs from libmtmd's helper");

    // The image reaches the logits, and the same image gives the same ones.
    let pb = prompt(&projector, &[&b]);
    let other = eval_logits(&mut projector, &mut ctx, &pb);
    assert!(nmse(&ours, &other) > 1e-6, "another image left the logits unchanged");
    assert_eq!(eval_logits(&mut projector, &mut ctx, &pa), ours);
    // An image of another size is letterboxed to the projector's 16×16.
    let big = prompt(&projector, &[&image(1, 40)]);
    let resized = eval_logits(&mut projector, &mut ctx, &big);
    assert!(resized.iter().all(|x| x.is_finite()));
}

/// Gemma 3's projector: libmtmd puts `<start_of_image>` / `<end_of_image>`
/// text around the image, and the model attends to the image's tokens at
/// once, which must fit one micro-batch: a context whose `n_ubatch` is
/// smaller gets an error, not llama.cpp's abort.
#[test]
fn a_non_causal_image_must_fit_one_micro_batch() {
    let model = tiny_model();
    let spec = ProjectorSpec::gemma3(64);
    let mut projector = Projector::load(&model, tiny_projector_path(&spec).unwrap(), &params()).unwrap();
    let picture = image(3, 32);
    let p = prompt(&projector, &[&picture]);
    let chunks: Vec<_> = p.chunks().collect();
    assert_eq!(chunks[1].kind(), ChunkKind::Image);
    assert_eq!(chunks[1].n_tokens(), spec.n_image_tokens());
    let text = model.vocab().decode(chunks[0].tokens()).unwrap();
    assert!(text.ends_with("<start_of_image>"), "{text:?}");

    let mut narrow = model.new_context(&small_params().n_batch(2).n_ubatch(2)).unwrap();
    let err = projector.eval(&mut narrow, &p, 0).unwrap_err();
    assert!(matches!(&err, Error::InvalidBatch(m) if m.contains("n_ubatch")), "{err}");

    let mut ctx = model.new_context(&small_params()).unwrap();
    let logits = eval_logits(&mut projector, &mut ctx, &p);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn a_cached_prefix_is_shared_only_with_identical_media() {
    let model = tiny_model();
    let projector = mlp(&model);
    let (a, a_again, b) = (image(1, 16), image(1, 16), image(2, 16));
    assert_eq!(a.id(), a_again.id());
    assert_ne!(a.id(), b.id());
    assert_eq!(a.id().len(), 64);
    let pa = prompt(&projector, &[&a]);
    let pa2 = prompt(&projector, &[&a_again]);
    let pb = prompt(&projector, &[&b]);
    assert_eq!(pa.common_chunks(&pa2), 3);
    assert_eq!(pa.common_positions(&pa2), pa.n_pos());
    let head = pa.chunks().next().unwrap().n_pos();
    assert_eq!(pa.common_chunks(&pb), 1);
    assert_eq!(pa.common_positions(&pb), head, "the prefix stops at the differing image");
    // The same image through another projector (of the same file here;
    // another could have other image-token limits): the text before it
    // is shared, the image is not.
    let second = mlp(&model);
    let pa_second = prompt(&second, &[&a_again]);
    assert_eq!(pa.common_chunks(&pa_second), 1);
    assert_eq!(pa.common_positions(&pa_second), head);
}

#[test]
fn image_files_decode_with_their_sha256_as_id() {
    let model = tiny_model();
    let projector = mlp(&model);
    let jpeg = std::path::Path::new(sys::SOURCE_DIR).join("tools/mtmd/test-1.jpeg");
    let bytes = std::fs::read(&jpeg).unwrap_or_else(|e| panic!("{}: {e}", jpeg.display()));
    let media = Media::from_bytes(&projector, &bytes).unwrap();
    assert!(!media.is_audio());
    assert!(media.width() > 100 && media.height() > 100, "{}×{}", media.width(), media.height());
    assert_eq!(media.data().len(), media.width() as usize * media.height() as usize * 3);
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(media.id(), digest);
    let from_file = Media::from_file(&projector, &jpeg).unwrap();
    assert_eq!(from_file.id(), media.id());
}

#[test]
fn bad_media_and_mismatched_projectors_are_errors() {
    // Declared first: a context of it must outlive the projector of
    // `model` for the borrow checker to let it reach `eval`, where the
    // model is checked at run time.
    let other = other_tiny_model();
    let model = tiny_model();
    let mut projector = mlp(&model);

    // Images that are not images.
    assert!(matches!(Media::image_rgb(0, 16, &[]), Err(Error::Media(_))));
    assert!(matches!(Media::image_rgb(4, 4, &[0; 47]), Err(Error::Media(_))));
    assert!(matches!(Media::image_rgb(65536, 65536, &[]), Err(Error::Media(_))));
    assert!(matches!(Media::audio_pcm(&[]), Err(Error::Media(_))));
    assert!(Media::audio_pcm(&[0.0; 1600]).is_ok());
    // libmtmd asserts on a one-sample clip, and its resizers compute in
    // 32-bit arithmetic: short clips and thin or huge images are refused.
    assert!(matches!(Media::audio_pcm(&[0.0]), Err(Error::Media(_))));
    let mut samples = vec![0.0; 1600];
    samples[7] = f32::NAN;
    assert!(matches!(Media::audio_pcm(&samples), Err(Error::Media(_))));
    assert!(matches!(Media::image_rgb(20_000, 1, &[0; 60_000]), Err(Error::Media(_))));
    // A PNG header that claims 100,000 × 100,000 pixels is refused before
    // stb_image allocates anything; so are formats it decodes but we do not take.
    let mut huge_png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    huge_png.extend(100_000u32.to_be_bytes());
    huge_png.extend(100_000u32.to_be_bytes());
    huge_png.extend([8, 2, 0, 0, 0]);
    let err = Media::from_bytes(&projector, &huge_png).unwrap_err();
    assert!(matches!(&err, Error::Media(m) if m.contains("larger than allowed")), "{err}");
    let tga = [0u8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 4, 0, 24, 0];
    assert!(matches!(Media::from_bytes(&projector, &tga), Err(Error::Media(_))));
    let jpeg = std::fs::read(std::path::Path::new(sys::SOURCE_DIR).join("tools/mtmd/test-1.jpeg")).unwrap();
    for bad in [&jpeg[..100], &b"not an image at all"[..], &[][..]] {
        let err = Media::from_bytes(&projector, bad).unwrap_err();
        assert!(matches!(err, Error::Media(_)), "{err}");
    }
    let missing = Media::from_file(&projector, "/nonexistent/picture.png").unwrap_err();
    assert!(matches!(missing, Error::Io { .. }), "{missing}");

    // Markers and media that do not match, text with a NUL byte.
    let picture = image(1, 16);
    let marker = projector.marker().to_owned();
    let two = format!("{marker} and {marker}");
    assert!(matches!(projector.tokenize(&two, &[&picture], AddBos::Yes, Special::Plain), Err(Error::Media(_))));
    assert!(matches!(projector.tokenize("no marker", &[&picture], AddBos::Yes, Special::Plain), Err(Error::Media(_))));
    assert!(matches!(projector.tokenize("a\0b", &[], AddBos::Yes, Special::Plain), Err(Error::Nul(_))));

    // A prompt that does not fit the sequence, checked before any of it runs.
    let long = format!("{} {marker} end", "Hello world ".repeat(200));
    let p = projector.tokenize(&long, &[&picture], AddBos::Yes, Special::Plain).unwrap();
    let mut small_ctx = model.new_context(&small_params()).unwrap();
    assert!(p.n_pos() > small_ctx.n_ctx_seq() as usize, "{} positions", p.n_pos());
    assert!(matches!(projector.eval(&mut small_ctx, &p, 0), Err(Error::ContextFull { .. })));
    assert_eq!(small_ctx.seq_pos_max(0).unwrap(), None, "nothing was evaluated");
    let p = prompt(&projector, &[&picture]);
    assert!(matches!(projector.eval(&mut small_ctx, &p, 7), Err(Error::InvalidSeqId { .. })));

    // A context that attends non-causally takes an image's tokens in one
    // micro-batch too (llama.cpp asserts otherwise); parameters libmtmd
    // would overflow or assert on are refused.
    let mut non_causal =
        model.new_context(&small_params().attention(Attention::NonCausal).n_batch(64).n_ubatch(2)).unwrap();
    // BOS alone, then the image: only the image is larger than n_ubatch.
    let image_first = projector.tokenize(&marker, &[&picture], AddBos::Yes, Special::Plain).unwrap();
    assert_eq!(image_first.chunks().next().unwrap().n_tokens(), 1);
    let err = projector.eval(&mut non_causal, &image_first, 0).unwrap_err();
    assert!(matches!(&err, Error::InvalidBatch(m) if m.contains("n_ubatch")), "{err}");
    let path = tiny_projector_path(&ProjectorSpec::mlp(64)).unwrap();
    for bad in [
        params().n_threads(100_000),
        params().n_threads(0),
        params().image_max_tokens(1_000_000),
        params().image_min_tokens(0),
        params().image_min_tokens(64).image_max_tokens(16),
    ] {
        let err = Projector::load(&model, &path, &bad).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { .. }), "{err}");
    }

    // A context of another model; a prompt of another projector; a
    // projector for a model of another width.
    let mut other_ctx = other.new_context(&small_params()).unwrap();
    assert!(matches!(projector.eval(&mut other_ctx, &p, 0), Err(Error::WrongModel("the context"))));
    let mut second = mlp(&model);
    let p2 = prompt(&second, &[&picture]);
    let mut ctx = model.new_context(&small_params()).unwrap();
    assert!(matches!(projector.eval(&mut ctx, &p2, 0), Err(Error::WrongModel("the media prompt"))));
    second.eval(&mut ctx, &p2, 0).unwrap();
    let err = Projector::load(&other, tiny_projector_path(&ProjectorSpec::mlp(64)).unwrap(), &params()).unwrap_err();
    assert!(matches!(&err, Error::ProjectorLoad { reason, .. } if reason.contains("mismatch")), "{err}");

    // A projector file that is not one, and one for a width the model
    // does not have.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF but nothing else").unwrap();
    assert!(Projector::load(&model, &junk, &params()).is_err());
    let narrow = dir.path().join("narrow.gguf");
    write_tiny_projector(&narrow, &ProjectorSpec::mlp(32)).unwrap();
    let err = Projector::load(&model, &narrow, &params()).unwrap_err();
    assert!(matches!(&err, Error::ProjectorLoad { reason, .. } if reason.contains("mismatch")), "{err}");
}

mod engine {
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
}

mod conversation {
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
        assert_eq!(
            usage.prompt_tokens,
            prompt.tokens.len() + n_image,
            "the text and the image (no delimiters in LLaVA's)"
        );

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
}
