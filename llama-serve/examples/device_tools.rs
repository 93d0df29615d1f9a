//! The GPU machine's one binary (`scripts/device-check.sh`, docs/gpu.md):
//! the `device_check` and `bench` examples of the workspace and this
//! crate's `serve_bench` in one executable, each run when it is called by
//! its name (the script makes links named so). A statically linked CUDA
//! build of each is about 43 MB compressed (sm_90), and a device call
//! carries 64 MiB: one copy of the kernels fits, three do not.

use std::path::Path;
use std::process::ExitCode;

#[path = "../../examples/bench.rs"]
mod bench;
#[path = "../../examples/device_check.rs"]
mod device_check;
#[path = "serve_bench/main.rs"]
mod serve_bench;

fn main() -> ExitCode {
    let called = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&called).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.as_str() {
        "bench" => bench::main(),
        "device_check" => device_check::main(),
        "serve_bench" => serve_bench::main(),
        other => {
            eprintln!(
                "device_tools: run me through a link named bench, device_check or serve_bench (called as {other:?})"
            );
            ExitCode::FAILURE
        }
    }
}
