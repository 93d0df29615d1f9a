//! Writes a synthetic multimodal projector of `llamacpp::testing` (random
//! weights) whose output width is a model's input width: by default the
//! tiny `mlp` head of LLaVA-1.5 (16×16 images into 4 tokens), for tests of
//! the image path end to end (llama-serve --mmproj, the official-client
//! scripts); `--shape gemma3-siglip` writes Gemma 3's vision tower at its
//! real size (896×896 images into 256 tokens, 1.7 GB), for measuring what
//! an image costs. It sees nothing: outputs do not describe the image.
//!
//! ```text
//! cargo run --example tiny_projector -- [--model M] [--shape mlp|gemma3|gemma3-siglip] OUT.gguf
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llama_suite::synthetic::{ProjectorSpec, write_tiny_projector};
use llamacpp::{Model, ModelParams};

#[derive(Parser, Debug)]
#[command(about = "Write a synthetic multimodal projector for a GGUF model")]
struct Args {
    /// The text model (default: $LLAMA_MODEL, else the cached default model).
    #[arg(long, short = 'm', env = "LLAMA_MODEL")]
    model: Option<PathBuf>,
    /// The projector: `mlp` (tiny LLaVA head), `gemma3` (tiny Gemma 3
    /// head), `gemma3-siglip` (Gemma 3's vision tower at its real size).
    #[arg(long, default_value = "mlp", value_parser = ["mlp", "gemma3", "gemma3-siglip"])]
    shape: String,
    /// Where to write the projector.
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let path = match &args.model {
            Some(p) => p.clone(),
            None => llama_suite::model_cache::model_path()?,
        };
        let model = Model::load(&path, &ModelParams::default())?;
        let width = u32::try_from(model.n_embd_inp())?;
        let spec = match args.shape.as_str() {
            "gemma3" => ProjectorSpec::gemma3(width),
            "gemma3-siglip" => ProjectorSpec::gemma3_siglip(width),
            _ => ProjectorSpec::mlp(width),
        };
        write_tiny_projector(&args.out, &spec)?;
        println!("{}", args.out.display());
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
