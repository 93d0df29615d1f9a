//! Projector files (feature `mtmd`): libmtmd's clip loader asserts on a
//! metadata key stored with another type than it reads, so each such file
//! must come back as `Error::ProjectorLoad`, naming the key, before libmtmd
//! opens it.

use llama_suite::synthetic::{ProjectorSpec, TinyModelSpec, write_tiny_projector};
use llamacpp::mtmd::{Projector, ProjectorParams};

use super::*;

#[test]
fn projector_keys_of_another_type_are_refused() {
    isolated(|| {
        let model = tiny_model();
        let dir = tempfile::tempdir().unwrap();
        let good_path = dir.path().join("good.gguf");
        write_tiny_projector(&good_path, &ProjectorSpec::mlp(TinyModelSpec::default().n_embd)).unwrap();
        let good = fs::read(&good_path).unwrap();
        let params = ProjectorParams::default().n_threads(1);
        Projector::load(&model, &good_path, &params).expect("the unchanged projector loads");

        let lay = layout(&good);
        // Each key's type tag (the u32 before its value) changed to a type
        // of the same width, so the rest of the file still parses.
        const UINT8: u32 = 0;
        const INT32: u32 = 5;
        const FLOAT32: u32 = 6;
        for (key, tag, stored) in [
            ("clip.vision.image_size", INT32, "int32"),
            ("clip.vision.embedding_length", FLOAT32, "float32"),
            ("clip.has_vision_encoder", UINT8, "uint8"),
            ("clip.vision.attention.layer_norm_epsilon", INT32, "int32"),
        ] {
            let value = lay.kv.iter().find(|(k, ..)| k == key).unwrap_or_else(|| panic!("{key}")).1;
            let mut bad = good.clone();
            bad[value - 4..value].copy_from_slice(&tag.to_le_bytes());
            let path = dir.path().join(format!("{key}.gguf"));
            fs::write(&path, &bad).unwrap();
            let err = Projector::load(&model, &path, &params).unwrap_err();
            assert!(
                matches!(&err, Error::ProjectorLoad { reason, .. } if reason.contains(key) && reason.contains(stored)),
                "{key}: {err}"
            );
        }
        // The model is unharmed and a good projector still loads.
        Projector::load(&model, &good_path, &params).expect("the projector loads after the refusals");
        let mut ctx = model.new_context(&small_params()).unwrap();
        let tokens = model.vocab().tokenize("Hello", AddBos::Yes).unwrap();
        ctx.eval(&tokens, 0).unwrap();
    });
}
