//! Model files and metadata: broken files, every single-byte corruption
//! of the header, bad metadata overrides.

use super::*;

fn assert_load_fails(path: &Path, what: &str) {
    match Model::load(path, &ModelParams::default()) {
        Err(Error::ModelLoad { .. } | Error::Io { .. }) => {}
        Err(other) => panic!("{what}: unexpected error {other:?}"),
        Ok(_) => panic!("{what}: a broken file loaded"),
    }
}

#[test]
fn broken_model_files_are_rejected() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let good = fs::read(tiny_path()).unwrap();

        assert!(matches!(Model::load(dir.path(), &ModelParams::default()), Err(Error::ModelLoad { .. })));
        assert!(matches!(Model::load(dir.path().join("missing.gguf"), &ModelParams::default()), Err(Error::Io { .. })));
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            fs::write(&p, bytes).unwrap();
            p
        };
        assert_load_fails(&write("empty.gguf", b""), "empty");
        assert_load_fails(&write("short.gguf", b"GGU"), "3 bytes");
        assert_load_fails(&write("magic.gguf", b"GGUF"), "magic only");
        assert_load_fails(&write("half.gguf", &good[..good.len() / 2]), "first half");
        assert_load_fails(&write("header.gguf", &good[..20_000]), "header only");
        assert_load_fails(&write("no-tail.gguf", &good[..good.len() - 1]), "last byte missing");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let random: Vec<u8> = (0..good.len())
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        assert_load_fails(&write("random.gguf", &random), "random bytes");
        let mut magic_then_random = random.clone();
        magic_then_random[..4].copy_from_slice(b"GGUF");
        magic_then_random[4..8].copy_from_slice(&3u32.to_le_bytes());
        assert_load_fails(&write("magic-random.gguf", &magic_then_random), "GGUF header, random rest");

        // Targeted corruption of the header and tensor infos.
        let lay = layout(&good);
        let value_of = |key: &str| lay.kv.iter().find(|(k, ..)| k == key).unwrap_or_else(|| panic!("{key}")).1;
        let patch = |name: &str, at: usize, bytes: &[u8]| {
            let mut d = good.clone();
            d[at..at + bytes.len()].copy_from_slice(bytes);
            write(name, &d)
        };
        let cases: Vec<(&str, usize, Vec<u8>)> = vec![
            ("magic", 0, b"GGUX".to_vec()),
            ("version 0", 4, 0u32.to_le_bytes().to_vec()),
            ("version 99", 4, 99u32.to_le_bytes().to_vec()),
            ("tensor count + 1", 8, (lay.tensors.len() as u64 + 1).to_le_bytes().to_vec()),
            ("tensor count huge", 8, u64::MAX.to_le_bytes().to_vec()),
            ("kv count huge", 16, (1u64 << 40).to_le_bytes().to_vec()),
            ("block_count 0", value_of("llama.block_count"), 0u32.to_le_bytes().to_vec()),
            ("block_count huge", value_of("llama.block_count"), 0x0100_0002u32.to_le_bytes().to_vec()),
            ("block_count 3", value_of("llama.block_count"), 3u32.to_le_bytes().to_vec()),
            ("head_count_kv huge", value_of("llama.attention.head_count_kv"), 0x1000_0002u32.to_le_bytes().to_vec()),
            ("head_count 0", value_of("llama.attention.head_count"), 0u32.to_le_bytes().to_vec()),
            ("embedding_length", value_of("llama.embedding_length"), 65u32.to_le_bytes().to_vec()),
            ("rms eps < 0", value_of("llama.attention.layer_norm_rms_epsilon"), (-1e-5f32).to_le_bytes().to_vec()),
            ("rms eps NaN", value_of("llama.attention.layer_norm_rms_epsilon"), f32::NAN.to_le_bytes().to_vec()),
            ("architecture", value_of("general.architecture") + 8, b"xxxxx".to_vec()),
            ("tensor n_dims 9", lay.tensors[0].1, 9u32.to_le_bytes().to_vec()),
            ("tensor type 200", lay.tensors[0].2, 200u32.to_le_bytes().to_vec()),
            ("tensor type Q4_0", lay.tensors[2].2, 2u32.to_le_bytes().to_vec()),
            ("tensor offset past the end", lay.tensors[3].3, (1u64 << 40).to_le_bytes().to_vec()),
            ("tensor offset misaligned", lay.tensors[3].3, 1u64.to_le_bytes().to_vec()),
            ("tensor dim 0", lay.tensors[1].1 + 4, 0u64.to_le_bytes().to_vec()),
            ("tensor dim huge", lay.tensors[1].1 + 4, (1u64 << 62).to_le_bytes().to_vec()),
        ];
        for (what, at, bytes) in &cases {
            assert_load_fails(&patch("patched.gguf", *at, bytes), what);
        }
        // The unpatched copy still loads: the cases fail because of the patch.
        Model::load(write("copy.gguf", &good), &ModelParams::default()).unwrap();
    });
}

/// Flips every byte of the fixed header, the hyper-parameters and the
/// tensor infos (and a sample of the vocabulary arrays), one at a time:
/// loading must return, and where it succeeds, so must decoding.
#[test]
fn no_single_byte_corruption_of_the_header_aborts() {
    isolated(|| {
        let good = fs::read(tiny_path()).unwrap();
        let lay = layout(&good);
        let vocab_start = lay.kv.iter().find(|(k, ..)| k == "tokenizer.ggml.tokens").unwrap().1;
        let mut positions: Vec<usize> = (0..vocab_start).collect();
        positions.extend((vocab_start..lay.info.0).step_by(97));
        positions.extend(lay.info.0..lay.info.1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flipped.gguf");
        fs::write(&path, &good).unwrap();
        let mut file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        let (mut loaded, mut rejected) = (0, 0);
        for &at in &positions {
            file.seek(SeekFrom::Start(at as u64)).unwrap();
            file.write_all(&[good[at] ^ 0xff]).unwrap();
            match Model::load(&path, &ModelParams::default()) {
                Ok(model) => {
                    loaded += 1;
                    // Running the damaged model may fail, but only with an Err.
                    match model.new_context(&small_params()) {
                        Ok(mut ctx) => match ctx.decode(&Batch::from_tokens(&[Token(1), Token(300)], 0)) {
                            Ok(()) | Err(Error::InvalidToken { .. }) => {}
                            Err(other) => panic!("byte {at}: decode: {other:?}"),
                        },
                        Err(Error::ContextCreate(_)) => {}
                        Err(other) => panic!("byte {at}: context: {other:?}"),
                    }
                }
                Err(Error::ModelLoad { .. }) => rejected += 1,
                Err(other) => panic!("byte {at}: {other:?}"),
            }
            file.seek(SeekFrom::Start(at as u64)).unwrap();
            file.write_all(&[good[at]]).unwrap();
        }
        assert_eq!(loaded + rejected, positions.len());
        assert!(rejected > positions.len() / 2, "only {rejected} of {} flips rejected", positions.len());
        assert!(loaded > 0, "flips of names and scores leave a loadable model");
    });
}

#[test]
fn bad_metadata_overrides_are_rejected() {
    isolated(|| {
        let path = tiny_path();
        let with =
            |key: &str, value: MetadataValue| Model::load(&path, &ModelParams::default().metadata_override(key, value));
        for (key, value) in [
            ("llama.block_count", MetadataValue::Int(0)),
            ("llama.block_count", MetadataValue::Int(513)),
            ("llama.block_count", MetadataValue::Int(1 << 32)), // truncates to 0 in llama.cpp
            ("llama.attention.head_count_kv", MetadataValue::Int(8)),
            ("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(-1.0)),
            ("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(f64::NAN)),
            ("llama.rope.scaling.type", MetadataValue::Str("bogus".into())),
            ("llama.expert_count", MetadataValue::Int(4)),
        ] {
            let r = with(key, value.clone());
            assert!(matches!(r, Err(Error::ModelLoad { .. })), "{key} = {value:?}: {:?}", r.err());
        }
        for key in ["", &"k".repeat(128)] {
            let r = with(key, MetadataValue::Int(1));
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "key {key:?}: {r:?}");
        }
        let r = with("a\0b", MetadataValue::Int(1));
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        assert!(matches!(with("general.name", MetadataValue::Str("x".repeat(128))), Err(Error::InvalidArgument(_))));
        // Valid overrides of the same keys load.
        with("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(1e-6)).unwrap();
        with("llama.rope.scaling.type", MetadataValue::Str("linear".into())).unwrap();
    });
}
