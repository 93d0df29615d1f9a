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

mod engine;

mod conversation;
