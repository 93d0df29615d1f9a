//! llama.cpp's RPC backend (feature `rpc`): one model across several
//! machines. A worker serves its devices over TCP ([`serve`], or the
//! `rpc_server` example as a process); a client registers each worker's
//! devices ([`add_server`], or [`ModelParams::rpc_servers`]) and llama.cpp
//! places layers on them as on local GPUs ([`ModelParams::gpu_layers`]: by
//! default what fits the workers' free memory,
//! [`ModelParams::split_mode`], [`ModelParams::tensor_split`]).
//!
//! **Security:** the protocol has no authentication and no encryption, and
//! a worker runs whatever graph a client sends it. Serve only on a trusted
//! network; the `rpc_server` example binds `127.0.0.1` unless told
//! otherwise.
//!
//! **Failures:** llama.cpp's RPC client aborts the process when it cannot
//! connect to a server or the handshake fails, and, from the dispatcher
//! thread of a connection, when a send or receive fails (a worker that
//! died or a connection that broke). Here:
//!
//! - [`add_server`], and each model load that opens a connection, first
//!   connect and do the handshake themselves within a timeout: an
//!   unreachable, refusing, silent or foreign endpoint is [`Error::Rpc`];
//! - loading a model, creating and freeing contexts, decoding and encoding,
//!   and freeing models with layers on workers run on a call thread, with
//!   an abort hook in the C++ shim armed: a worker that dies during one of
//!   them ends its connection's dispatcher thread instead of the process,
//!   the call is abandoned (its thread stays blocked in llama.cpp) and the
//!   caller gets [`Error::Rpc`]. The worker is then lost: its models and
//!   their contexts refuse every further call into llama.cpp (reading
//!   logits and embeddings and sampling too; `synchronize` and
//!   `reset_perf` do nothing), and dropping them leaks their memory
//!   (freeing would go through the dead connection). A worker counts as
//!   dead when its port refuses connections; a call still running 30 s
//!   after any worker of the process failed is given up too;
//! - a worker that dies while nothing of its model is running is found by
//!   the next guarded call. Reading or writing a context's state and
//!   clearing its KV data are not guarded: a worker that dies during those
//!   still ends the process. A load onto workers with a progress callback
//!   is refused ([`Error::Unsupported`]): the callback cannot go to the
//!   call thread; so are LoRA adapters on such a model;
//! - a worker that vanishes without closing its connections (a host
//!   powered off, a stopped process) is not noticed: ggml-rpc sets no
//!   socket timeouts, so a call waits as long as the operating system keeps
//!   the connection;
//! - ggml-rpc's sockets are not close-on-exec: a child process started
//!   while a model uses workers inherits its connections, which keeps the
//!   worker (one client at a time) from serving anyone else.
//!
//! [`ModelParams::rpc_servers`]: field@crate::ModelParams::rpc_servers
//! [`ModelParams::gpu_layers`]: field@crate::ModelParams::gpu_layers
//! [`ModelParams::split_mode`]: field@crate::ModelParams::split_mode
//! [`ModelParams::tensor_split`]: field@crate::ModelParams::tensor_split

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::llama::backend::{self, Device, DeviceKind};
use crate::sys;

mod guard;
mod serve;

use guard::install_guard;
pub(crate) use guard::{Runner, run_once};
pub use serve::{ServerOptions, serve};

/// How long [`ModelParams::rpc_servers`](field@crate::ModelParams::rpc_servers)
/// waits for each server's handshake.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// `RPC_CMD_HELLO` (fixed at 14 in every protocol version).
const CMD_HELLO: u8 = 14;
/// `RPC_CONN_CAPS_SIZE`: the transport capabilities in the handshake.
const CONN_CAPS: usize = 24;
/// `rpc_msg_hello_rsp`: major, minor, patch, padding, capabilities.
const HELLO_RESPONSE: usize = 4 + CONN_CAPS;
// The version numbers travel as bytes.
const _: () = assert!(sys::RPC_PROTO_MAJOR_VERSION < 256 && sys::RPC_PROTO_MINOR_VERSION < 256);

/// A worker's `host:port`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    fn parse(text: &str) -> Result<Endpoint> {
        let invalid = |why: &str| Error::Rpc { endpoint: text.to_owned(), message: format!("not host:port ({why})") };
        let (host, port) = text.rsplit_once(':').ok_or_else(|| invalid("no ':'"))?;
        // llama.cpp splits at the first ':' (no IPv6 literals).
        if host.is_empty() || host.contains(':') || host.contains('\0') {
            return Err(invalid("the host must be a name or an IPv4 address"));
        }
        let port: u16 = port.parse().map_err(|_| invalid("the port must be 1-65535"))?;
        if port == 0 {
            return Err(invalid("the port must be 1-65535"));
        }
        Ok(Endpoint { host: host.to_owned(), port })
    }

    fn text(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error::Rpc { endpoint: self.text(), message: message.into() }
    }
}

/// The protocol version a server announced in the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolVersion {
    /// Must equal the client's (`RPC_PROTO_MAJOR_VERSION`).
    pub major: u8,
    /// At most the client's.
    pub minor: u8,
    /// Any.
    pub patch: u8,
}

/// Connects to `endpoint` (`host:port`) and does the RPC handshake, as
/// llama.cpp's client would, within `timeout` for the connection and for
/// each read and write: the version of a server that llama.cpp can use, or
/// [`Error::Rpc`] saying why not (unresolvable, refused, unreachable,
/// silent, not an RPC server, another protocol version).
///
/// A server serves one client at a time: while another client (another
/// process) holds it, this times out.
pub fn probe(endpoint: &str, timeout: Duration) -> Result<ProtocolVersion> {
    probe_endpoint(&Endpoint::parse(endpoint)?, timeout)
}

fn probe_endpoint(endpoint: &Endpoint, timeout: Duration) -> Result<ProtocolVersion> {
    match handshake(endpoint, timeout) {
        Answer::Version(version) => Ok(version),
        Answer::Busy => {
            Err(endpoint
                .error(format!("no handshake within {timeout:?} (busy with another client, or not an RPC server)")))
        }
        Answer::Unreachable(e) | Answer::Failed(e) => Err(e),
    }
}

/// What a handshake found.
enum Answer {
    /// A server llama.cpp can use, free to serve.
    Version(ProtocolVersion),
    /// It accepted the connection but did not answer in time: a server
    /// serving another client (or something that is not a server).
    Busy,
    /// Nothing accepts connections there: unresolvable, refused,
    /// unreachable, no answer.
    Unreachable(Error),
    /// Something answered that llama.cpp cannot use: foreign, another
    /// version, a broken handshake.
    Failed(Error),
}

fn handshake(endpoint: &Endpoint, timeout: Duration) -> Answer {
    if timeout.is_zero() {
        return Answer::Failed(Error::InvalidParameter { name: "timeout", message: "must be positive".into() });
    }
    let addrs = match (endpoint.host.as_str(), endpoint.port).to_socket_addrs() {
        Ok(addrs) => addrs,
        Err(e) => return Answer::Unreachable(endpoint.error(format!("cannot resolve the host: {e}"))),
    };
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        return Answer::Unreachable(endpoint.error(match last {
            Some(e) if e.kind() == std::io::ErrorKind::TimedOut => format!("no answer within {timeout:?}"),
            Some(e) => format!("cannot connect: {e}"),
            None => "the host resolves to no address".to_owned(),
        }));
    };
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Answer::Busy,
        std::io::ErrorKind::UnexpectedEof => {
            Answer::Failed(endpoint.error("closed the connection during the handshake"))
        }
        _ => Answer::Failed(endpoint.error(format!("handshake failed: {e}"))),
    };
    if let Err(e) = stream.set_read_timeout(Some(timeout)).and_then(|()| stream.set_write_timeout(Some(timeout))) {
        return io(e);
    }
    // | cmd (1 byte) | request size (8 bytes) | capabilities (none) |
    let mut request = vec![CMD_HELLO];
    request.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
    request.extend_from_slice(&[0; CONN_CAPS]);
    if let Err(e) = stream.write_all(&request) {
        return io(e);
    }
    // | response size (8 bytes) | major | minor | patch | padding | capabilities |
    let mut size = [0u8; 8];
    if let Err(e) = stream.read_exact(&mut size) {
        return io(e);
    }
    let size = u64::from_le_bytes(size);
    if size != HELLO_RESPONSE as u64 {
        return Answer::Failed(endpoint.error(format!(
            "not an RPC server of protocol {}.x (its handshake answer has {size} bytes, not {HELLO_RESPONSE})",
            sys::RPC_PROTO_MAJOR_VERSION
        )));
    }
    let mut response = [0u8; HELLO_RESPONSE];
    if let Err(e) = stream.read_exact(&mut response) {
        return io(e);
    }
    let version = ProtocolVersion { major: response[0], minor: response[1], patch: response[2] };
    if u32::from(version.major) != sys::RPC_PROTO_MAJOR_VERSION
        || u32::from(version.minor) > sys::RPC_PROTO_MINOR_VERSION
    {
        return Answer::Failed(endpoint.error(format!(
            "speaks RPC protocol {}.{}.{}, this client {}.{}.{}: use llama.cpp builds of one commit on both sides",
            version.major,
            version.minor,
            version.patch,
            sys::RPC_PROTO_MAJOR_VERSION,
            sys::RPC_PROTO_MINOR_VERSION,
            sys::RPC_PROTO_PATCH_VERSION
        )));
    }
    Answer::Version(version)
}

/// A server this process added: its devices, and how many live models use
/// it.
struct Added {
    endpoint: String,
    devices: Vec<Device>,
    models: usize,
    /// The worker died (or its connection broke) during a guarded call:
    /// the models and contexts on it are unusable.
    lost: bool,
}

/// The servers this process added. llama.cpp connects to a server whenever
/// something of its needs it and no connection is open (a model's buffers
/// keep one open), aborts the process when that connect fails, and a
/// server serves one client at a time: so a server is checked before each
/// first use, and only then (a second handshake of ours would wait behind
/// the open connection).
static ADDED: Mutex<Vec<Added>> = Mutex::new(Vec::new());

fn added() -> std::sync::MutexGuard<'static, Vec<Added>> {
    ADDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The devices of the RPC server at `endpoint` (`host:port`), to place a
/// model on ([`ModelParams::devices`](field@crate::ModelParams::devices), or
/// [`ModelParams::rpc_servers`](field@crate::ModelParams::rpc_servers), which
/// calls this). The first call for an endpoint checks, within `timeout`,
/// that the server answers llama.cpp's handshake ([`probe`]), because
/// llama.cpp aborts the process on a server it cannot reach; later calls
/// return the same devices without connecting.
///
/// The devices are named `RPC0`, `RPC1`, … (kind [`DeviceKind::Gpu`]) and
/// described by their endpoint. They are not added to the global list of
/// [`devices`](crate::devices): llama.cpp would connect to every listed
/// server whenever that list is read, and abort on one that has gone.
#[doc(alias = "ggml_backend_rpc_add_server")]
pub fn add_server(endpoint: &str, timeout: Duration) -> Result<Vec<Device>> {
    backend::init();
    let parsed = Endpoint::parse(endpoint)?;
    let key = parsed.text();
    // Held across the handshake: two threads adding one endpoint must not
    // both probe it. (ADDED itself is not: the guarded call below takes it.)
    static ADDING: Mutex<()> = Mutex::new(());
    let _adding = ADDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = added().iter().find(|a| a.endpoint == key) {
        return Ok(a.devices.clone());
    }
    probe_endpoint(&parsed, timeout)?;
    install_guard();
    let c_endpoint = CString::new(key.clone())?;
    // Counting the devices and reading their memory connects to the server
    // (which answered just now): on a guarded thread, like every connection
    // (see the shim).
    let lease = Lease(vec![key.clone()]);
    let devices = run_once(&lease, "adding the server", false, move || {
        // SAFETY: a NUL-terminated endpoint. The returned registry entry is
        // a process-lifetime singleton per endpoint; indexes below its
        // device count are valid and the device handles live as long as
        // the process.
        unsafe {
            let reg = sys::ggml_backend_rpc_add_server(c_endpoint.as_ptr());
            if reg.is_null() {
                return Vec::new();
            }
            (0..sys::ggml_backend_reg_dev_count(reg))
                .map(|i| Device::from_raw(sys::ggml_backend_reg_dev_get(reg, i)))
                .collect::<Vec<_>>()
        }
    });
    let devices = devices?;
    if devices.is_empty() {
        return Err(parsed.error("the server has no devices"));
    }
    added().push(Added { endpoint: key, devices: devices.clone(), models: 0, lost: false });
    Ok(devices)
}

/// The servers a live model uses, released when the model is dropped.
#[derive(Debug)]
pub(crate) struct Lease(Vec<String>);

impl Drop for Lease {
    fn drop(&mut self) {
        for a in added().iter_mut().filter(|a| self.0.contains(&a.endpoint)) {
            a.models = a.models.saturating_sub(1);
        }
    }
}

impl Lease {
    /// The first of the servers that was lost, if any.
    fn lost(&self) -> Option<String> {
        added().iter().find(|a| a.lost && self.0.contains(&a.endpoint)).map(|a| a.endpoint.clone())
    }

    /// Whether a server of the model was lost: then nothing of it may be
    /// freed (freeing goes through the dead connection).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost().is_some()
    }

    /// `Err` when a server of the model was lost.
    pub(crate) fn check(&self) -> Result<()> {
        match self.lost() {
            Some(endpoint) => Err(Error::Rpc {
                endpoint,
                message: "this worker was lost during an earlier call: the models on it are unusable (dropping \
                          them leaks their memory)"
                    .into(),
            }),
            None => Ok(()),
        }
    }

    /// After a call that failed without a dispatcher failure (llama.cpp's
    /// own connect to a worker failed and the guard made it an exception):
    /// the [`Error::Rpc`] of a server of this lease that is gone, now
    /// marked lost; `None` when all of them still listen.
    pub(crate) fn lost_during(&self, what: &str) -> Option<Error> {
        let endpoint = self.gone()?;
        self.mark_lost(&endpoint);
        Some(Error::Rpc { endpoint, message: format!("the worker went away during {what}") })
    }

    fn mark_lost(&self, endpoint: &str) {
        for a in added().iter_mut().filter(|a| a.endpoint == endpoint) {
            a.lost = true;
        }
    }

    /// The server of this lease that is gone, after a dispatcher thread
    /// ended: one whose host refuses connections (nothing listens on the
    /// port any more). A connect that times out proves nothing (a busy
    /// worker's one-connection backlog is full, or the link is slow), nor
    /// does one that succeeds (llama.cpp opens and closes connections while
    /// it loads; the caller's grace period covers a worker restarted in
    /// place). No handshake is made: it would queue behind this process's
    /// own connection.
    fn gone(&self) -> Option<String> {
        self.0.iter().find_map(|endpoint| {
            let parsed = Endpoint::parse(endpoint).ok()?;
            let addrs = (parsed.host.as_str(), parsed.port).to_socket_addrs().ok()?;
            let refused = addrs.into_iter().next().is_some_and(|addr| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(300))
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            });
            refused.then(|| endpoint.clone())
        })
    }
}

/// Before a model is loaded with `servers` (and/or RPC devices among
/// `explicit`): adds the servers, checks within `timeout` that each one no
/// live model of this process holds a connection to answers (llama.cpp will
/// connect to it and abort if it cannot), and counts the model in. Returns
/// the device list for llama.cpp when the caller gave none (the servers'
/// devices in the order given, first as llama.cpp puts RPC devices to keep
/// transfers low, then the local GPUs; layers that are not offloaded stay
/// on the CPU as always) and the lease.
pub(crate) fn prepare(
    servers: &[String],
    explicit: Option<&[Device]>,
    timeout: Duration,
) -> Result<(Option<Vec<Device>>, Option<Lease>)> {
    let mut devices = Vec::new();
    let mut endpoints = Vec::new();
    for endpoint in servers {
        devices.extend(add_server(endpoint, timeout)?);
        endpoints.push(Endpoint::parse(endpoint)?.text());
    }
    let mut added = added();
    for device in explicit.unwrap_or_default() {
        if let Some(a) = added.iter().find(|a| a.devices.iter().any(|d| d.raw == device.raw)) {
            endpoints.push(a.endpoint.clone());
        }
    }
    endpoints.sort();
    endpoints.dedup();
    for a in added.iter().filter(|a| endpoints.contains(&a.endpoint) && a.models == 0) {
        probe_endpoint(&Endpoint::parse(&a.endpoint)?, timeout)?;
    }
    for a in added.iter_mut().filter(|a| endpoints.contains(&a.endpoint)) {
        a.models += 1;
    }
    let lease = (!endpoints.is_empty()).then(|| Lease(endpoints));
    let list = (explicit.is_none() && !servers.is_empty()).then(|| {
        devices.extend(
            backend::devices().into_iter().filter(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu)),
        );
        devices
    });
    Ok((list, lease))
}

/// Whether a device belongs to a server this process added.
fn is_rpc_device(device: &Device) -> bool {
    added().iter().any(|a| a.devices.iter().any(|d| d.raw == device.raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(Endpoint::parse("127.0.0.1:50052").unwrap(), Endpoint { host: "127.0.0.1".into(), port: 50052 });
        assert_eq!(Endpoint::parse("worker-3:1").unwrap().text(), "worker-3:1");
        for bad in ["", "127.0.0.1", ":50052", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "::1:50052", "h:p"] {
            assert!(matches!(Endpoint::parse(bad), Err(Error::Rpc { .. })), "{bad:?}");
        }
    }

    #[test]
    fn a_refused_connection_is_an_error_naming_the_endpoint() {
        // A port that was just free: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let endpoint = format!("127.0.0.1:{port}");
        let err = probe(&endpoint, Duration::from_secs(2)).unwrap_err();
        let Error::Rpc { endpoint: e, message } = &err else { panic!("{err:?}") };
        assert_eq!(*e, endpoint);
        assert!(message.contains("cannot connect"), "{message}");
        assert!(matches!(add_server(&endpoint, Duration::from_secs(2)), Err(Error::Rpc { .. })));
    }

    #[test]
    fn a_silent_server_times_out_and_a_foreign_one_is_refused() {
        // Accepts and says nothing.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("127.0.0.1:{}", silent.local_addr().unwrap().port());
        let start = std::time::Instant::now();
        let err = add_server(&endpoint, Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("no handshake within"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());

        // Answers with something that is not an RPC handshake.
        let foreign = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("127.0.0.1:{}", foreign.local_addr().unwrap().port());
        let server = std::thread::spawn(move || {
            let (mut client, _) = foreign.accept().unwrap();
            let mut request = [0u8; 1 + 8 + CONN_CAPS];
            client.read_exact(&mut request).unwrap();
            assert_eq!(request[0], CMD_HELLO);
            client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let err = add_server(&endpoint, Duration::from_secs(2)).unwrap_err();
        assert!(err.to_string().contains("not an RPC server"), "{err}");
        server.join().unwrap();

        // Speaks another major version.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("127.0.0.1:{}", other.local_addr().unwrap().port());
        let server = std::thread::spawn(move || {
            let (mut client, _) = other.accept().unwrap();
            let mut request = [0u8; 1 + 8 + CONN_CAPS];
            client.read_exact(&mut request).unwrap();
            let mut answer = (HELLO_RESPONSE as u64).to_le_bytes().to_vec();
            answer.extend_from_slice(&[sys::RPC_PROTO_MAJOR_VERSION as u8 + 1, 0, 0, 0]);
            answer.extend_from_slice(&[0; CONN_CAPS]);
            client.write_all(&answer).unwrap();
        });
        let err = add_server(&endpoint, Duration::from_secs(2)).unwrap_err();
        assert!(err.to_string().contains("speaks RPC protocol 8.0.0"), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn serve_refuses_a_port_in_use_and_bad_options() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
        let err = serve(&endpoint, &ServerOptions::default()).unwrap_err();
        assert!(err.to_string().contains("cannot listen there"), "{err}");
        drop(taken);
        let options = ServerOptions { threads: Some(0), ..ServerOptions::default() };
        assert!(matches!(serve("127.0.0.1:1", &options), Err(Error::InvalidParameter { name: "threads", .. })));
        assert!(matches!(serve("nowhere", &ServerOptions::default()), Err(Error::Rpc { .. })));
    }
}
