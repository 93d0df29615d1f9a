//! The worker side: serving this machine's devices to RPC clients.

use std::convert::Infallible;
use std::ffi::CString;
use std::net::TcpListener;
use std::path::PathBuf;

use super::{Endpoint, is_rpc_device};
use crate::error::{Error, Result};
use crate::llama::backend::{self, Device, DeviceKind};
use crate::sys;

/// What a worker serves, and how.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The local devices to serve; empty (the default) serves the CPU.
    pub devices: Vec<Device>,
    /// Threads for the CPU device; `None` uses every core.
    pub threads: Option<usize>,
    /// A folder where the worker caches large tensors by hash, so that a
    /// client loading the same model again sends hashes instead of data.
    pub cache_dir: Option<PathBuf>,
}

/// Serves this machine's devices to RPC clients at `endpoint` (`host:port`;
/// use `127.0.0.1` unless the network is trusted: there is no
/// authentication). Runs on the calling thread and does not return while
/// the server runs: llama.cpp's server loop has no way to stop, so a server
/// started on a thread of this process lasts as long as the process. Run
/// the `rpc_server` example as a child process for a server that can be
/// stopped (by ending the process).
///
/// Returns an error when the endpoint is invalid or its port cannot be
/// bound, a device cannot be served, or llama.cpp's server stops.
/// [`probe`](super::probe) tells when the server accepts clients.
#[doc(alias = "ggml_backend_rpc_start_server")]
pub fn serve(endpoint: &str, options: &ServerOptions) -> Result<Infallible> {
    backend::init();
    let parsed = Endpoint::parse(endpoint)?;
    let threads = match options.threads {
        Some(0) => {
            return Err(Error::InvalidParameter { name: "threads", message: "a server needs at least one".into() });
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // llama.cpp reports a port it cannot bind only on stderr: find out
    // here, with the reason.
    let listener = TcpListener::bind((parsed.host.as_str(), parsed.port))
        .map_err(|e| parsed.error(format!("cannot listen there: {e}")))?;
    drop(listener);
    let devices = if options.devices.is_empty() {
        backend::devices().into_iter().filter(|d| d.kind == DeviceKind::Cpu).take(1).collect()
    } else {
        options.devices.clone()
    };
    if devices.is_empty() {
        return Err(parsed.error("no device to serve"));
    }
    if let Some(rpc) = devices.iter().find(|d| is_rpc_device(d)) {
        return Err(parsed.error(format!("{} is a remote device: a worker serves local devices", rpc.name)));
    }
    let cache_dir = match &options.cache_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.clone(), e))?;
            Some(crate::llama::ffi::path_to_cstring(dir)?)
        }
        None => None,
    };
    let c_endpoint = CString::new(parsed.text())?;
    let mut raw: Vec<sys::ggml_backend_dev_t> = devices.iter().map(|d| d.raw).collect();
    // SAFETY: NUL-terminated strings and a device list that outlive the
    // call (which returns only when the server fails); the devices are
    // process-lifetime registry handles.
    unsafe {
        sys::ggml_backend_rpc_start_server(
            c_endpoint.as_ptr(),
            cache_dir.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            threads,
            raw.len(),
            raw.as_mut_ptr(),
        );
    }
    Err(parsed.error("the server stopped (llama.cpp printed why on stderr)"))
}
