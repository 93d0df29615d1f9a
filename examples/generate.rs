//! Streams a completion of a prompt to stdout, then one line of statistics
//! to stderr.
//!
//! ```text
//! cargo run --release --example generate -- --prompt "The capital of France is"
//! cargo run --release --example generate -- --chat --prompt "Write a haiku about rust" -n 64
//! cargo run --release --example generate -- --model other.gguf --file prompt.txt --greedy
//! cargo run --release --example generate -- --json-schema person.schema.json --prompt "A person in JSON:" --greedy
//! cargo run --release --example generate -- --spec --file edit-this-code.txt --greedy
//! cargo run --release --example generate -- -m gemma-3-4b-it.gguf --mmproj mmproj.gguf --chat \
//!     --image photo.jpg --prompt "What is in this picture?"
//! ```
//!
//! With `--mmproj FILE` (a multimodal projector for the model), each
//! `--image` / `--audio` file goes where the prompt has the marker
//! `<__media__>`, or before the prompt if it has none.
//!
//! With `--json-schema FILE` (output valid against that JSON Schema) or
//! `--json` (any JSON object), stdout is the JSON document alone; a schema
//! that cannot be enforced is a one-line error. Constraints (these,
//! `--regex` and `--lark`) run through llguidance (`llamacpp::constraint`);
//! `--json-gbnf` converts the schema to GBNF for llama.cpp's grammar
//! sampler instead (for comparison).
//!
//! Without `--model`, the model is `LLAMA_MODEL` or the default model
//! (Gemma 3 270M Q4_K_M), fetched and cached on first use. Ctrl-C stops the
//! generation; the statistics are still printed.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llamacpp::chat::RenderOptions;
use llamacpp::constraint::{Constraint, JsonOptions};
use llamacpp::generate::{FinishReason, GenerateOptions, Overflow, Session};
use llamacpp::speculative::Speculation;
use llamacpp::{AddBos, ChatFormat, ChatMessage, ContextParams, Model, ModelParams, Sampler, SamplerChain};

#[derive(Parser, Debug)]
#[command(about = "Stream a completion from a GGUF model")]
struct Args {
    /// GGUF model file (default: $LLAMA_MODEL, else the cached default model).
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, short = 'p', conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Most tokens to generate (-1: until the model stops or Ctrl-C).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256, allow_negative_numbers = true)]
    n_predict: i64,
    /// Temperature.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: i32,
    /// Top-p (1.0: off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p (0.0: off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty over the last 64 tokens (1.0: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Random seed (default: random).
    #[arg(long)]
    seed: Option<u32>,
    /// Always pick the most likely token (ignores the sampling options).
    #[arg(long)]
    greedy: bool,
    /// Context length in tokens.
    #[arg(long = "ctx", short = 'c', default_value_t = 4096)]
    ctx: u32,
    /// CPU threads (default: all).
    #[arg(long, short = 't')]
    threads: Option<i32>,
    /// Layers to offload to GPUs or RPC workers (-1: all). Default: as
    /// many as fit each device's free memory less 1 GiB beside this
    /// context (none in a CPU-only build).
    #[arg(long = "gpu-layers", alias = "ngl", allow_negative_numbers = true)]
    gpu_layers: Option<i32>,
    /// RPC workers (`host:port,...`, feature `rpc`; see the rpc_server
    /// example) whose devices take the offloaded layers (--gpu-layers).
    #[arg(long, value_delimiter = ',')]
    rpc: Vec<String>,
    /// How the offloaded layers are split over the devices, in proportion
    /// (`1,3`: a quarter and three quarters); default: by free memory.
    #[arg(long, value_delimiter = ',')]
    tensor_split: Vec<f32>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Constrain the output with a GBNF grammar file (root rule `root`),
    /// through llama.cpp's grammar sampler.
    #[arg(long, conflicts_with_all = ["json_schema", "json", "regex", "lark"])]
    grammar: Option<PathBuf>,
    /// Constrain the output to match this regex in full.
    #[arg(long, conflicts_with_all = ["json_schema", "json", "lark"])]
    regex: Option<String>,
    /// Constrain the output with a Lark grammar file (llguidance's dialect,
    /// start rule `start`).
    #[arg(long, conflicts_with_all = ["json_schema", "json"])]
    lark: Option<PathBuf>,
    /// With --json-schema/--json: JSON Schema's own semantics (undeclared
    /// properties allowed, any whitespace) instead of this crate's
    /// tightenings for small models (bounded whitespace, no undeclared
    /// properties, bounded numbers, strings and arrays), with which a
    /// small base model stops.
    #[arg(long)]
    json_spec: bool,
    /// With --json-schema: how deep a recursive schema may nest.
    #[arg(long, default_value_t = llamacpp::constraint::JsonOptions::DEFAULT_MAX_DEPTH)]
    json_max_depth: usize,
    /// With --json-schema/--json: convert to GBNF and constrain with
    /// llama.cpp's grammar sampler instead of llguidance.
    #[arg(long)]
    json_gbnf: bool,
    /// Constrain the output to JSON valid against this JSON Schema file;
    /// stdout is then the JSON document only.
    #[arg(long, conflicts_with = "json")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to a JSON object; stdout is then the JSON
    /// document only.
    #[arg(long)]
    json: bool,
    /// With a GBNF grammar: mask the vocabulary with it before every pick
    /// (exact for random sampling, much slower); by default the pick is
    /// checked against the grammar first. (llguidance constraints always
    /// mask first.)
    #[arg(long)]
    grammar_first: bool,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Speculative decoding with drafts from the text itself (n-gram
    /// lookup in the prompt and the output): same output, several tokens
    /// per decode where the text repeats. The statistics line counts the
    /// drafted and accepted tokens.
    #[arg(long)]
    spec: bool,
    /// With --spec: the most tokens one draft holds.
    #[arg(long, default_value_t = Speculation::ngram().max_draft())]
    draft_max: usize,
    /// The model's multimodal projector (`mmproj` GGUF), for --image and
    /// --audio.
    #[arg(long, requires = "media")]
    mmproj: Option<PathBuf>,
    /// An image file (JPEG, PNG, BMP, GIF, ...) to put in the prompt
    /// (repeatable; needs --mmproj).
    #[arg(long, group = "media")]
    image: Vec<PathBuf>,
    /// An audio file (WAV, MP3, FLAC) to put in the prompt (repeatable;
    /// needs --mmproj and a projector that takes audio).
    #[arg(long, group = "media")]
    audio: Vec<PathBuf>,
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

fn run(args: &Args) -> Result<(), BoxError> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?
        }
        (None, None) => return Err("no prompt: pass --prompt TEXT or --file PATH".into()),
    };
    let json = args.json || args.json_schema.is_some();
    let constrain = constrain(args)?;
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => llama_suite::model_cache::model_path()?,
    };
    let mut ctx_params = ContextParams::default().n_ctx(args.ctx);
    if let Some(t) = args.threads {
        ctx_params = ctx_params.n_threads(t).n_threads_batch(t);
    }
    let mut params = ModelParams::default()
        .rpc_servers(args.rpc.clone())
        .tensor_split(args.tensor_split.clone())
        .fit_context(ctx_params.clone());
    if let Some(n) = args.gpu_layers {
        params = params.n_gpu_layers(n);
    }
    let model = Model::load(&model_path, &params)?;
    let vocab = model.vocab();
    if let Some(mmproj) = &args.mmproj {
        #[cfg(feature = "mtmd")]
        return run_media(args, &model, mmproj, &prompt, &ctx_params);
        #[cfg(not(feature = "mtmd"))]
        return Err(
            format!("{}: this build has no multimodal input (the suite's feature `mtmd`)", mmproj.display()).into()
        );
    }
    if !args.image.is_empty() || !args.audio.is_empty() {
        return Err("--image and --audio need the model's projector: pass --mmproj FILE".into());
    }

    let tokens = if args.chat {
        let messages = [ChatMessage::user(prompt)];
        // The model's Jinja template, or llama.cpp's built-in format of
        // its family (chatml if none) for a model without one.
        let format = model.chat_format(None)?;
        if let ChatFormat::Builtin(name) = &format {
            eprintln!("note: the model has no chat template; using llama.cpp's built-in {name:?}");
        }
        let text = format.render(&messages, &RenderOptions::default().add_generation_prompt(true))?;
        vocab.tokenize_chat(&text)?
    } else {
        vocab.tokenize(&prompt, AddBos::Yes)?
    };

    let mut ctx = model.new_context(&ctx_params)?;
    if model.n_gpu_layers() != 0 {
        // Where the layers went: asked (or fitted), and the weights each
        // device holds.
        let (layers, asked) = (model.n_layer() + 1, model.n_gpu_layers());
        let placed: Vec<String> = ctx
            .memory_breakdown()?
            .devices()
            .iter()
            .filter(|d| d.weights > 0)
            .map(|d| format!("{} {:.1} MiB", d.device, d.weights as f64 / (1024.0 * 1024.0)))
            .collect();
        eprintln!("layers: {asked} of {layers} offloaded (with the output layer); weights on {}", placed.join(", "));
    }
    let mut sampler = build_sampler(args, &model, constrain.as_ref())?;

    let abort = ctx.abort_handle();
    ctrlc::set_handler(move || abort.abort()).map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;

    let mut options = GenerateOptions::default().stop(args.stop.iter().cloned()).overflow(Overflow::Shift).n_keep(
        // Keep the BOS token when shifting the context.
        usize::from(vocab.adds_bos()),
    );
    if let Ok(n) = usize::try_from(args.n_predict) {
        options = options.max_tokens(n);
    }
    if args.spec {
        options = options.speculation(Speculation::ngram().draft_max(args.draft_max));
    }

    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &tokens, &options)?;
    let mut stdout = std::io::stdout().lock();
    if json {
        // The document alone: collected, then printed without the
        // whitespace the grammar allows around it.
        let mut document = String::new();
        let result = generation.stream(|piece| {
            document.push_str(piece);
            ControlFlow::Continue(())
        });
        eprintln!("{}", generation.stats());
        result?;
        if generation.finish_reason() != Some(&FinishReason::EndOfGeneration) {
            let why = generation.finish_reason().map_or_else(|| "unknown".to_string(), ToString::to_string);
            let tail: String = document.chars().rev().take(120).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(
                format!("the JSON document is incomplete (generation ended: {why}); it ended with {tail:?}").into()
            );
        }
        writeln!(stdout, "{}", document.trim())?;
        return Ok(());
    }
    let mut write_error = None;
    let result = generation.stream(|piece| {
        if let Err(e) = stdout.write_all(piece.as_bytes()).and_then(|()| stdout.flush()) {
            // stdout closed (e.g. piped into `head`): stop quietly.
            write_error = Some(e);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    let _ = writeln!(stdout);
    eprintln!("{}", generation.stats());
    result?;
    if let Some(e) = write_error.filter(|e| e.kind() != std::io::ErrorKind::BrokenPipe) {
        return Err(e.into());
    }
    Ok(())
}

/// A prompt with images or audio: the projector's chunks evaluated, then
/// a plain sampling loop (prompt caching and speculation are for text).
#[cfg(feature = "mtmd")]
fn run_media(
    args: &Args,
    model: &Model,
    mmproj: &std::path::Path,
    prompt: &str,
    ctx_params: &ContextParams,
) -> Result<(), BoxError> {
    use llamacpp::mtmd::{Media, Projector, ProjectorParams};
    use llamacpp::{Detokenizer, Output, Special};

    let mut projector_params = ProjectorParams::default();
    if let Some(t) = args.threads {
        projector_params = projector_params.n_threads(t);
    }
    let mut projector = Projector::load(model, mmproj, &projector_params)?;
    let mut media = Vec::new();
    for path in args.image.iter().chain(&args.audio) {
        media.push(Media::from_file(&projector, path).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    let marker = projector.marker().to_owned();
    let prompt = if prompt.contains(&marker) {
        prompt.to_owned()
    } else {
        format!("{}{prompt}", media.iter().map(|_| format!("{marker}\n")).collect::<String>())
    };
    let (text, special) = if args.chat {
        let format = model.chat_format(None)?;
        let messages = [ChatMessage::user(prompt)];
        (format.render(&messages, &RenderOptions::default().add_generation_prompt(true))?, Special::Markup)
    } else {
        (prompt, Special::Plain)
    };
    let refs: Vec<&Media> = media.iter().collect();
    let tokenized = projector.tokenize(&text, &refs, AddBos::Yes, special)?;
    let mut ctx = model.new_context(ctx_params)?;
    let started = std::time::Instant::now();
    projector.eval(&mut ctx, &tokenized, 0)?;
    let prompt_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut sampler = build_sampler(args, model, None)?;
    let mut detokenizer = Detokenizer::new(model.vocab(), Special::Plain);
    let mut stdout = std::io::stdout().lock();
    let max = usize::try_from(args.n_predict).unwrap_or(usize::MAX);
    let started = std::time::Instant::now();
    let mut generated = 0;
    while generated < max {
        let token = sampler.sample(&mut ctx, Output::Last)?;
        if model.vocab().is_eog(token) {
            break;
        }
        generated += 1;
        stdout.write_all(detokenizer.piece(token)?.as_bytes())?;
        stdout.flush()?;
        ctx.eval(&[token], 0)?;
    }
    writeln!(stdout, "{}", detokenizer.finish())?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens ({} media) in {prompt_ms:.0} ms; generated {generated} tokens in {secs:.2} s",
        tokenized.n_tokens(),
        media.len()
    );
    Ok(())
}

/// What the output is constrained by.
enum Constrain {
    Gbnf(String),
    Guidance(Constraint),
}

fn read(path: &std::path::Path, what: &str) -> Result<String, BoxError> {
    Ok(std::fs::read_to_string(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?)
}

fn constrain(args: &Args) -> Result<Option<Constrain>, BoxError> {
    let schema = match (&args.json_schema, args.json) {
        (Some(path), _) => Some(
            serde_json::from_str::<serde_json::Value>(&read(path, "JSON schema")?)
                .map_err(|e| format!("{} is not JSON: {e}", path.display()))?,
        ),
        (None, true) => Some(serde_json::json!({"type": "object"})),
        (None, false) => None,
    };
    Ok(match (&args.grammar, &args.regex, &args.lark, schema) {
        (Some(path), ..) => Some(Constrain::Gbnf(read(path, "grammar")?)),
        (_, Some(regex), ..) => Some(Constrain::Guidance(Constraint::regex(regex))),
        (_, _, Some(path), _) => Some(Constrain::Guidance(Constraint::lark(read(path, "Lark grammar")?))),
        (_, _, _, Some(schema)) if args.json_gbnf => Some(Constrain::Gbnf(
            llamacpp::json_schema::schema_to_grammar(&schema).map_err(|e| format!("the JSON schema: {e}"))?,
        )),
        (_, _, _, Some(schema)) => {
            let options = if args.json_spec { JsonOptions::default() } else { JsonOptions::tight() };
            let options = JsonOptions { max_depth: args.json_max_depth, ..options };
            Some(Constrain::Guidance(Constraint::json_schema(schema).with_json_options(options)))
        }
        _ => None,
    })
}

fn build_sampler<'m>(args: &Args, model: &'m Model, constrain: Option<&Constrain>) -> llamacpp::Result<Sampler<'m>> {
    let mut chain = SamplerChain::new().grammar_first(args.grammar_first);
    match constrain {
        Some(Constrain::Gbnf(gbnf)) => chain = chain.grammar(model.vocab(), gbnf, "root"),
        Some(Constrain::Guidance(c)) => chain = chain.constraint(model, c),
        None => {}
    }
    if args.greedy {
        return chain.greedy().build();
    }
    chain
        .penalties(64, args.repeat_penalty, 0.0, 0.0)
        .top_k(args.top_k)
        .top_p(args.top_p, 1)
        .min_p(args.min_p, 1)
        .temp(args.temp)
        .dist(args.seed.unwrap_or(u32::MAX))
        .build()
}
