//! Tiny synthetic multimodal projectors (`mmproj` GGUF) for libmtmd
//! (feature `mtmd`): a vision transformer of a few patches with random
//! weights and one of two widely used projector heads, whose output width
//! is a text model's input width.

use std::io;
use std::path::{Path, PathBuf};

use std::sync::{Mutex, PoisonError};

use super::tensors::{Fnv1a, Init, TensorDef, he_bound};
use super::writer::GgufWriter;
use super::{GENERATOR_VERSION, invalid_input, is_complete_gguf, write_atomically};

/// The projector head of a [`ProjectorSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProjectorKind {
    /// LLaVA-1.5's (`mlp`): a CLIP vision transformer whose second-to-last
    /// layer feeds a two-layer MLP; one token per patch; the image's tokens
    /// are decoded causally like text.
    Mlp,
    /// Gemma 3's (`gemma3`): a SigLIP vision transformer, average pooling
    /// of the patch grid by `merge`, an RMS norm and a projection; the text
    /// model attends to an image's tokens all at once (non-causal), and
    /// libmtmd puts `<start_of_image>` / `<end_of_image>` around them.
    Gemma3 {
        /// The pooling kernel (`clip.vision.projector.scale_factor`).
        merge: u32,
    },
}

/// The shape and seed of a tiny synthetic projector.
///
/// Constraints (checked by [`write_tiny_projector`]): `patch_size`
/// divides `image_size`; `n_head` divides `n_embd`; `n_ff ≠ n_embd`
/// (libmtmd swaps the feed-forward matrices of old files whose sizes say
/// so); for Gemma 3, `merge` divides the patches per side; `n_layer ≥ 1`
/// (≥ 2 for `Mlp`, whose last layer does not run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProjectorSpec {
    /// The projector head.
    pub kind: ProjectorKind,
    /// The output width: the text model's input width (`n_embd`).
    pub n_embd_text: u32,
    /// Every image is resized (letterboxed) to this square.
    pub image_size: u32,
    /// The side of a patch, in pixels.
    pub patch_size: u32,
    /// The vision transformer's width.
    pub n_embd: u32,
    /// Its feed-forward width.
    pub n_ff: u32,
    /// Its layers.
    pub n_layer: u32,
    /// Its attention heads.
    pub n_head: u32,
    /// Seed of the weights; the same spec gives a byte-identical file.
    pub seed: u64,
}

impl ProjectorSpec {
    /// An LLaVA-style projector for a text model of width `n_embd_text`:
    /// 16×16 images in 8×8 patches (4 tokens per image), width 64, two
    /// layers (one runs).
    pub fn mlp(n_embd_text: u32) -> ProjectorSpec {
        ProjectorSpec {
            kind: ProjectorKind::Mlp,
            n_embd_text,
            image_size: 16,
            patch_size: 8,
            n_embd: 64,
            n_ff: 128,
            n_layer: 2,
            n_head: 2,
            seed: 7,
        }
    }

    /// A Gemma-3-style projector for a text model of width `n_embd_text`:
    /// 32×32 images in 8×8 patches pooled 2×2 (4 tokens per image), width
    /// 64, one layer.
    pub fn gemma3(n_embd_text: u32) -> ProjectorSpec {
        ProjectorSpec {
            kind: ProjectorKind::Gemma3 { merge: 2 },
            n_embd_text,
            image_size: 32,
            patch_size: 8,
            n_embd: 64,
            n_ff: 128,
            n_layer: 1,
            n_head: 2,
            seed: 7,
        }
    }

    /// Gemma 3's vision tower at its real shape (SigLIP-so400m: 896×896
    /// images in 14×14 patches, width 1152, feed-forward 4304, 27 layers,
    /// 16 heads; 256 tokens per image after 4×4 pooling), with random
    /// weights, all F32 (about 1.7 GB): for measuring what one image
    /// costs, which depends on the shapes, not the values.
    pub fn gemma3_siglip(n_embd_text: u32) -> ProjectorSpec {
        ProjectorSpec {
            kind: ProjectorKind::Gemma3 { merge: 4 },
            n_embd_text,
            image_size: 896,
            patch_size: 14,
            n_embd: 1152,
            n_ff: 4304,
            n_layer: 27,
            n_head: 16,
            seed: 7,
        }
    }

    /// The tokens one image becomes.
    pub fn n_image_tokens(&self) -> usize {
        let side = (self.image_size / self.patch_size.max(1)) as usize;
        match self.kind {
            ProjectorKind::Mlp => side * side,
            ProjectorKind::Gemma3 { merge } => (side / merge.max(1) as usize).pow(2),
        }
    }

    pub(super) fn validate(&self) -> io::Result<()> {
        let side = self.image_size.checked_div(self.patch_size).unwrap_or(0);
        let ok = self.patch_size > 0
            && self.image_size.is_multiple_of(self.patch_size)
            && side > 0
            && self.n_embd > 0
            && self.n_embd_text > 0
            && self.n_head > 0
            && self.n_embd.is_multiple_of(self.n_head)
            && self.n_ff > 0
            && self.n_ff != self.n_embd
            && self.image_size <= 1024
            && self.n_layer >= if self.kind == ProjectorKind::Mlp { 2 } else { 1 }
            && match self.kind {
                ProjectorKind::Mlp => true,
                ProjectorKind::Gemma3 { merge } => merge > 0 && side.is_multiple_of(merge),
            };
        if ok { Ok(()) } else { Err(invalid_input(format!("projector spec breaks its constraints: {self:?}"))) }
    }

    pub(super) fn tensors(&self) -> Vec<TensorDef> {
        let (e, f, p) = (self.n_embd, self.n_ff, self.patch_size);
        let n_patches = (self.image_size / p).pow(2);
        let def = |name: String, ne: &[u32], init| TensorDef { name, ne: ne.to_vec(), init };
        let mut t = vec![
            def("v.patch_embd.weight".into(), &[p, p, 3, e], Init::Uniform(he_bound(p * p * 3))),
            def("v.position_embd.weight".into(), &[e, n_patches], Init::Uniform(0.1)),
        ];
        for il in 0..self.n_layer {
            let blk = |s: &str| format!("v.blk.{il}.{s}");
            for norm in ["ln1", "ln2"] {
                t.push(def(blk(&format!("{norm}.weight")), &[e], Init::Ones));
                t.push(def(blk(&format!("{norm}.bias")), &[e], Init::Const(0.0)));
            }
            for proj in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                t.push(def(blk(&format!("{proj}.weight")), &[e, e], Init::Uniform(he_bound(e))));
            }
            t.push(def(blk("ffn_up.weight"), &[e, f], Init::Uniform(he_bound(e))));
            t.push(def(blk("ffn_down.weight"), &[f, e], Init::Uniform(he_bound(f))));
        }
        let n = self.n_embd_text;
        match self.kind {
            ProjectorKind::Mlp => {
                t.push(def("mm.0.weight".into(), &[e, n], Init::Uniform(he_bound(e))));
                t.push(def("mm.0.bias".into(), &[n], Init::Uniform(0.1)));
                t.push(def("mm.2.weight".into(), &[n, n], Init::Uniform(he_bound(n))));
                t.push(def("mm.2.bias".into(), &[n], Init::Uniform(0.1)));
            }
            ProjectorKind::Gemma3 { .. } => {
                t.push(def("mm.soft_emb_norm.weight".into(), &[e], Init::Ones));
                t.push(def("mm.input_projection.weight".into(), &[n, e], Init::Uniform(he_bound(e))));
            }
        }
        t
    }
}

/// Writes the tiny projector of `spec` to `path` (all F32), as
/// [`write_tiny_llama`](super::write_tiny_llama) writes: to a temporary
/// file renamed into place.
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] for a spec that breaks the constraints
/// of [`ProjectorSpec`]; otherwise the I/O error.
pub fn write_tiny_projector(path: &Path, spec: &ProjectorSpec) -> io::Result<()> {
    spec.validate()?;
    write_atomically(path, |tmp| write(tmp, spec))
}

fn write(path: &Path, spec: &ProjectorSpec) -> io::Result<()> {
    let tensors = spec.tensors();
    let counts: Vec<u64> = tensors.iter().map(|t| t.n_elements().unwrap_or(0)).collect();
    let mut w = GgufWriter::for_tensors(&counts)?;
    let (projector_type, eps, gelu) = match spec.kind {
        ProjectorKind::Mlp => ("mlp", 1e-5, false),
        ProjectorKind::Gemma3 { .. } => ("gemma3", 1e-6, true),
    };
    // libmtmd reads each key with its exact type (a wrong one aborts).
    w.set_str("general.architecture", "clip")?;
    w.set_str("general.name", &format!("llama-rs tiny synthetic {projector_type} projector"))?;
    w.set_str("clip.projector_type", projector_type)?;
    w.set_bool("clip.has_vision_encoder", true)?;
    w.set_bool("clip.use_gelu", gelu)?;
    w.set_u32("clip.vision.image_size", spec.image_size)?;
    w.set_u32("clip.vision.patch_size", spec.patch_size)?;
    w.set_u32("clip.vision.embedding_length", spec.n_embd)?;
    w.set_u32("clip.vision.feed_forward_length", spec.n_ff)?;
    w.set_u32("clip.vision.block_count", spec.n_layer)?;
    w.set_u32("clip.vision.attention.head_count", spec.n_head)?;
    w.set_u32("clip.vision.projection_dim", spec.n_embd_text)?;
    w.set_f32("clip.vision.attention.layer_norm_epsilon", eps)?;
    w.set_arr_f32("clip.vision.image_mean", &[0.5, 0.5, 0.5])?;
    w.set_arr_f32("clip.vision.image_std", &[0.5, 0.5, 0.5])?;
    if let ProjectorKind::Gemma3 { merge } = spec.kind {
        w.set_u32("clip.vision.projector.scale_factor", merge)?;
    }
    for t in &tensors {
        w.add_f32_tensor(&t.name, &t.ne, &t.values(spec.seed))?;
    }
    w.write(path)
}

/// The path of the tiny projector of `spec`, written on first use into
/// the folder of [`tiny_llama_path`](super::tiny_llama_path)'s models.
///
/// # Errors
/// As [`write_tiny_projector`], plus the error of creating the folder.
pub fn tiny_projector_path(spec: &ProjectorSpec) -> io::Result<PathBuf> {
    /// Keeps threads of one process from writing the same file twice.
    static GENERATE: Mutex<()> = Mutex::new(());

    spec.validate()?;
    let dir = std::env::temp_dir().join("llama-rs-tiny");
    std::fs::create_dir_all(&dir)?;
    let mut h = Fnv1a::new();
    h.write(b"llama-rs tiny projector ");
    h.write(&GENERATOR_VERSION.to_le_bytes());
    h.write(format!("{spec:?}").as_bytes());
    let path = dir.join(format!("tiny-mmproj-{:016x}.gguf", h.finish()));
    if is_complete_gguf(&path) {
        return Ok(path);
    }
    let _guard = GENERATE.lock().unwrap_or_else(PoisonError::into_inner);
    if is_complete_gguf(&path) {
        return Ok(path);
    }
    match write_tiny_projector(&path, spec) {
        Ok(()) => Ok(path),
        // Another process may have won the race (see `tiny_llama_path`).
        Err(_) if is_complete_gguf(&path) => Ok(path),
        Err(e) => Err(e),
    }
}
