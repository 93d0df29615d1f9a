//! Where the model is cached, and the checks that a cached file is the
//! verified one: sha256 markers tied to the file's identity, a private
//! folder, a lock between processes.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::error::{FetchError, io_error};
use crate::files::{parent_dir, unique_path};
use crate::progress::{byte_bar, spinner};
use crate::{CACHE_DIR_ENV, COPY_BUFFER, MARKER_SUFFIX};

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
pub(crate) fn user_id() -> Option<u32> {
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
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), FetchError> {
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
pub(crate) fn identity(meta: &fs::Metadata) -> String {
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

pub(crate) fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(MARKER_SUFFIX);
    path.with_file_name(name)
}

pub(crate) fn marker_is_valid(marker: &Path, file_meta: &fs::Metadata, sha256: &str) -> bool {
    let Ok(contents) = fs::read_to_string(marker) else {
        return false;
    };
    let mut lines = contents.lines();
    // A file replaced or rewritten since it was hashed has another identity.
    lines.next().is_some_and(|digest| digest_eq(digest, sha256))
        && lines.next().is_some_and(|id| id == identity(file_meta))
}

pub(crate) fn write_marker(marker: &Path, digest: &str, file_meta: &fs::Metadata) {
    // Best effort: failing to write it only costs a re-hash next time.
    let dir = parent_dir(marker);
    let temp = unique_path(dir, "marker");
    if fs::write(&temp, format!("{digest}\n{}\n", identity(file_meta))).is_ok() && fs::rename(&temp, marker).is_err() {
        let _ = fs::remove_file(&temp);
    }
}

pub(crate) fn digest_eq(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

pub(crate) fn sha256_file(path: &Path, size: u64) -> Result<String, FetchError> {
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
pub(crate) fn lock_exclusive(path: &Path) -> Result<Option<File>, FetchError> {
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
