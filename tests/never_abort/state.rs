//! Saved state: of another model or configuration, and every single-byte
//! corruption of it.

use super::*;

#[test]
fn state_of_another_model_or_configuration_is_rejected() {
    isolated(|| {
        let model = tiny_model();
        let other = other_tiny_model();
        let prompt = tokens(model.vocab(), "Hello world");
        let mut ctx = model.new_context(&small_params()).unwrap();
        let logits = decode_seq(&mut ctx, &prompt, 0, 0);
        let whole = ctx.save_state().unwrap();
        let seq = ctx.save_seq_state(0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (whole_file, seq_file) = (dir.path().join("whole"), dir.path().join("seq"));
        ctx.save_state_file(&whole_file, &prompt).unwrap();
        ctx.save_seq_state_file(&seq_file, 0, &prompt).unwrap();

        let fresh_targets = [
            ("another model", other.new_context(&small_params()).unwrap()),
            ("F32 cache", model.new_context(&small_params().kv_type(llamacpp::KvType::F32)).unwrap()),
            ("two streams", ctx_with_seqs(&model, 2, false)),
        ];
        for (what, mut target) in fresh_targets {
            assert!(
                matches!(target.load_state(&whole), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: whole bytes"
            );
            assert!(
                matches!(target.load_state_file(&whole_file), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: whole file"
            );
            // (Sequence data records the stream layout too.)
            assert!(
                matches!(target.load_seq_state(&seq, 0), Err(Error::State { kind: StateError::Mismatch, .. })),
                "{what}: seq bytes"
            );
            assert!(
                matches!(
                    target.load_seq_state_file(&seq_file, 0),
                    Err(Error::State { kind: StateError::Mismatch, .. })
                ),
                "{what}: seq file"
            );
            // The target still works.
            let toks = tokens(target.model().vocab(), "ok");
            decode_seq(&mut target, &toks, 0, 0);
        }

        // Garbage, truncated, empty and foreign files.
        let mut target = model.new_context(&small_params()).unwrap();
        for (what, data) in [
            ("half", &whole[..whole.len() / 2]),
            ("empty", &[][..]),
            ("seq as whole", &seq[..]),
            ("random", &[0x5au8; 900][..]),
        ] {
            // (llama.cpp would first allocate the 4-byte "name length" these
            // start with -- up to 4 GiB -- to compare an architecture name.)
            let t = std::time::Instant::now();
            assert!(matches!(target.load_state(data), Err(Error::State { kind: StateError::Mismatch, .. })), "{what}");
            assert!(t.elapsed().as_secs() < 1, "{what}: rejecting took {:?}", t.elapsed());
            if what != "seq as whole" {
                let r = target.load_seq_state(data, 0);
                assert!(matches!(r, Err(Error::State { kind: StateError::Mismatch, .. })), "{what} (seq): {r:?}");
            }
        }
        assert!(matches!(
            target.load_seq_state(&seq[..seq.len() - 3], 0),
            Err(Error::State { kind: StateError::Mismatch, .. })
        ));
        assert!(matches!(target.load_state_file(tiny_path()), Err(Error::State { kind: StateError::Mismatch, .. })));
        assert!(matches!(target.load_state_file(dir.path()), Err(Error::State { kind: StateError::Mismatch, .. })));
        assert!(matches!(target.load_state_file(dir.path().join("missing")), Err(Error::Io { .. })));
        assert!(matches!(
            target.load_seq_state_file(tiny_path(), 0),
            Err(Error::State { kind: StateError::Mismatch, .. })
        ));
        assert!(matches!(target.redecode_last(&[], 0), Err(Error::InvalidArgument(_))));
        // And the right state still restores after all that.
        target.load_state(&whole).unwrap();
        target.redecode_last(&prompt, 0).unwrap();
        assert_same_logits(&logits, target.logits(Output::Last).unwrap(), "restored after failed loads");
    });
}

/// Flips each byte of a saved state (whole and per sequence) and loads it:
/// an `Err` or a state that decodes, never an abort.
#[test]
fn no_single_byte_corruption_of_a_state_aborts() {
    isolated(|| {
        let model = tiny_model();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let prompt = tokens(model.vocab(), "Hello");
        decode_seq(&mut ctx, &prompt, 0, 0);
        let whole = ctx.save_state().unwrap();
        let seq = ctx.save_seq_state(0).unwrap();
        let mut target = model.new_context(&small_params()).unwrap();
        let mut failures = 0;
        for (is_seq, data) in [(false, &whole), (true, &seq)] {
            for at in 0..data.len() {
                for mask in [0xffu8, 0x01] {
                    let mut d = data.clone();
                    d[at] ^= mask;
                    let r = if is_seq { target.load_seq_state(&d, 0) } else { target.load_state(&d) };
                    match r {
                        Ok(()) => {}
                        Err(Error::State { kind: StateError::Mismatch, .. }) => {
                            failures += 1;
                            continue;
                        }
                        Err(other) => {
                            panic!("byte {at} ^ {mask:#x} ({}): {other:?}", if is_seq { "seq" } else { "whole" })
                        }
                    }
                    // Whatever was restored, the next decode returns.
                    let next = target.seq_pos_max(0).unwrap().map_or(0, |p| p + 1);
                    let mut b = Batch::new(1, 1);
                    b.push(Token(300), next, &[0], Logits::Yes).unwrap();
                    match target.decode(&b) {
                        Ok(()) | Err(Error::NoKvSlot | Error::InvalidBatch(_)) => {}
                        Err(other) => panic!("byte {at} ^ {mask:#x}: decode after the load: {other:?}"),
                    }
                }
            }
        }
        assert!(failures > 0);
        target.clear_kv();
        target.load_state(&whole).unwrap();
    });
}
