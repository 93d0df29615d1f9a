//! LoRA adapters and control vectors through the safe API.

use llama_suite::safe_api::{argmax, nmse, other_tiny_model, small_params, tiny_model};
use llama_suite::synthetic::{
    TinyModelSpec, write_tiny_llama_lora_merged, write_tiny_lora, write_tiny_lora_with_alpha,
};
use llamacpp::{AddBos, Batch, Context, Error, Model, ModelParams, Output};

fn last_logits(ctx: &mut Context<'_>, model: &Model) -> Vec<f32> {
    let tokens = model.vocab().tokenize("Hello world, the quick brown fox", AddBos::Yes).unwrap();
    ctx.clear_kv();
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    ctx.logits(Output::Last).unwrap().to_vec()
}

#[test]
fn a_lora_adapter_changes_the_logits_and_can_be_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lora.gguf");
    write_tiny_lora(&path, &TinyModelSpec::default(), 4).unwrap();

    let model = tiny_model();
    let adapter = model.load_lora(&path).unwrap();
    assert_eq!(adapter.metadata("adapter.type").as_deref(), Some("lora"));
    assert!(adapter.alora_invocation_tokens().is_empty());

    let mut ctx = model.new_context(&small_params()).unwrap();
    let base = last_logits(&mut ctx, &model);
    ctx.set_lora_adapters(&[(&adapter, 1.0)]).unwrap();
    let adapted = last_logits(&mut ctx, &model);
    assert!(nmse(&base, &adapted) > 1e-6, "the adapter did not change the logits");
    ctx.set_lora_adapters(&[(&adapter, 2.0)]).unwrap();
    let doubled = last_logits(&mut ctx, &model);
    assert!(nmse(&adapted, &doubled) > 1e-6, "the scale is ignored");
    ctx.set_lora_adapters(&[]).unwrap();
    assert_eq!(last_logits(&mut ctx, &model), base, "removing the adapter restores the model");
    assert!(matches!(ctx.set_lora_adapters(&[(&adapter, f32::NAN)]), Err(Error::Adapter(_))));
}

/// The adapter's effect is llama.cpp's LoRA math, `W + s·(B·A)` with
/// `s = scale · alpha / rank`: the adapted logits equal those of a model
/// whose query weights of layer 0 were merged that way (NMSE <= 1e-6, only
/// float rounding apart), for scales 1 and 2 and for alpha = rank and
/// alpha = rank / 2, while the plain model and every other case's merge are
/// far from them.
#[test]
fn a_lora_adapter_equals_its_merged_weights() {
    let spec = TinyModelSpec::default();
    let rank = 4;
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model();
    // (alpha, user scale): s = 1, 2, 0.5 and 1 again by another route.
    let cases = [(4.0f32, 1.0f32), (4.0, 2.0), (2.0, 1.0), (2.0, 2.0)];
    let adapters: Vec<_> = cases
        .iter()
        .map(|&(alpha, _)| {
            let path = dir.path().join(format!("lora-{alpha}.gguf"));
            if alpha == rank as f32 {
                write_tiny_lora(&path, &spec, rank).unwrap();
            } else {
                write_tiny_lora_with_alpha(&path, &spec, rank, alpha).unwrap();
            }
            let adapter = model.load_lora(&path).unwrap();
            assert_eq!(adapter.metadata("adapter.lora.alpha").map(|a| a.parse::<f32>().unwrap()), Some(alpha));
            adapter
        })
        .collect();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let base = last_logits(&mut ctx, &model);
    let (mut adapted, mut merged) = (Vec::new(), Vec::new());
    for (&(alpha, scale), adapter) in cases.iter().zip(&adapters) {
        ctx.set_lora_adapters(&[(adapter, scale)]).unwrap();
        adapted.push(last_logits(&mut ctx, &model));
        ctx.set_lora_adapters(&[]).unwrap();
        let merged_path = dir.path().join(format!("merged-{alpha}-{scale}.gguf"));
        write_tiny_llama_lora_merged(&merged_path, &spec, rank, alpha, scale).unwrap();
        let merged_model = Model::load(&merged_path, &ModelParams::default()).unwrap();
        let mut merged_ctx = merged_model.new_context(&small_params()).unwrap();
        merged.push(last_logits(&mut merged_ctx, &merged_model));
    }
    for (i, (alpha, scale)) in cases.iter().enumerate() {
        let what = format!("alpha {alpha}, scale {scale}");
        let e = nmse(&merged[i], &adapted[i]);
        let plain = nmse(&base, &adapted[i]);
        eprintln!("{what}: NMSE(merged, adapted) = {e:e}; NMSE(plain model, adapted) = {plain:e}");
        assert!(e <= 1e-6, "{what}: the adapter is not W + s·BA (NMSE {e:e})");
        assert_eq!(argmax(&merged[i]), argmax(&adapted[i]), "{what}");
        // The controls: the same check fails, by orders of magnitude, for
        // the plain model and for the merge of every case with another
        // effective scale (s = 0.5 against s = 1 is the closest: ~1e-2).
        assert!(plain > 1e-2, "{what}: the adapter barely changes the logits (NMSE {plain:e})");
        for (j, (alpha_j, scale_j)) in cases.iter().enumerate() {
            if alpha_j * scale_j == alpha * scale {
                continue;
            }
            let other = nmse(&merged[j], &adapted[i]);
            eprintln!("{what}: NMSE(merge at alpha {alpha_j}, scale {scale_j}; adapted) = {other:e}");
            assert!(other > 1e-3, "{what}: the merge at alpha {alpha_j}, scale {scale_j} is as close (NMSE {other:e})");
        }
    }
    // alpha 2, scale 2 is s = 1 again: the same as alpha 4, scale 1.
    assert!(nmse(&adapted[0], &adapted[3]) <= 1e-6);
}

#[test]
fn adapters_of_another_model_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lora.gguf");
    write_tiny_lora(&path, &TinyModelSpec::default(), 2).unwrap();
    let model = tiny_model();
    let other = other_tiny_model();
    // The other model's query projection has another shape.
    assert!(matches!(other.load_lora(&path), Err(Error::Adapter(_))));

    let twin = tiny_model();
    let foreign = twin.load_lora(&path).unwrap();
    let mut ctx = model.new_context(&small_params()).unwrap();
    assert!(matches!(ctx.set_lora_adapters(&[(&foreign, 1.0)]), Err(Error::Adapter(_))));

    assert!(matches!(model.load_lora(dir.path()), Err(Error::Adapter(_))));
    assert!(matches!(model.load_lora(dir.path().join("missing.gguf")), Err(Error::Io { .. })));
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, [7u8; 100]).unwrap();
    assert!(matches!(model.load_lora(&garbage), Err(Error::Adapter(_))));
}

#[test]
fn control_vectors_steer_and_clear() {
    let model = tiny_model();
    let n_embd = model.n_embd();
    let mut ctx = model.new_context(&small_params()).unwrap();
    let base = last_logits(&mut ctx, &model);
    // One row per layer from 1 on.
    let rows = model.n_layer() - 1;
    let vector: Vec<f32> = (0..n_embd * rows).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
    ctx.set_control_vector(&vector, 1, model.n_layer() as i32).unwrap();
    let steered = last_logits(&mut ctx, &model);
    assert!(nmse(&base, &steered) > 1e-6, "the control vector did not change the logits");
    ctx.clear_control_vector();
    assert_eq!(last_logits(&mut ctx, &model), base);
    assert!(matches!(ctx.set_control_vector(&vector[..n_embd - 1], 1, 1), Err(Error::Adapter(_))));
    assert!(matches!(ctx.set_control_vector(&[], 1, 1), Err(Error::Adapter(_))));
}
