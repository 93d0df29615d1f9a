//! Embeds lines of text: one JSON array of floats per input line on
//! stdout, or with `--similarity` the cosine similarity matrix of the lines
//! (one JSON row per line).
//!
//! ```text
//! printf 'a cat sat on the mat\na kitten on a rug\nstock prices fell\n' \
//!     | cargo run --release --example embed -- --normalize --similarity
//! cargo run --release --example embed -- --file lines.txt --pooling last > vectors.jsonl
//! ```
//!
//! Without `--model`, the model is `LLAMA_MODEL` or the default model
//! (Gemma 3 270M Q4_K_M), fetched and cached on first use. Every line is an
//! input, an empty one included (for a model that adds BOS, the BOS
//! vector). A line longer than `--ubatch` tokens is an error unless
//! `--truncate`.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use llamacpp::embed::{EmbedParams, Embedder, cosine_similarity};
use llamacpp::{Error, Model, ModelParams, Pooling};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PoolingArg {
    /// The model's pooling if it defines one, else mean.
    Auto,
    /// The model's pooling (an error if it defines none).
    Model,
    /// Mean of the token embeddings.
    Mean,
    /// The first token's embedding.
    Cls,
    /// The last token's embedding.
    Last,
}

#[derive(Parser, Debug)]
#[command(about = "Embed lines of text with a GGUF model")]
struct Args {
    /// GGUF model file (default: $LLAMA_MODEL, else the cached default model).
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// Read the lines from a file instead of stdin.
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// How token embeddings become one vector per line.
    #[arg(long, value_enum, default_value_t = PoolingArg::Auto)]
    pooling: PoolingArg,
    /// Scale every vector to unit length.
    #[arg(long)]
    normalize: bool,
    /// Print the cosine similarity matrix of the lines instead of the vectors.
    #[arg(long)]
    similarity: bool,
    /// Embed the first --ubatch tokens of longer lines instead of failing.
    #[arg(long)]
    truncate: bool,
    /// Most tokens per pass, and the longest line.
    #[arg(long, default_value_t = 512)]
    ubatch: u32,
    /// Most lines per pass (with mean pooling, a divisor of --ubatch).
    #[arg(long, default_value_t = 64)]
    seqs: u32,
    /// CPU threads (default: all).
    #[arg(long, short = 't')]
    threads: Option<i32>,
    /// Layers to offload to the GPU (-1: all). Default: as many as fit
    /// (none in a CPU-only build).
    #[arg(long = "gpu-layers", alias = "ngl", allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error>;

fn read_lines(file: Option<&PathBuf>) -> Result<Vec<String>, BoxError> {
    let lines: Result<Vec<String>, std::io::Error> = match file {
        Some(f) => {
            let file = std::fs::File::open(f).map_err(|e| format!("cannot open {}: {e}", f.display()))?;
            std::io::BufReader::new(file).lines().collect()
        }
        None => std::io::stdin().lock().lines().collect(),
    };
    let what = file.map_or("stdin".to_owned(), |f| f.display().to_string());
    // A Windows line ending is not part of the text.
    Ok(lines
        .map_err(|e| format!("cannot read {what}: {e}"))?
        .into_iter()
        .map(|l| l.strip_suffix('\r').map(str::to_owned).unwrap_or(l))
        .collect())
}

fn run(args: &Args) -> Result<(), BoxError> {
    let lines = read_lines(args.file.as_ref())?;
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => llama_suite::model_cache::model_path()?,
    };
    let params = ModelParams::default();
    let model = Model::load(&model_path, &args.gpu_layers.map_or(params.clone(), |n| params.n_gpu_layers(n)))?;

    let mut params = EmbedParams::default()
        .normalize(args.normalize)
        .truncate(args.truncate)
        .n_ubatch(args.ubatch)
        .n_seq_max(args.seqs);
    if let Some(t) = args.threads {
        params = params.n_threads(t).n_threads_batch(t);
    }
    let pooling = match args.pooling {
        PoolingArg::Auto | PoolingArg::Model => Pooling::Model,
        PoolingArg::Mean => Pooling::Mean,
        PoolingArg::Cls => Pooling::Cls,
        PoolingArg::Last => Pooling::Last,
    };
    let mut embedder = match Embedder::new(&model, &params.clone().pooling(pooling)) {
        Err(Error::InvalidArgument(m)) if args.pooling == PoolingArg::Auto && m.contains("defines no pooling") => {
            eprintln!("note: the model defines no pooling; using mean pooling");
            Embedder::new(&model, &params.pooling(Pooling::Mean))?
        }
        other => other?,
    };
    let vectors = embedder.embed(&lines).map_err(|e| match e {
        Error::InputTooLarge { limit, .. } => {
            let longest = lines.iter().enumerate().find(|(_, l)| embedder.tokenize(l).is_ok_and(|t| t.len() > limit));
            match longest {
                Some((i, _)) => {
                    format!("line {} is longer than {limit} tokens (pass --truncate or a larger --ubatch)", i + 1)
                }
                None => e.to_string(),
            }
        }
        e => e.to_string(),
    })?;

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.similarity {
        for a in &vectors {
            let row: Vec<f32> = vectors.iter().map(|b| cosine_similarity(a, b)).collect();
            writeln!(out, "{}", serde_json::to_string(&row)?)?;
        }
    } else {
        for v in &vectors {
            writeln!(out, "{}", serde_json::to_string(v)?)?;
        }
    }
    out.flush()?;
    Ok(())
}
