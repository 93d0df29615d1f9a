//! Media files from arbitrary bytes (`Media::from_bytes`: stb_image's
//! decoders, miniaudio's for WAV/MP3/FLAC magic), then, for what decodes,
//! a prompt with it tokenized and evaluated through the tiny synthetic
//! projector into the tiny model: must never crash.
//!
//! Input: the file's bytes.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use llama_fuzz::{TINY_SPEC, ctx_params, tiny_model};
use llamacpp::Context;
use llamacpp::mtmd::{Media, Projector, ProjectorParams};
use llamacpp::testing::{ProjectorSpec, tiny_projector_path};
use llamacpp::{AddBos, Special};

thread_local! {
    /// The projector and a context of the tiny model, made once.
    static STATE: RefCell<(Projector<'static>, Context<'static>)> = RefCell::new((
        Projector::load(
            tiny_model(),
            tiny_projector_path(&ProjectorSpec::mlp(TINY_SPEC.n_embd)).expect("write the tiny projector"),
            &ProjectorParams::default().n_threads(1),
        )
        .expect("load the tiny projector"),
        tiny_model().new_context(&ctx_params(1)).expect("context"),
    ));
}

fuzz_target!(|data: &[u8]| {
    STATE.with(|s| {
        let (projector, ctx) = &mut *s.borrow_mut();
        let Ok(media) = Media::from_bytes(projector, data) else { return };
        let _ = (media.width(), media.height(), media.id(), media.data().len());
        let text = format!("a {} b", projector.marker());
        let Ok(prompt) = projector.tokenize(&text, &[&media], AddBos::Yes, Special::Plain) else { return };
        ctx.clear_kv();
        let _ = projector.eval(ctx, &prompt, 0);
    });
});
