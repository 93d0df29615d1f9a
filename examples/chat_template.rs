//! Renders a conversation with a Jinja chat template, the way Hugging
//! Face's `apply_chat_template` does, and prints the prompt to stdout and
//! nothing else.
//!
//! ```text
//! cargo run --example chat_template -- --template vendor/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja \
//!     --messages tests/chat_template/multi_turn.json --add-generation-prompt
//! cargo run --example chat_template -- --template T.jinja --messages conv.json --tools tools.json \
//!     --bos-token "<s>" --eos-token "</s>" --var enable_thinking=false
//! ```
//!
//! `--messages` is a JSON list of messages (`role`, `content` as a string
//! or a list of `{"type": "text", "text": …}` parts, `tool_calls`,
//! `tool_call_id`, `name`, `reasoning_content`), passed to the template as
//! written; `--tools` a JSON list of function specs. Exit status: 0 with the
//! prompt on stdout; 3 when the template refuses the conversation (it
//! called `raise_exception`), 1 on any other error, with one line on stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::Parser;
use llamacpp::Error;
use llamacpp::chat::{ChatTemplate, RenderOptions};

#[derive(Parser, Debug)]
#[command(about = "Render a conversation with a Jinja chat template")]
struct Args {
    /// The Jinja template file.
    #[arg(long)]
    template: PathBuf,
    /// The conversation: a JSON list of messages.
    #[arg(long)]
    messages: PathBuf,
    /// The tools: a JSON list of function specs.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// End with the opening of an assistant turn.
    #[arg(long)]
    add_generation_prompt: bool,
    /// The BOS token's text (`bos_token`).
    #[arg(long, default_value = "")]
    bos_token: String,
    /// The EOS token's text (`eos_token`).
    #[arg(long, default_value = "")]
    eos_token: String,
    /// An extra template variable, NAME=JSON (`enable_thinking=false`); repeatable.
    #[arg(long = "var", value_name = "NAME=JSON")]
    vars: Vec<String>,
    /// The time `strftime_now` formats, in Unix seconds (default: now).
    #[arg(long)]
    now: Option<u64>,
}

enum Failure {
    Raised(String),
    Other(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::ChatTemplateRaised(m) => Failure::Raised(m),
            e => Failure::Other(e.to_string()),
        }
    }
}

fn read_json(path: &Path, what: &str) -> Result<serde_json::Value, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Other(format!("cannot read the {what} {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Failure::Other(format!("the {what} {} is not JSON: {e}", path.display())))
}

fn run(args: &Args) -> Result<String, Failure> {
    let source = std::fs::read_to_string(&args.template)
        .map_err(|e| Failure::Other(format!("cannot read the template {}: {e}", args.template.display())))?;
    let messages = read_json(&args.messages, "messages")?;
    if !messages.is_array() {
        return Err(Failure::Other(format!("the messages {} must be a JSON list", args.messages.display())));
    }
    let mut options = RenderOptions::default()
        .add_generation_prompt(args.add_generation_prompt)
        .bos_token(args.bos_token.as_str())
        .eos_token(args.eos_token.as_str());
    if let Some(tools) = &args.tools {
        options = options.tools(read_json(tools, "tools")?);
    }
    for var in &args.vars {
        let (name, value) =
            var.split_once('=').ok_or_else(|| Failure::Other(format!("--var {var:?}: expected NAME=JSON")))?;
        let value = serde_json::from_str(value)
            .map_err(|e| Failure::Other(format!("--var {name}: the value is not JSON: {e}")))?;
        options = options.var(name, value);
    }
    if let Some(now) = args.now {
        options = options.now(UNIX_EPOCH + Duration::from_secs(now));
    }
    let template = ChatTemplate::new(&source)?;
    Ok(template.render_json(&messages, &options)?)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(prompt) => {
            print!("{prompt}");
            ExitCode::SUCCESS
        }
        Err(Failure::Raised(m)) => {
            eprintln!("error: the template refused the conversation: {m}");
            ExitCode::from(3)
        }
        Err(Failure::Other(m)) => {
            eprintln!("error: {}", m.lines().next().unwrap_or_default());
            ExitCode::from(1)
        }
    }
}
