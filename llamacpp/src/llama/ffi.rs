//! The crate's helpers at the C boundary, in one place: panics in Rust
//! code that C calls back (which must not unwind into C), and C strings and
//! paths in both directions.
//!
//! It imports nothing of the crate, so that the error module (which turns
//! shim exception messages into [`Error`](crate::Error)) can use it.

use std::any::Any;
use std::ffi::{CStr, CString, NulError, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::Path;

use crate::error::{Error, Result};
use crate::sys;

/// A panic caught at the C boundary, kept to be resumed once C returned.
pub(crate) type Panic = Box<dyn Any + Send>;

/// Runs the Rust body of a C callback. Unwinding out of an `extern "C"`
/// function aborts the process, so a panic is caught here and handed back
/// as `Err`: the trampoline returns a neutral value to C and keeps the
/// panic (with [`keep_first`]) for the Rust caller of the C function to
/// [`resume`]. `AssertUnwindSafe`: the state a callback touches is
/// discarded or re-checked by that caller before any further use.
pub(crate) fn catch<R>(body: impl FnOnce() -> R) -> std::result::Result<R, Panic> {
    catch_unwind(AssertUnwindSafe(body))
}

/// Keeps `panic` in `slot` unless an earlier one is there: the first panic
/// of a C call is the one resumed.
pub(crate) fn keep_first(slot: &mut Option<Panic>, panic: Panic) {
    slot.get_or_insert(panic);
}

/// Resumes the panic in `slot`, if any, now that C has returned.
pub(crate) fn resume(slot: Option<Panic>) {
    if let Some(panic) = slot {
        resume_unwind(panic);
    }
}

/// A path as a C string: its bytes on Unix, its lossy UTF-8 elsewhere.
///
/// # Errors
/// A path with a NUL byte (`?` turns it into
/// [`Error::Nul`](crate::Error::Nul)).
pub(crate) fn path_to_cstring(path: &Path) -> Result<CString, NulError> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path.to_string_lossy().into_owned().into_bytes();
    CString::new(bytes)
}

/// A copy of the C string at `ptr` (invalid UTF-8 replaced), or an empty
/// string for NULL.
///
/// # Safety
/// A non-null `ptr` points to a NUL-terminated string that stays valid and
/// unchanged during this call.
pub(crate) unsafe fn owned_lossy(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// The C string at `ptr` as `&str`: `None` for NULL or invalid UTF-8.
///
/// # Safety
/// A non-null `ptr` points to a NUL-terminated string that stays valid and
/// unchanged for `'a`.
pub(crate) unsafe fn borrowed_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().ok()
}

/// Turns a shim return code into a `Result`, fetching the exception message.
pub(crate) fn check_shim(code: std::os::raw::c_int, function: &'static str) -> Result<()> {
    if code == sys::shim::OK {
        return Ok(());
    }
    // SAFETY: the shim returns a pointer to a thread-local NUL-terminated
    // string that stays valid until the next shim call on this thread; we
    // copy it out at once.
    let message = unsafe { owned_lossy(sys::shim::llama_rs_last_exception()) };
    Err(Error::Exception { function, message })
}

/// Maps the documented return codes of `llama_decode`/`llama_encode`.
pub(crate) fn check_decode(code: i32) -> Result<()> {
    match code {
        0 => Ok(()),
        1 => Err(Error::NoKvSlot),
        2 => Err(Error::Aborted),
        -1 => Err(Error::BatchRejected),
        -2 => Err(Error::AllocationFailed),
        other => Err(Error::ComputeFailed(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_panic_is_kept_and_resumed() {
        let mut slot = None;
        let first = catch(|| panic!("first")).unwrap_err();
        keep_first(&mut slot, first);
        keep_first(&mut slot, catch(|| panic!("second")).unwrap_err());
        assert_eq!(catch(|| 7).unwrap(), 7);
        let resumed = catch(|| resume(slot)).unwrap_err();
        assert_eq!(resumed.downcast_ref::<&str>(), Some(&"first"));
        resume(None);
    }

    #[test]
    fn c_strings_convert_both_ways() {
        let c = path_to_cstring(Path::new("/tmp/a b.gguf")).unwrap();
        assert_eq!(c.to_bytes(), b"/tmp/a b.gguf");
        assert!(path_to_cstring(Path::new("a\0b")).is_err());
        // SAFETY: a live C string and NULL.
        unsafe {
            assert_eq!(owned_lossy(c.as_ptr()), "/tmp/a b.gguf");
            assert_eq!(owned_lossy(std::ptr::null()), "");
            assert_eq!(borrowed_str(c.as_ptr()), Some("/tmp/a b.gguf"));
            assert_eq!(borrowed_str(std::ptr::null()), None);
            let invalid = CString::new(vec![0xff, 0xfe]).unwrap();
            assert_eq!(borrowed_str(invalid.as_ptr()), None);
            assert_eq!(owned_lossy(invalid.as_ptr()), "\u{fffd}\u{fffd}");
        }
    }
}
