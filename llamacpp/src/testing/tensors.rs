//! The tensors of the tiny models and the PRNG their values come from.

use super::*;

/// 64-bit FNV-1a: small, stable across processes and Rust versions.
pub(super) struct Fnv1a(pub(super) u64);

impl Fnv1a {
    pub(super) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(super) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(super) fn finish(&self) -> u64 {
        self.0
    }
}

/// SplitMix64: a tiny, well-mixed PRNG; deterministic across platforms.
pub(super) struct SplitMix64(pub(super) u64);

impl SplitMix64 {
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), exactly representable (24 random bits).
    pub(super) fn next_signed_unit(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) as u32; // 24 bits
        (bits as f32 / (1u32 << 23) as f32) - 1.0
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy)]
pub(super) enum Init {
    /// All ones (norm weights).
    Ones,
    /// Uniform in [-a, a).
    Uniform(f32),
    /// Every value the same.
    Const(f32),
}

/// One weight tensor of the model: name, ggml shape (`ne[0]` is the row
/// length, i.e. the input size of a matrix) and initialisation.
pub(super) struct TensorDef {
    pub(super) name: String,
    pub(super) ne: Vec<u32>,
    pub(super) init: Init,
}

impl TensorDef {
    pub(super) fn n_elements(&self) -> Option<u64> {
        self.ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)))
    }

    /// The tensor's values: a PRNG stream seeded by the model seed and the
    /// tensor name, so tensors are independent of each other and of order.
    pub(super) fn values(&self, seed: u64) -> Vec<f32> {
        let n = self.n_elements().unwrap_or(0) as usize;
        match self.init {
            Init::Ones => vec![1.0; n],
            Init::Const(c) => vec![c; n],
            Init::Uniform(a) => {
                let mut h = Fnv1a::new();
                h.write(self.name.as_bytes());
                let mut rng = SplitMix64(seed ^ h.finish());
                (0..n).map(|_| a * rng.next_signed_unit()).collect()
            }
        }
    }
}

/// Uniform bound that gives standard deviation `1/sqrt(fan_in)`.
pub(super) fn he_bound(fan_in: u32) -> f32 {
    (3.0 / fan_in as f32).sqrt()
}

/// The token embedding, output norm and output projection every model has.
pub(super) fn embedding_and_output(n_embd: u32) -> Vec<TensorDef> {
    let n_vocab = TINY_VOCAB_SIZE as u32;
    let def = |name: &str, ne: &[u32], init| TensorDef { name: name.into(), ne: ne.to_vec(), init };
    vec![
        def("token_embd.weight", &[n_embd, n_vocab], Init::Uniform(1.0)),
        def("output_norm.weight", &[n_embd], Init::Ones),
        def("output.weight", &[n_embd, n_vocab], Init::Uniform(OUTPUT_GAIN * he_bound(n_embd))),
    ]
}

/// The tensors of a llama model, in the order `convert_hf_to_gguf.py`
/// writes them. Shapes follow `llama_model_llama::load_arch_tensors`.
pub(super) fn tensor_plan(spec: &TinyModelSpec) -> Vec<TensorDef> {
    let n_embd = spec.n_embd;
    let head = spec.n_embd / spec.n_head.max(1);
    let n_embd_kv = head * spec.n_head_kv;
    let def = |name: String, ne: &[u32], init| TensorDef { name, ne: ne.to_vec(), init };

    let mut plan = embedding_and_output(n_embd);
    for i in 0..spec.n_layer {
        let blk = |t: &str| format!("blk.{i}.{t}.weight");
        let wide = Init::Uniform(he_bound(n_embd));
        plan.extend([
            def(blk("attn_norm"), &[n_embd], Init::Ones),
            def(blk("attn_q"), &[n_embd, n_embd], wide),
            def(blk("attn_k"), &[n_embd, n_embd_kv], wide),
            def(blk("attn_v"), &[n_embd, n_embd_kv], wide),
            def(blk("attn_output"), &[n_embd, n_embd], wide),
            def(blk("ffn_norm"), &[n_embd], Init::Ones),
            def(blk("ffn_gate"), &[n_embd, spec.n_ff], wide),
            def(blk("ffn_down"), &[spec.n_ff, n_embd], Init::Uniform(he_bound(spec.n_ff))),
            def(blk("ffn_up"), &[n_embd, spec.n_ff], wide),
        ]);
    }
    plan
}

/// Mamba's state-space sizes (see [`write_tiny_mamba`]).
pub(super) const MAMBA_D_CONV: u32 = 4;
pub(super) const MAMBA_D_STATE: u32 = 8;
pub(super) const MAMBA_DT_RANK: u32 = 4;

/// The tensors of a Mamba model; shapes follow
/// `llama_model_mamba::load_arch_tensors`.
pub(super) fn mamba_tensor_plan(spec: &TinyModelSpec) -> Vec<TensorDef> {
    let n_embd = spec.n_embd;
    let d_inner = 2 * n_embd;
    let def = |name: String, ne: &[u32], init| TensorDef { name, ne: ne.to_vec(), init };
    let mut plan = embedding_and_output(n_embd);
    for i in 0..spec.n_layer {
        let blk = |t: &str| format!("blk.{i}.{t}");
        plan.extend([
            def(blk("attn_norm.weight"), &[n_embd], Init::Ones),
            def(blk("ssm_in.weight"), &[n_embd, 2 * d_inner], Init::Uniform(he_bound(n_embd))),
            def(blk("ssm_conv1d.weight"), &[MAMBA_D_CONV, d_inner], Init::Uniform(he_bound(MAMBA_D_CONV))),
            def(blk("ssm_conv1d.bias"), &[d_inner], Init::Uniform(0.1)),
            def(blk("ssm_x.weight"), &[d_inner, MAMBA_DT_RANK + 2 * MAMBA_D_STATE], Init::Uniform(he_bound(d_inner))),
            def(blk("ssm_dt.weight"), &[MAMBA_DT_RANK, d_inner], Init::Uniform(he_bound(MAMBA_DT_RANK))),
            def(blk("ssm_dt.bias"), &[d_inner], Init::Uniform(0.1)),
            // A = -exp(A_log) < 0 keeps the recurrence stable.
            def(blk("ssm_a"), &[MAMBA_D_STATE, d_inner], Init::Const(-1.0)),
            def(blk("ssm_d"), &[d_inner], Init::Ones),
            def(blk("ssm_out.weight"), &[d_inner, n_embd], Init::Uniform(he_bound(d_inner))),
        ]);
    }
    plan
}

/// The full vocabulary: texts, scores and `llama_token_type`s.
pub(super) struct Vocab {
    pub(super) texts: Vec<String>,
    pub(super) scores: Vec<f32>,
    pub(super) types: Vec<i32>,
}
