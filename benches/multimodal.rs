//! Criterion benchmarks of one image through `llamacpp::mtmd` on the tiny
//! synthetic model (`n_embd` 64) with the tiny synthetic projectors of
//! `llamacpp::testing` (LLaVA's `mlp` head: 16×16 images, 4 tokens;
//! Gemma 3's: 32×32 images pooled to 4 tokens), one thread:
//!
//! - `image/{mlp,gemma3}/eval`: a prompt of text, one image and text,
//!   tokenized, its image encoded and every chunk decoded into a cleared
//!   context (what one image costs end to end);
//! - `image/{mlp,gemma3}/tokenize`: the preprocessing alone (resize and
//!   normalize into the projector's input);
//! - `image/decode_jpeg`: `Media::from_bytes` of libmtmd's test photo
//!   (`tools/mtmd/test-1.jpeg`, 124,071 bytes), decoded and hashed.
//!
//! What a real projector costs depends on its vision tower (hundreds of
//! millions of parameters, hundreds of tokens per image); these measure
//! the pipeline's own overhead.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use llama_suite::synthetic::{ProjectorSpec, TinyModelSpec, tiny_llama_path, tiny_projector_path};
use llamacpp::mtmd::{Media, Projector, ProjectorParams};
use llamacpp::{AddBos, ContextParams, Model, ModelParams, Special};

fn bench(c: &mut Criterion) {
    let spec = TinyModelSpec::default();
    let model = Model::load(tiny_llama_path(&spec).unwrap(), &ModelParams::default()).unwrap();
    let mut group = c.benchmark_group("image");
    for (name, projector_spec) in
        [("mlp", ProjectorSpec::mlp(spec.n_embd)), ("gemma3", ProjectorSpec::gemma3(spec.n_embd))]
    {
        let path = tiny_projector_path(&projector_spec).unwrap();
        let mut projector = Projector::load(&model, path, &ProjectorParams::default().n_threads(1)).unwrap();
        let side = projector_spec.image_size;
        let rgb: Vec<u8> = (0..side * side * 3).map(|i| (i * 7 % 251) as u8).collect();
        let image = Media::image_rgb(side, side, &rgb).unwrap();
        let text = format!("Describe {} briefly.", projector.marker());
        let params = ContextParams::default().n_ctx(256).n_batch(64).n_ubatch(64).n_threads(1).n_threads_batch(1);
        let mut ctx = model.new_context(&params).unwrap();
        group.bench_function(format!("{name}/tokenize"), |b| {
            b.iter(|| black_box(projector.tokenize(&text, &[&image], AddBos::Yes, Special::Plain).unwrap()))
        });
        group.bench_function(format!("{name}/eval"), |b| {
            b.iter(|| {
                let prompt = projector.tokenize(&text, &[&image], AddBos::Yes, Special::Plain).unwrap();
                ctx.clear_kv();
                projector.eval(&mut ctx, &prompt, 0).unwrap();
            })
        });
    }
    let projector_path = tiny_projector_path(&ProjectorSpec::mlp(spec.n_embd)).unwrap();
    let projector = Projector::load(&model, projector_path, &ProjectorParams::default().n_threads(1)).unwrap();
    let jpeg = std::fs::read(std::path::Path::new(llamacpp::sys::SOURCE_DIR).join("tools/mtmd/test-1.jpeg")).unwrap();
    group.bench_function("decode_jpeg", |b| b.iter(|| black_box(Media::from_bytes(&projector, &jpeg).unwrap())));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
