//! Temporary files and folders with names no other process picks,
//! removed unless kept.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{FetchError, io_error};

pub(crate) fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A name in `dir` no other process or thread will pick:
/// `.<stem>.<pid>.<counter>.<nanos>.tmp`.
pub(crate) fn unique_path(dir: &Path, stem: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.subsec_nanos()).unwrap_or_default();
    dir.join(format!(".{stem}.{}.{count}.{nanos}.tmp", std::process::id()))
}

/// Creates a fresh path with `create`, retrying on name collisions.
pub(crate) fn create_unique<T>(
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
pub(crate) struct TempFile {
    pub(crate) path: PathBuf,
    keep: bool,
}

impl TempFile {
    pub(crate) fn create(dir: &Path, stem: &str) -> Result<(File, Self), FetchError> {
        let (file, path) = create_unique(dir, stem, |path| OpenOptions::new().write(true).create_new(true).open(path))?;
        Ok((file, Self { path, keep: false }))
    }

    pub(crate) fn keep(mut self) {
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
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn create(dir: &Path, stem: &str) -> Result<Self, FetchError> {
        let ((), path) = create_unique(dir, stem, |path| fs::create_dir(path))?;
        Ok(Self { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}
