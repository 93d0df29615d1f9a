//! Guarded calls: llama.cpp calls that may reach a worker run on a call
//! thread with the shim's abort hook armed, so a worker that dies ends the
//! call, not the process.
//!
//! A context's call thread is the crate's plain kept thread
//! (`crate::llama::thread::CallThread`), and the pointers go to it in
//! `crate::llama::thread::SendPtr`; what this module adds is the guard around
//! each call and the wait that gives up on a call lost with its worker.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::Lease;
use crate::error::{Error, Result};
use crate::llama::thread::{CallThread, Job, OnDrop};
use crate::sys;

/// Installs the shim's RPC guard (once).
pub(super) fn install_guard() {
    // SAFETY: sets ggml's process-wide abort callback once, keeping the
    // previous one, which the hook calls for every other abort.
    unsafe { sys::shim::llama_rs_rpc_guard_install() };
}

/// How often a waiting caller looks for a failure, and how long after one
/// it waits for its own call before it treats the call as lost with it.
const POLL: Duration = Duration::from_millis(20);
const GRACE: Duration = Duration::from_secs(30);

/// The thread that makes a context's calls into llama.cpp while its model
/// has layers on RPC workers (llama.cpp's OpenMP pool stays with one
/// thread). When a worker dies during a call, the caller stops waiting and
/// the thread stays blocked in llama.cpp for good, with what it holds.
/// Dropping the runner closes its job channel, which ends the thread
/// (unless it is blocked for good); it is not joined.
#[derive(Debug)]
pub(crate) struct Runner {
    worker: CallThread,
    /// A call was abandoned: the thread is blocked for good.
    lost: bool,
}

impl Runner {
    pub(crate) fn start() -> Result<Runner> {
        let worker = CallThread::spawn("llama-rpc-calls", None, OnDrop::Detach)
            .map_err(|e| Error::Rpc { endpoint: String::new(), message: format!("cannot start a thread: {e}") })?;
        Ok(Runner { worker, lost: false })
    }

    /// Whether a call was abandoned (its context is unusable).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost
    }

    /// Runs `call` on the thread, guarded (`catches`: the call has a C++
    /// catch around llama.cpp), and waits for it unless a server of `lease`
    /// is lost meanwhile: then [`Error::Rpc`], and the call is abandoned.
    pub(crate) fn run<R: Send + 'static>(
        &mut self,
        lease: &Lease,
        what: &str,
        catches: bool,
        call: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R> {
        lease.check()?;
        if self.lost {
            return Err(Error::Rpc { endpoint: lease.0.join(","), message: "an earlier call was lost".into() });
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.worker
            .send(guarded_job(catches, call, tx))
            .map_err(|_| Error::Rpc { endpoint: lease.0.join(","), message: "the call thread is gone".into() })?;
        let result = wait(&rx, lease, what);
        if matches!(result, Err(Error::Rpc { .. })) {
            self.lost = true;
        }
        result
    }
}

/// `call` wrapped as a job: marked guarded while it runs, its result (or
/// panic) sent back.
fn guarded_job<R: Send + 'static>(
    catches: bool,
    call: impl FnOnce() -> R + Send + 'static,
    tx: mpsc::SyncSender<std::thread::Result<R>>,
) -> Job {
    Box::new(move || {
        // SAFETY: marks this thread for the shim's hook; ended below.
        unsafe { sys::shim::llama_rs_rpc_guard_begin(catches) };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
        // SAFETY: ends the guarded call begun above on this thread.
        unsafe { sys::shim::llama_rs_rpc_guard_end() };
        let _ = tx.send(result);
    })
}

/// Runs `call` guarded on a thread of its own (one-off calls: loading,
/// freeing); as [`Runner::run`].
pub(crate) fn run_once<R: Send + 'static>(
    lease: &Lease,
    what: &str,
    catches: bool,
    call: impl FnOnce() -> R + Send + 'static,
) -> Result<R> {
    lease.check()?;
    let (tx, rx) = mpsc::sync_channel(1);
    let job = guarded_job(catches, call, tx);
    std::thread::Builder::new()
        .name("llama-rpc-call".into())
        .spawn(job)
        .map_err(|e| Error::Rpc { endpoint: lease.0.join(","), message: format!("cannot start a thread: {e}") })?;
    wait(&rx, lease, what)
}

/// Waits for a guarded call's result. A dispatcher thread ended by the
/// guard (the shim counts them) means some worker died: if one of `lease`'s
/// servers no longer holds this process's connection, or the call has not
/// finished [`GRACE`] after the failure, the call is lost with it.
fn wait<R>(rx: &mpsc::Receiver<std::thread::Result<R>>, lease: &Lease, what: &str) -> Result<R> {
    // SAFETY: reads an atomic counter.
    let failures = || unsafe { sys::shim::llama_rs_rpc_failures() };
    let mut seen = failures();
    let mut since: Option<Instant> = None;
    let mut next_check = Instant::now();
    loop {
        match rx.recv_timeout(POLL) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::Rpc { endpoint: lease.0.join(","), message: format!("{what} never finished") });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = failures();
        if now != seen {
            seen = now;
            since.get_or_insert_with(Instant::now);
        }
        let Some(failed_at) = since else { continue };
        if Instant::now() < next_check {
            continue;
        }
        next_check = Instant::now() + Duration::from_secs(1);
        let gone = lease.gone().or_else(|| (failed_at.elapsed() > GRACE).then(|| lease.0.join(",")));
        if let Some(endpoint) = gone {
            // The call may still have finished meanwhile.
            if let Ok(result) = rx.recv_timeout(Duration::from_millis(200)) {
                return result.map_err(|p| std::panic::resume_unwind(p));
            }
            // SAFETY: counts out the call whose thread never ends.
            unsafe { sys::shim::llama_rs_rpc_guard_abandon() };
            for e in endpoint.split(',') {
                lease.mark_lost(e);
            }
            return Err(Error::Rpc {
                endpoint,
                message: format!(
                    "the worker stopped answering during {what}: the models on it are unusable (dropping them \
                     leaks their memory)"
                ),
            });
        }
    }
}
