//! LoRA adapters and control vectors through the safe API.

mod safe_api;

use llama::{Batch, Context, Error, Model};
use llama_suite::synthetic::{TinyModelSpec, write_tiny_lora};
use safe_api::{nmse, other_tiny_model, small_params, tiny_model};

fn last_logits(ctx: &mut Context<'_>, model: &Model) -> Vec<f32> {
    let tokens = model.vocab().tokenize("Hello world, the quick brown fox", true).unwrap();
    ctx.clear_kv(false);
    ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    ctx.logits(-1).unwrap().to_vec()
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
