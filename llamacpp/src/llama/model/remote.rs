//! Where a model meets the `rpc` feature: [`Remote`], the RPC workers its
//! layers live on, if any. The model holds one and asks it before the
//! calls that reach the workers; without the feature it is empty and says
//! every call is local, so the core code has no `cfg` of its own.

use crate::error::Result;
use crate::llama::backend::Device;

use super::ModelParams;

/// The RPC servers a model uses (released when it is dropped, after the
/// model is freed), or none: every call is local.
#[derive(Debug)]
pub(crate) struct Remote {
    #[cfg(feature = "rpc")]
    lease: Option<crate::llama::rpc::Lease>,
}

impl Remote {
    /// The servers of a model to load
    /// ([`ModelParams::rpc_servers`](field@ModelParams::rpc_servers) and RPC
    /// devices in [`ModelParams::devices`](field@ModelParams::devices)),
    /// checked: the device list for llama.cpp when the caller gave none
    /// (`None`: llama.cpp chooses), and the gate that counts the model as
    /// a user of the servers.
    ///
    /// # Errors
    /// [`Error::Rpc`](crate::Error::Rpc) for a server that cannot be
    /// reached; [`Error::Unsupported`](crate::Error::Unsupported) for
    /// servers in a build without the `rpc` feature.
    pub(super) fn prepare(params: &ModelParams) -> Result<(Option<Vec<Device>>, Remote)> {
        #[cfg(feature = "rpc")]
        {
            let (devices, lease) = crate::llama::rpc::prepare(
                &params.rpc_servers,
                params.devices.as_deref(),
                crate::llama::rpc::DEFAULT_TIMEOUT,
            )?;
            Ok((devices, Remote { lease }))
        }
        #[cfg(not(feature = "rpc"))]
        {
            if params.rpc_servers.is_empty() {
                return Ok((None, Remote {}));
            }
            Err(crate::Error::Unsupported(format!(
                "RPC servers {:?}: this build of llamacpp has no `rpc` feature",
                params.rpc_servers
            )))
        }
    }

    /// Whether the model has layers on RPC workers (then the calls that
    /// reach them go through [`Remote::run_once`] or a context's
    /// call thread).
    pub(crate) fn is_remote(&self) -> bool {
        #[cfg(feature = "rpc")]
        return self.lease.is_some();
        #[cfg(not(feature = "rpc"))]
        false
    }

    /// Whether a worker of the model was lost: then nothing of it may be
    /// freed (freeing goes through the dead connection).
    pub(crate) fn is_lost(&self) -> bool {
        #[cfg(feature = "rpc")]
        return self.lease.as_ref().is_some_and(crate::llama::rpc::Lease::is_lost);
        #[cfg(not(feature = "rpc"))]
        false
    }

    /// `Err` when a worker of the model was lost (every call that reaches
    /// it would wait for a dead connection).
    pub(crate) fn check(&self) -> Result<()> {
        #[cfg(feature = "rpc")]
        if let Some(lease) = &self.lease {
            lease.check()?;
        }
        Ok(())
    }

    /// Runs `call` (a one-off call: loading, freeing) guarded on a thread
    /// of its own when the model is remote (`catches`: the call has a C++
    /// catch around llama.cpp), here otherwise.
    ///
    /// # Errors
    /// [`Error::Rpc`](crate::Error::Rpc) when a worker is lost during the
    /// call (the call is abandoned).
    pub(crate) fn run_once<R: Send + 'static>(
        &self,
        what: &str,
        catches: bool,
        call: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R> {
        #[cfg(feature = "rpc")]
        if let Some(lease) = &self.lease {
            return crate::llama::rpc::run_once(lease, what, catches, call);
        }
        let _ = (what, catches);
        Ok(call())
    }

    /// After a call that failed without a lost worker being noticed
    /// (llama.cpp's own connect failed): the [`Error::Rpc`](crate::Error::Rpc)
    /// of a worker that is gone, if one is.
    pub(crate) fn lost_during(&self, what: &str) -> Option<crate::Error> {
        #[cfg(feature = "rpc")]
        return self.lease.as_ref().and_then(|lease| lease.lost_during(what));
        #[cfg(not(feature = "rpc"))]
        {
            let _ = what;
            None
        }
    }

    /// The lease, for the context's call thread (`rpc::Runner::run`).
    #[cfg(feature = "rpc")]
    pub(crate) fn lease(&self) -> Option<&crate::llama::rpc::Lease> {
        self.lease.as_ref()
    }
}
