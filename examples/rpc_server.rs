//! An RPC worker: serves this machine's CPU (or chosen devices) to llama.cpp
//! clients on another machine, through llama.cpp's RPC backend (feature
//! `rpc`). Prints `listening on HOST:PORT` on stdout once it accepts
//! clients, then serves until the process is stopped (SIGINT/SIGTERM or a
//! kill: llama.cpp's server loop has no other way out).
//!
//! **No authentication, no encryption**: anyone who reaches the port can
//! run computations on this machine and read what it holds for clients.
//! The default host is 127.0.0.1; bind another address only on a trusted
//! network.
//!
//! ```sh
//! cargo run --release --features rpc --example rpc_server -- --port 50052 --threads 2
//! cargo run --release --features rpc --example generate -- --rpc 127.0.0.1:50052 --gpu-layers 99 --prompt "..."
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use llamacpp::rpc::{self, ServerOptions};

#[derive(Parser, Debug)]
#[command(about = "Serve this machine's devices to llama.cpp RPC clients (no authentication: trusted networks only)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: a free one, named in the `listening on` line).
    #[arg(long, short = 'p', default_value_t = 50052)]
    port: u16,
    /// Threads for the CPU device (default: every core).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Cache large tensors by hash in this folder, so that a client that
    /// loads the same model again sends hashes instead of data.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Devices to serve, by name (default: the CPU); see `llamacpp::devices`.
    #[arg(long, value_delimiter = ',')]
    device: Vec<String>,
    /// Exit when standard input closes: a parent that starts the worker
    /// with a pipe stops it by exiting, however it exits.
    #[arg(long)]
    stop_on_eof: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let devices = match args.device.iter().map(|name| find_device(name)).collect::<Result<Vec<_>, String>>() {
        Ok(devices) => devices,
        Err(e) => {
            eprintln!("rpc_server: {e}");
            return ExitCode::from(2);
        }
    };
    let port = match args.port {
        // llama.cpp's server does not say which port it got for 0.
        0 => match std::net::TcpListener::bind((args.host.as_str(), 0)).and_then(|l| l.local_addr()) {
            Ok(addr) => addr.port(),
            Err(e) => {
                eprintln!("rpc_server: cannot find a free port on {}: {e}", args.host);
                return ExitCode::FAILURE;
            }
        },
        port => port,
    };
    let endpoint = format!("{}:{port}", args.host);
    let options = ServerOptions { devices, threads: args.threads, cache_dir: args.cache };
    let server = {
        let endpoint = endpoint.clone();
        std::thread::spawn(move || rpc::serve(&endpoint, &options))
    };
    // Ready when the server answers a handshake (as a client that leaves
    // at once); a server that failed to start has ended its thread.
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe_host = if args.host == "0.0.0.0" { "127.0.0.1" } else { args.host.as_str() };
    let probe_at = format!("{probe_host}:{port}");
    loop {
        if server.is_finished() {
            let error = match server.join() {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(never)) => match never {},
                Err(_) => "the server thread panicked".to_owned(),
            };
            eprintln!("rpc_server: {error}");
            return ExitCode::FAILURE;
        }
        if rpc::probe(&probe_at, Duration::from_secs(1)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("rpc_server: {endpoint} did not answer within 30 s");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("listening on {endpoint}");
    let _ = std::io::stdout().flush();
    if args.stop_on_eof {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    match server.join() {
        Ok(Err(e)) => eprintln!("rpc_server: {e}"),
        Ok(Ok(never)) => match never {},
        Err(_) => eprintln!("rpc_server: the server thread panicked"),
    }
    ExitCode::FAILURE
}

fn find_device(name: &str) -> Result<llamacpp::Device, String> {
    let devices = llamacpp::devices();
    devices.iter().find(|d| d.name.eq_ignore_ascii_case(name)).cloned().ok_or_else(|| {
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        format!("no device {name}; this machine has {}", names.join(", "))
    })
}
