//! Where a context meets the `rpc` feature: [`Calls`], the thread that
//! makes the context's calls into llama.cpp while its model has layers on
//! RPC workers (see `llamacpp::rpc`). For a local model, and in a build
//! without the feature, it is empty and runs each call here, so the core
//! code has no `cfg` of its own.

use crate::error::Result;
use crate::llama::model::Remote;

/// A context's call thread, when its model is remote.
#[derive(Debug)]
pub(super) struct Calls {
    #[cfg(feature = "rpc")]
    runner: Option<crate::llama::rpc::Runner>,
}

impl Calls {
    /// The calls of a new context of a model behind `remote`: on a thread
    /// of their own when it is remote.
    ///
    /// # Errors
    /// [`Error::Rpc`](crate::Error::Rpc) when the thread cannot start.
    pub(super) fn start(remote: &Remote) -> Result<Calls> {
        #[cfg(feature = "rpc")]
        return Ok(Calls { runner: remote.is_remote().then(crate::llama::rpc::Runner::start).transpose()? });
        #[cfg(not(feature = "rpc"))]
        {
            let _ = remote;
            Ok(Calls {})
        }
    }

    /// Whether the calls go to the call thread (the model is remote).
    pub(super) fn is_remote(&self) -> bool {
        #[cfg(feature = "rpc")]
        return self.runner.is_some();
        #[cfg(not(feature = "rpc"))]
        false
    }

    /// `Err` when the model lost a worker, or a call of this context was
    /// abandoned (every call into llama.cpp would reach the dead
    /// connection, or the context is still held by the abandoned call).
    pub(super) fn check(&self, remote: &Remote) -> Result<()> {
        remote.check()?;
        #[cfg(feature = "rpc")]
        if self.runner.as_ref().is_some_and(crate::llama::rpc::Runner::is_lost) {
            return Err(crate::Error::Rpc {
                endpoint: String::new(),
                message: "a call of this context was lost".into(),
            });
        }
        Ok(())
    }

    /// Whether the context must not be freed: its model lost a worker, or
    /// a call of it was abandoned (freeing would go through the dead
    /// connection, or race the abandoned call).
    pub(super) fn is_lost(&self, remote: &Remote) -> bool {
        #[cfg(feature = "rpc")]
        return remote.is_lost() || self.runner.as_ref().is_some_and(crate::llama::rpc::Runner::is_lost);
        #[cfg(not(feature = "rpc"))]
        {
            let _ = remote;
            false
        }
    }

    /// Runs `call` on the call thread, guarded (`catches`: the call has a
    /// C++ catch around llama.cpp), when the model is remote; here
    /// otherwise.
    ///
    /// # Errors
    /// [`Error::Rpc`](crate::Error::Rpc) when a worker is lost during the
    /// call (it is abandoned, and the context unusable).
    pub(super) fn run<R: Send + 'static>(
        &mut self,
        remote: &Remote,
        what: &str,
        catches: bool,
        call: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R> {
        #[cfg(feature = "rpc")]
        if let (Some(runner), Some(lease)) = (self.runner.as_mut(), remote.lease()) {
            return runner.run(lease, what, catches, call);
        }
        let _ = (remote, what, catches);
        Ok(call())
    }
}
