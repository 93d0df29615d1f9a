//! Runtime CPU dispatch (the build script's `build/cpu_variants.rs` has the
//! design): which of the CPU variants linked into this build
//! ([`CPU_VARIANTS`](crate::CPU_VARIANTS)) runs on this CPU.

/// The variant of ggml's CPU backend that runs on this CPU, one of
/// [`CPU_VARIANTS`](crate::CPU_VARIANTS): the one ggml's score of each
/// ranks best among those this CPU supports, or the one the environment
/// variable `LLAMA_CPU_VARIANT` names if it is linked in and this CPU can
/// run it. Chosen once per process (here or when ggml's backend registry
/// is first used, whichever comes first). `None` in a build without
/// dispatch, and on a CPU that can run none of the variants.
pub fn cpu_variant() -> Option<&'static str> {
    #[cfg(llama_sys_cpu_dispatch)]
    {
        // SAFETY: the dispatcher (shim/cpu_dispatch.cpp) returns NULL or a
        // pointer to a NUL-terminated string literal of its variant table,
        // which lives for the whole process; choosing is thread-safe (a
        // function-local static).
        let name = unsafe { llama_sys_cpu_variant() };
        if name.is_null() {
            return None;
        }
        // SAFETY: as above; the names are ASCII (cpu_variants.rs checks them).
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        crate::CPU_VARIANTS.iter().copied().find(|v| v.as_bytes() == name.to_bytes())
    }
    #[cfg(not(llama_sys_cpu_dispatch))]
    None
}

/// ggml's score of [`cpu_variant`] on this CPU (higher is better; 0 when
/// none runs or without dispatch).
pub fn cpu_variant_score() -> i32 {
    #[cfg(llama_sys_cpu_dispatch)]
    {
        // SAFETY: no arguments, no preconditions; see `cpu_variant`.
        unsafe { llama_sys_cpu_variant_score() }
    }
    #[cfg(not(llama_sys_cpu_dispatch))]
    0
}

/// What became of `LLAMA_CPU_VARIANT`: `None` if it was unset (or the
/// build does not dispatch), `Some(true)` if the named variant runs,
/// `Some(false)` if it was ignored because it is not linked in or this CPU
/// cannot run it.
pub fn cpu_variant_forced() -> Option<bool> {
    #[cfg(llama_sys_cpu_dispatch)]
    {
        // SAFETY: no arguments, no preconditions; see `cpu_variant`.
        match unsafe { llama_sys_cpu_variant_forced() } {
            0 => None,
            f => Some(f > 0),
        }
    }
    #[cfg(not(llama_sys_cpu_dispatch))]
    None
}

#[cfg(llama_sys_cpu_dispatch)]
unsafe extern "C" {
    fn llama_sys_cpu_variant() -> *const std::ffi::c_char;
    fn llama_sys_cpu_variant_score() -> std::ffi::c_int;
    fn llama_sys_cpu_variant_forced() -> std::ffi::c_int;
}
