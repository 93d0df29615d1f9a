//! Where the model comes from: named, or fetched on request.

use super::*;

/// The model comes from `--model`/`LLAMA_MODEL`, or with
/// `--fetch-default-model` from the default-model cache (here already
/// filled, so nothing is downloaded); with neither, a one-line error and
/// exit status 1 before anything listens.
#[test]
fn the_model_is_named_or_fetched_on_request() {
    let cached = llama_suite::model_cache::default_model().expect("the default model, cached");
    let cache_dir = cached.parent().unwrap();

    let out = Command::new(exe()).args(["--port", "0"]).env_remove("LLAMA_MODEL").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: no model: pass --model") && stderr.contains("--fetch-default-model"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing listened");

    let mut command = Command::new(exe());
    command.args(["--port", "0", "--threads", &THREADS.to_string(), "--ctx", "1024", "--fetch-default-model"]);
    command.env_remove("LLAMA_MODEL").env("LLAMA_CACHE_DIR", cache_dir);
    let server = Server::spawn_command(command).ready();
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "gemma-3-270m-q4_k_m", "{models}");
}
