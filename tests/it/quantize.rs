//! Quantizing a model through the safe API.

use llama_suite::safe_api::{argmax, nmse, small_params, tiny_model, tiny_path};
use llamacpp::{AddBos, Batch, Error, FileType, Model, ModelParams, Output, QuantizeParams, quantize};

#[test]
fn quantizing_to_q8_0_gives_a_working_model_with_close_logits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny-q8_0.gguf");
    let params = QuantizeParams::default().file_type(FileType::Q8_0).threads(1);
    quantize(tiny_path(), &out, &params).unwrap();

    let original = tiny_model();
    let quantized = Model::load(&out, &ModelParams::default()).unwrap();
    // The synthetic file does not record general.file_type.
    assert_eq!(original.file_type(), FileType::GUESSED);
    assert_eq!(quantized.file_type(), FileType::Q8_0);
    assert_eq!(FileType::Q8_0.name(), "Q8_0");
    assert!(quantized.size() < original.size() / 2, "{} vs {}", quantized.size(), original.size());
    assert_eq!(quantized.n_params(), original.n_params());

    let tokens = original.vocab().tokenize("Hello world, the quick brown fox", AddBos::Yes).unwrap();
    let mut rows = Vec::new();
    for model in [&original, &quantized] {
        let mut ctx = model.new_context(&small_params()).unwrap();
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
        rows.push(ctx.logits(Output::Last).unwrap().to_vec());
    }
    let error = nmse(&rows[0], &rows[1]);
    assert!(error < 1e-3, "Q8_0 logits drift too far: nmse {error}");
    assert_eq!(argmax(&rows[0]), argmax(&rows[1]));
    // Nothing but the output is left in the folder.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tiny-q8_0.gguf")]);
}

#[test]
fn quantizing_bad_input_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let params = QuantizeParams::default();
    assert!(matches!(quantize(dir.path(), &out, &params), Err(Error::ModelLoad { .. })));
    assert!(matches!(quantize(dir.path().join("missing.gguf"), &out, &params), Err(Error::Io { .. })));
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, vec![0x5Au8; 4096]).unwrap();
    let r = quantize(&garbage, &out, &params);
    assert!(matches!(r, Err(Error::ModelLoad { .. })), "{r:?}");
    // A quantized input is not quantized again unless asked: llama.cpp's
    // own refusal, as Error::Quantize.
    let q8 = dir.path().join("q8.gguf");
    quantize(tiny_path(), &q8, &QuantizeParams::default().threads(1)).unwrap();
    let to_q4 = QuantizeParams::default().file_type(FileType::Q4_0).threads(1);
    let err = quantize(&q8, &out, &to_q4).unwrap_err();
    assert!(matches!(err, Error::Quantize { ref path, ref reason } if path == &q8 && !reason.is_empty()), "{err:?}");
    std::fs::remove_file(&q8).unwrap();
    let negative = QuantizeParams::default().threads(-1);
    assert!(matches!(quantize(tiny_path(), &out, &negative), Err(Error::InvalidParameter { name: "threads", .. })));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("garbage.gguf")]);
}
