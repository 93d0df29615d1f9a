//! Batched embeddings (`llamacpp::embed`) on the real default model (Gemma 3
//! 270M Q4_K_M, or `LLAMA_MODEL`): a generative model with causal
//! attention and no pooling of its own, so the tests choose Mean or Last
//! pooling. These never skip: without the model they fail.

use std::sync::OnceLock;

use llama_suite::model_cache::model_path;
use llamacpp::embed::{EmbedParams, Embedder, cosine_similarity};
use llamacpp::{AddBos, Batch, ContextParams, Error, FlashAttention, Logits, Model, ModelParams, Pooling, Token};

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = model_path().unwrap_or_else(|e| panic!("the real model is needed: {e}"));
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Small passes (so that a dozen texts need several) and two threads.
fn params(pooling: Pooling) -> EmbedParams {
    EmbedParams::default().pooling(pooling).n_ubatch(128).n_seq_max(8).n_threads(2).n_threads_batch(2)
}

fn embedder(params: &EmbedParams) -> Embedder<'static> {
    Embedder::new(model(), params).unwrap()
}

const TEXTS: [&str; 12] = [
    "The cat sat on the mat.",
    "A kitten was sleeping on a small rug by the fire.",
    "Stock markets fell sharply on Monday after the announcement.",
    "Rust is a systems programming language focused on safety.",
    "Paris is the capital of France.",
    "hi",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up and chases it away.",
    "你好 🦀 Rust",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "1 2 3 4 5 6 7 8 9 10",
    "What is the weather like in Berlin today?",
    "A recipe: flour, water, salt and yeast, kneaded and left to rise overnight.",
];

fn min_cosine(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) -> f32 {
    assert_eq!(a.len(), b.len(), "{what}: counts");
    let mut min = f32::INFINITY;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), model().n_embd_out(), "{what}: dim of {i}");
        assert!(x.iter().chain(y).all(|v| v.is_finite()), "{what}: non-finite value in {i}");
        let c = cosine_similarity(x, y);
        assert!(c >= 0.9999, "{what}: text {i} cosine {c}");
        min = min.min(c);
    }
    min
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn batched_equals_one_at_a_time() {
    for pooling in [Pooling::Mean, Pooling::Last] {
        let mut e = embedder(&params(pooling));
        let batched = e.embed(&TEXTS).unwrap();
        let passes = e.passes();
        // 12 texts, at most 8 per pass: at least two passes, far fewer than 12.
        assert!((2..=4).contains(&passes), "{pooling:?}: {passes} passes");
        let single: Vec<Vec<f32>> = TEXTS.iter().map(|t| e.embed_one(t).unwrap()).collect();
        assert_eq!(e.passes(), passes + TEXTS.len() as u64);
        let min = min_cosine(&batched, &single, &format!("{pooling:?} batched vs single"));
        let diff = batched.iter().zip(&single).map(|(a, b)| max_abs_diff(a, b)).fold(0.0, f32::max);
        println!("{pooling:?}: largest element difference batched vs one at a time: {diff:e}");
        println!(
            "{pooling:?}: min cosine batched vs one at a time over {} texts: {min:.9} (1 - min = {:e})",
            TEXTS.len(),
            1.0 - min
        );
        // Distinct texts really do get distinct vectors.
        assert!(cosine_similarity(&batched[0], &batched[2]) < 0.999, "{pooling:?}: two texts, one vector");
    }
}

/// The Last-pooled vector is the last token's hidden state, as a
/// per-token context without pooling reports it (set up like the
/// embedder's: no flash attention, the pass padded to a multiple of 8
/// tokens by a second sequence).
#[test]
fn last_pooling_is_the_last_tokens_embedding() {
    let mut e = embedder(&params(Pooling::Last));
    let got = e.embed(&TEXTS[..3]).unwrap();
    let p = ContextParams::default()
        .n_ctx(256)
        .n_seq_max(2)
        .kv_unified(true)
        .flash_attention(FlashAttention::Off)
        .embeddings(true)
        .pooling(Pooling::None)
        .n_threads(2)
        .n_threads_batch(2);
    let mut ctx = model().new_context(&p).unwrap();
    for (i, text) in TEXTS[..3].iter().enumerate() {
        let tokens = e.tokenize(text).unwrap();
        let mut batch = Batch::new(64, 1);
        batch.push_sequence(&tokens, 0, 0, Logits::No).unwrap();
        for pos in 0..tokens.len().next_multiple_of(8) - tokens.len() {
            batch.push(tokens[0], pos as i32, &[1], Logits::No).unwrap();
        }
        ctx.clear_kv();
        ctx.decode(&batch).unwrap();
        let want = ctx.embeddings(tokens.len() - 1).unwrap();
        let c = cosine_similarity(want, &got[i]);
        println!("text {i}: cosine {c:.7}, max difference {}", max_abs_diff(want, &got[i]));
        assert!(c >= 0.99999, "text {i}: cosine {c}");
    }
}

#[test]
fn normalized_vectors_have_unit_norm() {
    let mut raw = embedder(&params(Pooling::Mean));
    let mut unit = embedder(&params(Pooling::Mean).normalize(true));
    let a = raw.embed(&TEXTS).unwrap();
    let b = unit.embed(&TEXTS).unwrap();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let norm = y.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() <= 1e-5, "text {i}: norm {norm}");
        let raw_norm = x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        assert!((raw_norm - 1.0).abs() > 1e-2, "text {i}: the raw vector is already unit ({raw_norm})");
        // Same direction.
        assert!(cosine_similarity(x, y) >= 0.99999, "text {i}");
    }
}

#[test]
fn empty_input_gives_empty_output() {
    let mut e = embedder(&params(Pooling::Mean));
    let none: [&str; 0] = [];
    assert!(e.embed(&none).unwrap().is_empty());
    let no_tokens: [Vec<Token>; 0] = [];
    assert!(e.embed_tokens(&no_tokens).unwrap().is_empty());
    assert_eq!(e.passes(), 0, "nothing to run");
}

/// The empty string is BOS alone for Gemma: the BOS token's vector. An
/// empty token sequence is an error.
#[test]
fn empty_string_is_the_bos_vector() {
    let bos = model().vocab().bos().expect("Gemma has a BOS token");
    let mut mean = embedder(&params(Pooling::Mean));
    let mut last = embedder(&params(Pooling::Last));
    assert_eq!(mean.tokenize("").unwrap(), [bos]);
    let e = mean.embed(&["", "Paris is the capital of France.", ""]).unwrap();
    let b = mean.embed_tokens(&[[bos]]).unwrap();
    assert!(e[0].iter().all(|v| v.is_finite()) && e[0].iter().any(|&v| v != 0.0));
    assert!(cosine_similarity(&e[0], &b[0]) >= 0.9999);
    assert!(cosine_similarity(&e[0], &e[2]) >= 0.9999);
    assert!(cosine_similarity(&e[0], &e[1]) < 0.999);
    // One token: every pooling is that token's vector.
    let l = last.embed_one("").unwrap();
    assert!(cosine_similarity(&e[0], &l) >= 0.9999);

    let empty: [&[Token]; 2] = [&[bos], &[]];
    let err = mean.embed_tokens(&empty).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("input 1 has no tokens")), "{err}");
    // Without special tokens, the empty string has no tokens at all.
    let mut bare = embedder(&params(Pooling::Mean).add_special(AddBos::No));
    assert!(matches!(bare.embed(&["fine", ""]), Err(Error::InvalidArgument(_))));
    assert_eq!(bare.embed(&["fine"]).unwrap().len(), 1);
}

fn long_text() -> String {
    (0..60).map(|i| format!("sentence number {i} about rivers and hills. ")).collect()
}

#[test]
fn too_long_is_an_error_unless_truncating() {
    let text = long_text();
    let mut strict = embedder(&params(Pooling::Mean));
    let limit = strict.max_tokens();
    assert_eq!(limit, 128);
    let tokens = strict.tokenize(&text).unwrap();
    assert!(tokens.len() > limit, "{} tokens", tokens.len());
    let err = strict.embed(&["short", text.as_str()]).unwrap_err();
    assert!(matches!(err, Error::InputTooLarge { limit: 128, .. }), "{err}");
    println!("{err}");
    assert_eq!(strict.passes(), 0, "checked before anything runs");
    // Exactly the limit is fine.
    assert_eq!(strict.embed_tokens(&[&tokens[..limit]]).unwrap().len(), 1);

    for pooling in [Pooling::Mean, Pooling::Last] {
        let mut strict = embedder(&params(pooling));
        let mut cut = embedder(&params(pooling).truncate(true));
        let got = cut.embed(&["short", text.as_str(), "also short"]).unwrap();
        let prefix = strict.embed_tokens(&[&tokens[..limit]]).unwrap();
        let c = cosine_similarity(&got[1], &prefix[0]);
        assert!(c >= 0.9999, "{pooling:?}: truncated vs prefix cosine {c}");
        let whole_short = strict.embed(&["short", "also short"]).unwrap();
        min_cosine(&[got[0].clone(), got[2].clone()], &whole_short, &format!("{pooling:?} neighbours"));
        // The prefix really is shorter than the text: a longer prefix differs.
        let shorter = strict.embed_tokens(&[&tokens[..limit - 20]]).unwrap();
        assert!(cosine_similarity(&shorter[0], &got[1]) < 0.9999, "{pooling:?}");
    }
}

#[test]
fn order_is_preserved() {
    let mut e = embedder(&params(Pooling::Mean));
    let (a, b, c) = (TEXTS[0], TEXTS[6], TEXTS[9]);
    let abc = e.embed(&[a, b, c]).unwrap();
    let cab = e.embed(&[c, a, b]).unwrap();
    min_cosine(
        &[abc[0].clone(), abc[1].clone(), abc[2].clone()],
        &[cab[1].clone(), cab[2].clone(), cab[0].clone()],
        "abc vs cab",
    );
    // And they are not all the same vector (which would pass trivially).
    assert!(cosine_similarity(&abc[0], &abc[1]) < 0.999);
    assert!(cosine_similarity(&abc[1], &abc[2]) < 0.999);
    // The whole list reversed, over several passes.
    let forward = e.embed(&TEXTS).unwrap();
    let mut reversed = e.embed(&TEXTS.iter().rev().collect::<Vec<_>>()).unwrap();
    reversed.reverse();
    let min = min_cosine(&forward, &reversed, "reversed");
    println!("min cosine forward vs reversed: {min:.7}");
}

#[test]
fn poolings_differ_where_they_should() {
    let mut mean = embedder(&params(Pooling::Mean));
    let mut last = embedder(&params(Pooling::Last));
    let mut cls = embedder(&params(Pooling::Cls));
    assert_eq!((mean.pooling(), last.pooling(), cls.pooling()), (Pooling::Mean, Pooling::Last, Pooling::Cls));
    let texts = &TEXTS[..4];
    let m = mean.embed(texts).unwrap();
    let l = last.embed(texts).unwrap();
    let c = cls.embed(texts).unwrap();
    let bos = mean.embed_tokens(&[[model().vocab().bos().unwrap()]]).unwrap();
    for i in 0..texts.len() {
        let ml = cosine_similarity(&m[i], &l[i]);
        assert!(ml < 0.99, "text {i}: mean and last agree ({ml})");
        // Causal attention: the first token (BOS) sees only itself, so CLS
        // pooling gives every text the BOS vector.
        let cb = cosine_similarity(&c[i], &bos[0]);
        assert!(cb >= 0.9999, "text {i}: CLS is not the BOS vector ({cb})");
        assert!(cosine_similarity(&m[i], &c[i]) < 0.99, "text {i}: mean is the BOS vector");
    }
}

/// A text's vector is the same before and after other batches ran, and
/// whatever it shares its pass with.
#[test]
fn results_do_not_depend_on_earlier_batches() {
    let mut e = embedder(&params(Pooling::Mean));
    let probe = TEXTS[4];
    let first = e.embed_one(probe).unwrap();
    e.embed(&TEXTS).unwrap();
    e.embed(&[long_text().as_str()[..200].to_string()]).unwrap();
    let again = e.embed_one(probe).unwrap();
    assert_eq!(first, again, "same pass contents, same bits");
    // Beside other texts in one pass, in the middle of a batch.
    let beside = e.embed(&[TEXTS[0], probe, TEXTS[1]]).unwrap();
    assert!(cosine_similarity(&first, &beside[1]) >= 0.9999);
    // A fresh embedder agrees with one that has run many passes.
    let fresh = embedder(&params(Pooling::Mean)).embed_one(probe).unwrap();
    assert_eq!(first, fresh);
}

#[test]
fn bad_input_is_an_error() {
    let m = model();
    for pooling in [Pooling::None, Pooling::Rank] {
        assert!(matches!(Embedder::new(m, &params(pooling)), Err(Error::InvalidArgument(_))), "{pooling:?}");
    }
    // Gemma defines no pooling of its own.
    let err = Embedder::new(m, &params(Pooling::Model)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(ref s) if s.contains("no pooling")), "{err}");
    assert!(matches!(
        Embedder::new(m, &params(Pooling::Mean).n_ubatch(0)),
        Err(Error::InvalidParameter { name: "n_ubatch", .. })
    ));
    assert!(matches!(
        Embedder::new(m, &params(Pooling::Mean).n_seq_max(0)),
        Err(Error::InvalidParameter { name: "n_seq_max", .. })
    ));
    assert!(matches!(
        Embedder::new(m, &params(Pooling::Mean).n_seq_max(300)),
        Err(Error::InvalidParameter { name: "n_seq_max", .. })
    ));
    // Mean pooling needs n_ubatch a multiple of n_seq_max (llama.cpp aborts otherwise).
    let err = Embedder::new(m, &params(Pooling::Mean).n_ubatch(100).n_seq_max(8)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(ref s) if s.contains("multiple")), "{err}");
    // Last pooling has no such constraint.
    let mut odd = Embedder::new(m, &params(Pooling::Last).n_ubatch(100).n_seq_max(8)).unwrap();
    assert_eq!(odd.max_tokens(), 100);
    assert_eq!(odd.embed(&TEXTS).unwrap().len(), TEXTS.len());

    let mut e = embedder(&params(Pooling::Mean));
    let n_vocab = m.vocab().n_tokens() as i32;
    for bad in [Token(-1), Token(n_vocab)] {
        let err = e.embed_tokens(&[vec![Token(2), bad]]).unwrap_err();
        assert!(matches!(err, Error::InvalidToken { .. }), "{err}");
    }
    assert_eq!(e.passes(), 0);
    // Still usable afterwards.
    assert_eq!(e.embed(&["ok"]).unwrap()[0].len(), e.dim());
}

/// One sequence: a pass per text, unpadded; `align(1)`: no padding
/// sequence, so every sequence holds a text. Both still embed correctly
/// (to the rounding the alignment otherwise removes).
#[test]
fn one_sequence_and_unaligned_embedders() {
    let texts = &TEXTS[..3];
    let want = embedder(&params(Pooling::Mean)).embed(texts).unwrap();
    let mut single = embedder(&params(Pooling::Mean).n_seq_max(1));
    assert_eq!(single.n_seq_max(), 1);
    let got = single.embed(texts).unwrap();
    assert_eq!(single.passes(), 3);
    let mut unaligned = embedder(&params(Pooling::Mean).align(1));
    assert_eq!(unaligned.n_seq_max(), 8);
    let loose = unaligned.embed(texts).unwrap();
    assert_eq!(unaligned.passes(), 1);
    for (i, w) in want.iter().enumerate() {
        for (what, v) in [("n_seq_max 1", &got[i]), ("align 1", &loose[i])] {
            let c = cosine_similarity(w, v);
            assert!(c >= 0.999, "{what}, text {i}: cosine {c}");
        }
    }
    assert_eq!(embedder(&params(Pooling::Mean)).n_seq_max(), 7, "one sequence pads");
}
