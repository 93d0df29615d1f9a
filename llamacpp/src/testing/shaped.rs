//! Synthetic models of real sizes (Llama 3.2 1B, Llama 3.1 8B) for speed
//! and memory measurements: the shapes, vocabulary size and quantization
//! layout of the real models, random weights. What a GPU kernel costs
//! depends on the shapes and types, not on the values, and a machine
//! without network can write one in seconds.

use super::*;

/// The shape of a llama-architecture model of real size, written by
/// [`write_shaped_llama`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapedSpec {
    /// A name for the file's `general.name` and reports.
    pub name: &'static str,
    /// Transformer blocks.
    pub n_layer: u32,
    /// Embedding (hidden) size.
    pub n_embd: u32,
    /// Attention (query) heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Feed-forward inner size.
    pub n_ff: u32,
    /// Tokens in the vocabulary.
    pub n_vocab: u32,
    /// Training context length written to the metadata.
    pub n_ctx_train: u32,
    /// RoPE base frequency.
    pub rope_freq_base: f32,
    /// The output projection is the token embedding (no `output.weight`).
    pub tied_embeddings: bool,
}

impl ShapedSpec {
    /// Llama 3.2 1B's shape (tied embeddings).
    pub const LLAMA_3_2_1B: ShapedSpec = ShapedSpec {
        name: "llama-3.2-1b-shaped",
        n_layer: 16,
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 8192,
        n_vocab: 128_256,
        n_ctx_train: 131_072,
        rope_freq_base: 500_000.0,
        tied_embeddings: true,
    };

    /// Llama 3.1 8B's shape.
    pub const LLAMA_3_1_8B: ShapedSpec = ShapedSpec {
        name: "llama-3.1-8b-shaped",
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14_336,
        n_vocab: 128_256,
        n_ctx_train: 131_072,
        rope_freq_base: 500_000.0,
        tied_embeddings: false,
    };

    /// The spec named `name` (`llama-3.2-1b`, `llama-3.1-8b`, or with
    /// `-shaped`).
    pub fn named(name: &str) -> Option<ShapedSpec> {
        [Self::LLAMA_3_2_1B, Self::LLAMA_3_1_8B]
            .into_iter()
            .find(|s| s.name == name || s.name.strip_suffix("-shaped") == Some(name))
    }

    /// Weights (parameters) of the model: 1,235,814,400 for the 1B
    /// shape and 8,030,261,248 for the 8B one, as the real models have.
    pub fn n_params(&self) -> u64 {
        self.tensors().iter().map(|(_, ne, _)| ne.iter().map(|&d| u64::from(d)).product::<u64>()).sum()
    }

    /// The tensors in Q4_K_M's layout: the token embedding, attention
    /// and gate/up projections in Q4_K; the output projection (or the
    /// tied embedding) in Q6_K; `attn_v` and `ffn_down` in Q6_K on the
    /// layers llama.cpp's Q4_K_M gives more bits (the first and last
    /// eighth and every third between), else Q4_K; norms in F32.
    fn tensors(&self) -> Vec<(String, Vec<u32>, sys::ggml_type::Type)> {
        use sys::ggml_type::{GGML_TYPE_F32 as F32, GGML_TYPE_Q4_K as Q4K, GGML_TYPE_Q6_K as Q6K};
        let (embd, ff, vocab) = (self.n_embd, self.n_ff, self.n_vocab);
        let embd_kv = embd / self.n_head * self.n_head_kv;
        let mut out =
            vec![("token_embd.weight".to_owned(), vec![embd, vocab], if self.tied_embeddings { Q6K } else { Q4K })];
        let n = self.n_layer;
        let more_bits = |i: u32| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        for i in 0..n {
            let wide = if more_bits(i) { Q6K } else { Q4K };
            let t = |name: &str| format!("blk.{i}.{name}.weight");
            out.extend([
                (t("attn_norm"), vec![embd], F32),
                (t("attn_q"), vec![embd, embd], Q4K),
                (t("attn_k"), vec![embd, embd_kv], Q4K),
                (t("attn_v"), vec![embd, embd_kv], wide),
                (t("attn_output"), vec![embd, embd], Q4K),
                (t("ffn_norm"), vec![embd], F32),
                (t("ffn_gate"), vec![embd, ff], Q4K),
                (t("ffn_up"), vec![embd, ff], Q4K),
                (t("ffn_down"), vec![ff, embd], wide),
            ]);
        }
        out.push(("output_norm.weight".to_owned(), vec![embd], F32));
        if !self.tied_embeddings {
            out.push(("output.weight".to_owned(), vec![embd, vocab], Q6K));
        }
        out
    }
}

/// Writes a llama-architecture model of `spec`'s shape in Q4_K_M's
/// layout with random quantized weights (seeded: the same spec gives the
/// same bytes) to `path`, through a temporary file renamed into place.
/// The vocabulary is the tiny models' (so text tokenizes) padded with
/// normal tokens to `n_vocab`. It holds the whole file in memory while
/// writing (4.6 GiB for the 8B shape).
///
/// # Errors
/// For a shape whose rows are not whole 256-element blocks, or whose
/// heads do not divide the width; the I/O errors of writing.
pub fn write_shaped_llama(path: &Path, spec: &ShapedSpec) -> io::Result<()> {
    if !spec.n_embd.is_multiple_of(256)
        || !spec.n_ff.is_multiple_of(256)
        || spec.n_head == 0
        || !spec.n_embd.is_multiple_of(spec.n_head)
    {
        return Err(invalid_input(format!(
            "{}: rows must be whole Q4_K blocks of 256 and heads divide n_embd",
            spec.name
        )));
    }
    if spec.n_head_kv == 0 || !spec.n_head.is_multiple_of(spec.n_head_kv) || (spec.n_vocab as usize) < TINY_VOCAB_SIZE {
        return Err(invalid_input(format!("{}: n_head_kv must divide n_head; n_vocab ≥ {TINY_VOCAB_SIZE}", spec.name)));
    }
    let tensors = spec.tensors();
    let mut mem_size = 0usize;
    for (_, ne, ty) in &tensors {
        // SAFETY: plain reads of ggml's type traits for valid types.
        let row = unsafe { sys::ggml_row_size(*ty, i64::from(ne[0])) };
        let bytes = ne[1..].iter().fold(row, |acc, &d| acc * d as usize);
        mem_size += GgufWriter::pool_bytes(bytes);
    }
    let mut w = GgufWriter::new(mem_size)?;
    let key = |k: &str| format!("llama.{k}");
    w.set_str("general.architecture", "llama")?;
    w.set_str("general.name", spec.name)?;
    w.set_u32("general.file_type", sys::llama_ftype::LLAMA_FTYPE_MOSTLY_Q4_K_M)?;
    w.set_u32(&key("vocab_size"), spec.n_vocab)?;
    w.set_u32(&key("context_length"), spec.n_ctx_train)?;
    w.set_u32(&key("embedding_length"), spec.n_embd)?;
    w.set_u32(&key("block_count"), spec.n_layer)?;
    w.set_u32(&key("feed_forward_length"), spec.n_ff)?;
    w.set_u32(&key("attention.head_count"), spec.n_head)?;
    w.set_u32(&key("attention.head_count_kv"), spec.n_head_kv)?;
    w.set_u32(&key("rope.dimension_count"), spec.n_embd / spec.n_head)?;
    w.set_f32(&key("rope.freq_base"), spec.rope_freq_base)?;
    w.set_f32(&key("attention.layer_norm_rms_epsilon"), RMS_EPS)?;

    let mut vocab = tiny_vocab();
    for i in vocab.texts.len()..spec.n_vocab as usize {
        vocab.texts.push(format!("<pad{i}>"));
        vocab.scores.push(-1e6);
        vocab.types.push(sys::llama_token_type::LLAMA_TOKEN_TYPE_NORMAL as i32);
    }
    w.set_str("tokenizer.ggml.model", "llama")?;
    w.set_arr_str("tokenizer.ggml.tokens", &vocab.texts)?;
    w.set_arr_f32("tokenizer.ggml.scores", &vocab.scores)?;
    w.set_arr_i32("tokenizer.ggml.token_type", &vocab.types)?;
    w.set_u32("tokenizer.ggml.bos_token_id", TINY_BOS_ID as u32)?;
    w.set_u32("tokenizer.ggml.eos_token_id", TINY_EOS_ID as u32)?;
    w.set_u32("tokenizer.ggml.unknown_token_id", TINY_UNK_ID as u32)?;
    w.set_bool("tokenizer.ggml.add_bos_token", true)?;
    w.set_bool("tokenizer.ggml.add_space_prefix", true)?;

    for (name, ne, ty) in &tensors {
        let mut h = Fnv1a::new();
        h.write(spec.name.as_bytes());
        h.write(name.as_bytes());
        let mut rng = SplitMix64(h.finish());
        w.add_tensor_with(name, ne, *ty, |data| fill_blocks(data, *ty, &mut rng))?;
    }

    write_atomically(path, |tmp| w.write(tmp))
}

/// Random quantized blocks whose weights stay small and finite: random
/// bytes, then each block's f16 scales set to a small constant (Q4_K:
/// `d` and `dmin`, the first 4 bytes of 144; Q6_K: `d`, the last 2 of
/// 210, with 6-bit values and 8-bit sub-scales that then give weights
/// within ±0.25); F32 (norms) all ones.
fn fill_blocks(data: &mut [u8], ty: sys::ggml_type::Type, rng: &mut SplitMix64) {
    use sys::ggml_type::{GGML_TYPE_Q4_K as Q4K, GGML_TYPE_Q6_K as Q6K};
    if ty == sys::ggml_type::GGML_TYPE_F32 {
        for chunk in data.chunks_exact_mut(4) {
            chunk.copy_from_slice(&1.0f32.to_ne_bytes());
        }
        return;
    }
    for chunk in data.chunks_mut(8) {
        let bytes = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    // f16 2^-12 and 2^-14.
    let (q4_scale, q6_scale) = (0x0c00u16.to_le_bytes(), 0x0400u16.to_le_bytes());
    match ty {
        Q4K => {
            for block in data.chunks_exact_mut(144) {
                block[0..2].copy_from_slice(&q4_scale);
                block[2..4].copy_from_slice(&q4_scale);
            }
        }
        Q6K => {
            for block in data.chunks_exact_mut(210) {
                block[208..210].copy_from_slice(&q6_scale);
            }
        }
        _ => {}
    }
}
