//! Encoder models (T5, BERT, built by hand): encode on a decoder-only
//! model, decode before encode, several sequences, no KV cache.

use super::*;

/// `llama_encode` on a decoder-only model builds a graph that reads the KV
/// cache without preparing it and crashes (SIGSEGV in
/// `build_input_k_idxs`); the wrapper refuses before llama.cpp runs.
#[test]
fn encoding_with_a_decoder_only_model_is_an_error() {
    isolated(|| {
        let model = tiny_model();
        assert!(!model.has_encoder());
        for params in [
            small_params(),
            small_params().embeddings(true),
            small_params().embeddings(true).pooling(Pooling::Mean),
            small_params().attention(llamacpp::Attention::NonCausal),
        ] {
            let mut ctx = model.new_context(&params).unwrap();
            let batch = Batch::from_tokens(&[Token(1), Token(300), Token(400)], 0);
            let err = ctx.encode(&batch).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("decode")), "{err:?}");
            assert!(matches!(ctx.logits(Output::Last), Err(Error::NoOutput(Output::Last))));
            assert!(matches!(ctx.embeddings(Output::Last), Err(Error::NoOutput(Output::Last))));
            ctx.decode(&batch).unwrap();
        }
    });
}

/// A metadata value of a hand-made model.
enum Kv {
    Str(String),
    U32(u32),
    F32(f32),
    Bool(bool),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

/// A GGUF file under construction: metadata and F32 tensors, written at
/// the end (the writer needs every tensor's size up front).
struct GgufFile {
    kv: Vec<(String, Kv)>,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
    rng: u64,
    n_vocab: u64,
}

impl GgufFile {
    /// A file of architecture `arch` with the tiny vocabulary: `<unk>`,
    /// `<s>`, `</s>`, the 256 byte tokens, then a few words.
    fn new(arch: &str) -> GgufFile {
        let mut f = GgufFile { kv: Vec::new(), tensors: Vec::new(), rng: 0x2545_f491_4f6c_dd1d, n_vocab: 0 };
        f.str("general.architecture", arch);
        let mut texts: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        texts.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        texts.extend(["▁", "a", "b", "c", "▁a", "▁b", "▁c", "▁ab", "▁abc"].map(String::from));
        // llama_token_type: UNKNOWN 2, CONTROL 3, BYTE 6, NORMAL 1.
        let types: Vec<i32> =
            (0..texts.len()).map(|i| [2, 3, 3].get(i).copied().unwrap_or(if i < 259 { 6 } else { 1 })).collect();
        let scores: Vec<f32> = (0..texts.len()).map(|i| -(i as f32)).collect();
        f.n_vocab = texts.len() as u64;
        f.str("tokenizer.ggml.model", "llama");
        f.kv.push(("tokenizer.ggml.tokens".into(), Kv::Strs(texts)));
        f.kv.push(("tokenizer.ggml.scores".into(), Kv::F32s(scores)));
        f.kv.push(("tokenizer.ggml.token_type".into(), Kv::I32s(types)));
        f
    }

    fn str(&mut self, key: &str, value: &str) {
        self.kv.push((key.into(), Kv::Str(value.into())));
    }

    fn u32(&mut self, key: &str, value: u32) {
        self.kv.push((key.into(), Kv::U32(value)));
    }

    fn f32(&mut self, key: &str, value: f32) {
        self.kv.push((key.into(), Kv::F32(value)));
    }

    fn bool(&mut self, key: &str, value: bool) {
        self.kv.push((key.into(), Kv::Bool(value)));
    }

    /// An F32 tensor of shape `ne` (ggml order): `center` plus uniform
    /// noise in `[-spread, spread)`.
    fn tensor(&mut self, name: &str, ne: &[u64], center: f32, spread: f32) {
        let n: u64 = ne.iter().product();
        let data = (0..n)
            .map(|_| {
                // xorshift64: deterministic weights, so runs are reproducible.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                center + spread * ((self.rng >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            })
            .collect();
        self.tensors.push((name.to_owned(), ne.to_vec(), data));
    }

    /// A weight matrix `[n_in, n_out]` with variance-preserving noise.
    fn matrix(&mut self, name: &str, n_in: u64, n_out: u64) {
        self.tensor(name, &[n_in, n_out], 0.0, (3.0 / n_in as f32).sqrt());
    }

    fn ones(&mut self, name: &str, n: u64) {
        self.tensor(name, &[n], 1.0, 0.0);
    }

    fn write(&self, path: &Path) {
        let sizes: Vec<u64> = self.tensors.iter().map(|(_, ne, _)| ne.iter().product()).collect();
        let mut w = GgufWriter::for_tensors(&sizes).unwrap();
        for (key, value) in &self.kv {
            match value {
                Kv::Str(v) => w.set_str(key, v),
                Kv::U32(v) => w.set_u32(key, *v),
                Kv::F32(v) => w.set_f32(key, *v),
                Kv::Bool(v) => w.set_bool(key, *v),
                Kv::Strs(v) => w.set_arr_str(key, v),
                Kv::F32s(v) => w.set_arr_f32(key, v),
                Kv::I32s(v) => w.set_arr_i32(key, v),
            }
            .unwrap();
        }
        for (name, ne, data) in &self.tensors {
            let ne: Vec<u32> = ne.iter().map(|&d| u32::try_from(d).unwrap()).collect();
            w.add_f32_tensor(name, &ne, data).unwrap();
        }
        w.write(path).unwrap();
    }

    fn load(&self, dir: &Path, name: &str) -> Model {
        let path = dir.join(name);
        self.write(&path);
        Model::load(&path, &ModelParams::default()).unwrap_or_else(|e| panic!("load {name}: {e}"))
    }
}

const HAND_EMBD: u64 = 16;

/// A one-layer T5 (encoder-decoder): n_embd 16, 2 heads, n_ff 32; or,
/// without `decoder`, its encoder alone (`t5encoder`).
fn tiny_t5(dir: &Path, decoder: bool) -> Model {
    let (e, ff, heads, buckets) = (HAND_EMBD, 32, 2, 8);
    let arch = if decoder { "t5" } else { "t5encoder" };
    let mut f = GgufFile::new(arch);
    let v = f.n_vocab;
    f.u32(&format!("{arch}.context_length"), 64);
    f.u32(&format!("{arch}.embedding_length"), e as u32);
    f.u32(&format!("{arch}.feed_forward_length"), ff as u32);
    f.u32(&format!("{arch}.block_count"), 1);
    f.u32(&format!("{arch}.attention.head_count"), heads as u32);
    f.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6);
    f.u32(&format!("{arch}.attention.relative_buckets_count"), buckets as u32);
    f.tensor("token_embd.weight", &[e, v], 0.0, 1.0);
    f.ones("enc.output_norm.weight", e);
    f.matrix("output.weight", e, v);
    let parts: &[&str] = if decoder {
        f.u32("t5.decoder_start_token_id", 0);
        f.ones("dec.output_norm.weight", e);
        &["enc", "dec"]
    } else {
        &["enc"]
    };
    for &part in parts {
        f.ones(&format!("{part}.blk.0.attn_norm.weight"), e);
        f.tensor(&format!("{part}.blk.0.attn_rel_b.weight"), &[heads, buckets], 0.0, 0.5);
        for m in ["attn_q", "attn_k", "attn_v", "attn_o"] {
            f.matrix(&format!("{part}.blk.0.{m}.weight"), e, e);
        }
        if part == "dec" {
            f.ones("dec.blk.0.cross_attn_norm.weight", e);
            for m in ["cross_attn_q", "cross_attn_k", "cross_attn_v", "cross_attn_o"] {
                f.matrix(&format!("dec.blk.0.{m}.weight"), e, e);
            }
        }
        f.ones(&format!("{part}.blk.0.ffn_norm.weight"), e);
        f.matrix(&format!("{part}.blk.0.ffn_up.weight"), e, ff);
        f.matrix(&format!("{part}.blk.0.ffn_down.weight"), ff, e);
    }
    f.load(dir, &format!("tiny-{arch}.gguf"))
}

/// A one-layer BERT: an embedding model without a KV cache.
fn tiny_bert(dir: &Path) -> Model {
    let (e, ff, n_ctx) = (HAND_EMBD, 32, 64);
    let mut f = GgufFile::new("bert");
    let v = f.n_vocab;
    f.u32("bert.context_length", n_ctx as u32);
    f.u32("bert.embedding_length", e as u32);
    f.u32("bert.feed_forward_length", ff as u32);
    f.u32("bert.block_count", 1);
    f.u32("bert.attention.head_count", 2);
    f.f32("bert.attention.layer_norm_epsilon", 1e-12);
    f.bool("bert.attention.causal", false);
    f.u32("tokenizer.ggml.token_type_count", 2);
    f.tensor("token_embd.weight", &[e, v], 0.0, 1.0);
    f.tensor("position_embd.weight", &[e, n_ctx], 0.0, 0.1);
    f.ones("token_embd_norm.weight", e);
    f.tensor("token_embd_norm.bias", &[e], 0.0, 0.0);
    for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
        f.matrix(&format!("blk.0.{m}.weight"), e, e);
    }
    for norm in ["attn_output_norm", "layer_output_norm"] {
        f.ones(&format!("blk.0.{norm}.weight"), e);
        f.tensor(&format!("blk.0.{norm}.bias"), &[e], 0.0, 0.0);
    }
    f.matrix("blk.0.ffn_up.weight", e, ff);
    f.matrix("blk.0.ffn_down.weight", ff, e);
    f.load(dir, "tiny-bert.gguf")
}

/// Decoding a T5 model before encoding aborts in llama.cpp
/// (`GGML_ASSERT(!cross->seq_ids_enc.empty() && "llama_encode must be called
/// first")`); the wrapper refuses. The encoder output lives in the context,
/// so clearing the KV cache keeps it.
#[test]
fn an_encoder_decoder_model_decodes_only_after_encoding() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), true);
        assert!(model.has_encoder() && model.has_decoder());
        let start = model.decoder_start_token().expect("decoder start token");
        let n_vocab = model.vocab().n_tokens();
        let mut ctx = model.new_context(&small_params()).unwrap();
        let input = [Token(260), Token(261), Token(262), Token(TINY_EOS_ID)];
        let first_step = Batch::from_tokens(&[start], 0);

        let err = ctx.decode(&first_step).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("encode")), "{err:?}");
        assert_eq!(ctx.seq_pos_max(0).unwrap(), None);

        ctx.encode(&Batch::from_tokens(&input, 0)).unwrap();
        // The encoder computes no logits (the rows llama.cpp would hand out
        // were never written), and embeddings are off.
        for i in [Output::Index(0), Output::Index(3), Output::Last, Output::Index(4)] {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(_))), "logits({i}) after encode");
            assert!(matches!(ctx.embeddings(i), Err(Error::NoOutput(_))), "embeddings({i}) after encode");
        }

        ctx.decode(&first_step).unwrap();
        let logits = ctx.logits(Output::Last).unwrap().to_vec();
        assert_eq!(logits.len(), n_vocab);
        assert!(logits.iter().all(|x| x.is_finite()));
        assert!(logits.iter().any(|&x| x != logits[0]), "a real row, not a zeroed buffer");
        let next = Token(argmax(&logits) as i32);
        let mut step = Batch::new(1, 1);
        step.push(next, 1, &[0], Logits::Yes).unwrap();
        ctx.decode(&step).unwrap();
        let second = ctx.logits(Output::Index(0)).unwrap().to_vec();

        // Clearing the KV cache keeps the encoder output: decoding again gives
        // the same logits.
        ctx.clear_kv();
        ctx.decode(&first_step).unwrap();
        assert_eq!(ctx.logits(Output::Last).unwrap(), &logits[..]);
        ctx.decode(&step).unwrap();
        assert_eq!(ctx.logits(Output::Index(0)).unwrap(), &second[..]);

        // A new input: clear the decoder's cache (llama.cpp checks even the
        // encoder's positions against it), encode, and decode from the start.
        ctx.clear_kv();
        ctx.encode(&Batch::from_tokens(&[Token(265), Token(266), Token(TINY_EOS_ID)], 0)).unwrap();
        ctx.decode(&first_step).unwrap();
        assert_ne!(ctx.logits(Output::Last).unwrap(), &logits[..]);

        // With embeddings on, the encoder's per-token output can be read.
        let mut emb = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        emb.encode(&Batch::from_tokens(&input, 0)).unwrap();
        for i in 0..input.len() {
            let row = emb.embeddings(i).unwrap();
            assert_eq!(row.len(), model.n_embd_out());
            assert!(row.iter().all(|x| x.is_finite()));
        }
        let last_row = emb.embeddings(input.len() - 1).unwrap().to_vec();
        assert_eq!(emb.embeddings(Output::Last).unwrap(), &last_row[..]);
        assert!(matches!(emb.logits(Output::Index(0)), Err(Error::NoOutput(Output::Index(0)))));
    });
}

/// An encoder-only T5 has no cross-attention: it decodes without encoding
/// first (llama.cpp runs its encoder graph), and computes no logits.
#[test]
fn an_encoder_only_model_needs_no_encode_first() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), false);
        assert!(model.has_encoder() && !model.has_decoder());
        let input = [Token(260), Token(261), Token(262), Token(TINY_EOS_ID)];
        let mut ctx = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        ctx.encode(&Batch::from_tokens(&input, 0)).unwrap();
        let encoded: Vec<Vec<f32>> = (0..4usize).map(|i| ctx.embeddings(i).unwrap().to_vec()).collect();
        assert!(encoded.iter().all(|r| r.len() == model.n_embd_out() && r.iter().all(|x| x.is_finite())));
        assert!(matches!(ctx.logits(Output::Index(3)), Err(Error::NoOutput(Output::Index(3)))));

        // (The encoder attends both ways only in a non-causal context.)
        let params = small_params().embeddings(true).pooling(Pooling::None).attention(llamacpp::Attention::NonCausal);
        let mut ctx = model.new_context(&params).unwrap();
        ctx.decode(&Batch::from_tokens(&input, 0)).unwrap();
        assert!(matches!(ctx.logits(Output::Last), Err(Error::NoOutput(_))), "the encoder graph computes no logits");
        for (i, row) in encoded.iter().enumerate() {
            assert_same_logits(
                row,
                ctx.embeddings(Output::Index(i)).unwrap(),
                "decode = encode for an encoder-only model",
            );
        }
    });
}

/// T5's cross-attention aborts (`GGML_ASSERT(!ubatch->equal_seqs())`) on a
/// cache with one stream per sequence; several sequences need kv_unified.
#[test]
fn an_encoder_decoder_model_needs_a_unified_cache_for_several_sequences() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_t5(dir.path(), true);
        let err = model.new_context(&small_params().n_ctx(512).n_seq_max(2)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("kv_unified")), "{err:?}");

        let mut ctx = model.new_context(&small_params().n_ctx(512).n_seq_max(2).kv_unified(true)).unwrap();
        let start = model.decoder_start_token().unwrap();
        let mut input = Batch::new(8, 1);
        input.push_sequence(&[Token(260), Token(261), Token(TINY_EOS_ID)], 0, 0, Logits::from(false)).unwrap();
        input.push_sequence(&[Token(262), Token(TINY_EOS_ID)], 0, 1, Logits::from(false)).unwrap();
        ctx.encode(&input).unwrap();
        let mut both = Batch::new(2, 1);
        both.push(start, 0, &[0], Logits::Yes).unwrap();
        both.push(start, 0, &[1], Logits::Yes).unwrap();
        ctx.decode(&both).unwrap();
        let (a, b) = (ctx.logits(0).unwrap().to_vec(), ctx.logits(1).unwrap().to_vec());
        assert_ne!(a, b, "each sequence attends to its own encoder input");
    });
}

/// Without a KV cache, llama.cpp runs `decode` as `encode`: every token is
/// an output and no logits are computed, whatever the batch asked for.
#[test]
fn a_model_without_a_cache_decodes_through_the_encoder() {
    isolated(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_bert(dir.path());
        let input = [Token(TINY_BOS_ID), Token(260), Token(261), Token(262)];

        let mut ctx = model.new_context(&small_params()).unwrap();
        ctx.decode(&Batch::from_tokens(&input, 0)).unwrap();
        for i in [Output::Index(0), Output::Index(3), Output::Last] {
            assert!(matches!(ctx.logits(i), Err(Error::NoOutput(_))), "logits({i}) of an embedding model");
        }

        let mut emb = model.new_context(&small_params().embeddings(true).pooling(Pooling::None)).unwrap();
        // Logits asked for the last token only, yet every token is an output.
        emb.decode(&Batch::from_tokens(&input, 0)).unwrap();
        let rows: Vec<Vec<f32>> = (0..4usize).map(|i| emb.embeddings(i).unwrap().to_vec()).collect();
        assert!(rows.iter().all(|r| r.len() == model.n_embd_out() && r.iter().all(|x| x.is_finite())));
        assert_ne!(rows[0], rows[1]);
        assert_eq!(emb.embeddings(Output::Last).unwrap(), &rows[3][..]);
        assert!(matches!(emb.embeddings(Output::Index(4)), Err(Error::NoOutput(Output::Index(4)))));
        assert!(matches!(emb.logits(Output::Index(3)), Err(Error::NoOutput(Output::Index(3)))));
        // `encode` is the same pass.
        emb.encode(&Batch::from_tokens(&input, 0)).unwrap();
        assert_eq!(emb.embeddings(Output::Index(2)).unwrap(), &rows[2][..]);
    });
}
