//! Writes the synthetic multimodal projector of `llamacpp::testing` (the
//! `mlp` head of LLaVA-1.5, 16×16 images into 4 tokens, random weights)
//! whose output width is a model's input width, for tests of the
//! image path end to end (llama-serve --mmproj, the official-client
//! scripts). It sees nothing: outputs do not describe the image.
//!
//! ```text
//! cargo run --example tiny_projector -- [--model M] OUT.gguf
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
        write_tiny_projector(&args.out, &ProjectorSpec::mlp(width))?;
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
