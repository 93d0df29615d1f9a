//! Unit tests of the synthetic models: vocabulary, PRNG, spec checks, sizes.

use super::*;
use std::collections::HashSet;

#[test]
fn vocab_is_unique_and_prefix_closed() {
    let vocab = tiny_vocab();
    assert_eq!(vocab.texts.len(), TINY_VOCAB_SIZE);
    assert_eq!(vocab.scores.len(), TINY_VOCAB_SIZE);
    assert_eq!(vocab.types.len(), TINY_VOCAB_SIZE);
    let unique: HashSet<&str> = vocab.texts.iter().map(String::as_str).collect();
    assert_eq!(unique.len(), TINY_VOCAB_SIZE, "duplicate token text");
    assert_eq!(vocab.texts[TINY_CONTROL_TOKEN_ID as usize], TINY_CONTROL_TOKEN);
    assert_eq!(vocab.texts[(TINY_FIRST_BYTE_ID + 0x0A) as usize], "<0x0A>");
    for piece in NORMAL_PIECES {
        let chars: Vec<char> = piece.chars().collect();
        if chars.len() > 1 {
            let prefix: String = chars[..chars.len() - 1].iter().collect();
            assert!(unique.contains(prefix.as_str()), "{piece:?} lacks {prefix:?}");
        }
    }
    assert!(normal_piece_id("▁Hello").is_some());
    assert!(normal_piece_id("▁world").is_some());
}

#[test]
fn rng_is_deterministic_and_spread() {
    let a: Vec<f32> = {
        let mut r = SplitMix64(7);
        (0..1000).map(|_| r.next_signed_unit()).collect()
    };
    let b: Vec<f32> = {
        let mut r = SplitMix64(7);
        (0..1000).map(|_| r.next_signed_unit()).collect()
    };
    assert_eq!(a, b);
    assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
    let mean = a.iter().sum::<f32>() / a.len() as f32;
    assert!(mean.abs() < 0.1, "mean {mean}");
}

#[test]
fn invalid_specs_are_rejected() {
    let bad = [
        TinyModelSpec { n_layer: 0, ..TinyModelSpec::default() },
        TinyModelSpec { n_head: 3, ..TinyModelSpec::default() },
        TinyModelSpec { n_head_kv: 3, ..TinyModelSpec::default() },
        TinyModelSpec { n_embd: 1 << 20, n_ff: 1 << 20, ..TinyModelSpec::default() },
    ];
    for spec in bad {
        let err = validate(&spec).expect_err("invalid spec accepted");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{spec:?}");
    }
    validate(&TinyModelSpec::default()).expect("default spec");
}

#[test]
fn data_bytes_counts_the_tensor_plan() {
    for spec in [
        TinyModelSpec::default(),
        TinyModelSpec { n_layer: 3, n_embd: 32, n_head: 2, n_head_kv: 1, n_ff: 48, ..TinyModelSpec::default() },
    ] {
        let plan: u64 = tensor_plan(&spec).iter().map(|t| t.n_elements().expect("small") * 4).sum();
        assert_eq!(data_bytes(&spec), Some(plan), "{spec:?}");
    }
    let huge = TinyModelSpec {
        n_layer: u32::MAX,
        n_embd: u32::MAX - 1,
        n_head: 1,
        n_head_kv: 1,
        n_ff: u32::MAX,
        ..TinyModelSpec::default()
    };
    assert_eq!(data_bytes(&huge), None);
}

#[test]
fn spec_key_depends_on_every_field() {
    let base = TinyModelSpec::default();
    let variants = [
        TinyModelSpec { n_layer: 3, ..base },
        TinyModelSpec { n_embd: 128, ..base },
        TinyModelSpec { n_head: 8, ..base },
        TinyModelSpec { n_head_kv: 4, ..base },
        TinyModelSpec { n_ff: 256, ..base },
        TinyModelSpec { n_ctx_train: 4096, ..base },
        TinyModelSpec { seed: 43, ..base },
    ];
    let mut keys: HashSet<u64> = variants.iter().map(|s| spec_key(s, Arch::Llama)).collect();
    keys.insert(spec_key(&base, Arch::Llama));
    keys.insert(spec_key(&base, Arch::Mamba));
    assert_eq!(keys.len(), variants.len() + 2);
    assert_eq!(spec_key(&base, Arch::Llama), spec_key(&TinyModelSpec::default(), Arch::Llama));
}

#[test]
fn the_writer_refuses_what_gguf_would_abort_on() {
    let mut w = GgufWriter::for_tensors(&[4, 4]).unwrap();
    w.add_f32_tensor("a", &[4], &[0.5; 4]).unwrap();
    let err = w.add_f32_tensor("a", &[4], &[0.5; 4]).unwrap_err();
    assert!(err.to_string().contains("added already"), "{err}");
    assert!(w.add_f32_tensor("b", &[2, 3], &[0.0; 4]).is_err(), "a shape that does not hold the values");
    assert!(w.add_f32_tensor("c", &[], &[]).is_err(), "no dimensions");
    assert!(w.add_f32_tensor("d", &[1, 1, 1, 1, 1], &[0.0]).is_err(), "more than four dimensions");
    assert!(w.add_f32_tensor("e\0", &[1], &[0.0]).is_err(), "a NUL in the name");
    // gguf aborts on an alignment that is not a power-of-two u32.
    assert!(w.set_u32("general.alignment", 3).is_err());
    assert!(w.set_str("general.alignment", "x").is_err());
    assert!(w.set_arr_i32("general.alignment", &[1]).is_err());
    w.set_u32("general.alignment.note", 3).unwrap();
    // Pools that cannot be had are errors, not aborts.
    assert!(GgufWriter::for_tensors(&[1 << 60]).is_err());
    assert!(GgufWriter::for_tensors(&[u64::MAX]).is_err());
    // What was accepted is written whole.
    let path = std::env::temp_dir().join(format!("llama-rs-writer-test-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    assert!(is_complete_gguf(&path));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn shaped_models_count_the_real_models_parameters_and_load_with_finite_logits() {
    use crate::{AddBos, Batch, ContextParams, Model, ModelParams, Output};
    assert_eq!(ShapedSpec::LLAMA_3_2_1B.n_params(), 1_235_814_400);
    assert_eq!(ShapedSpec::LLAMA_3_1_8B.n_params(), 8_030_261_248);
    assert_eq!(ShapedSpec::named("llama-3.1-8b"), Some(ShapedSpec::LLAMA_3_1_8B));
    assert_eq!(ShapedSpec::named("llama-3.2-1b-shaped"), Some(ShapedSpec::LLAMA_3_2_1B));
    assert_eq!(ShapedSpec::named("llama-2"), None);

    let small = ShapedSpec {
        name: "small-shaped",
        n_layer: 8,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_vocab: 1024,
        n_ctx_train: 4096,
        rope_freq_base: 10_000.0,
        tied_embeddings: false,
    };
    let dir = std::env::temp_dir().join(format!("llama-rs-shaped-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.gguf");
    write_shaped_llama(&path, &small).unwrap();
    let model = Model::load(&path, &ModelParams::default().n_gpu_layers(0)).unwrap();
    assert_eq!(model.n_params(), small.n_params());
    assert_eq!(model.vocab().n_tokens(), 1024);
    assert_eq!(model.n_layer(), 8);
    // Layers 0 and 7 (first and last eighth) and 3 and 6 (every third
    // between) have Q6_K attn_v: the file is larger than all-Q4_K.
    let q4k_bytes = small.n_params() / 256 * 144;
    assert!(model.size() > q4k_bytes, "{} vs {q4k_bytes}", model.size());

    let tokens = model.vocab().tokenize("Hello world", AddBos::Yes).unwrap();
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(256).n_threads(1)).unwrap();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    let logits = ctx.logits(Output::Last).unwrap();
    assert_eq!(logits.len(), 1024);
    assert!(logits.iter().all(|l| l.is_finite()), "{logits:?}");
    assert!(logits.iter().any(|&l| l != logits[0]), "the weights are not all alike");
    drop(ctx);
    drop(model);

    // Rows that are not whole blocks are refused, not an abort.
    assert!(write_shaped_llama(&dir.join("bad.gguf"), &ShapedSpec { n_embd: 100, ..small }).is_err());
    assert!(!dir.join("bad.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "mtmd")]
#[test]
fn the_siglip_shaped_projector_has_gemma_3s_vision_tower() {
    let spec = ProjectorSpec::gemma3_siglip(640);
    spec.validate().unwrap();
    assert_eq!(spec.n_image_tokens(), 256);
    let params: u64 = spec.tensors().iter().map(|t| t.n_elements().unwrap()).sum();
    // SigLIP-so400m's vision tower: about 400 million parameters (the
    // synthetic one has no attention biases and no post-norm).
    assert!((400_000_000..430_000_000).contains(&params), "{params} parameters");
    // 1,669,333,600 bytes written for a 640-wide model: 4 per parameter
    // and 16,480 of metadata and alignment.
    assert_eq!(params, 417_329_280);
}
