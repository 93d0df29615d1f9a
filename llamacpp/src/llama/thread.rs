//! Calls made on another thread: a kept thread that runs the jobs sent to
//! it ([`CallThread`]), and the wrapper that moves raw pointers to it
//! ([`SendPtr`]).
//!
//! Two parts of the crate run llama.cpp calls off the caller's thread: the
//! deep-stack helper (`crate::llama::stack`: a thread with a stack sized for the
//! input) and, with feature `rpc`, the RPC guard (`crate::rpc`: a thread
//! that may stay blocked in llama.cpp for good when a worker dies). Both
//! use this module, which imports nothing else of the crate, so that the
//! model and context code reach neither through the other.

use std::sync::mpsc;

/// A job for a [`CallThread`].
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// What dropping a [`CallThread`] does with its thread once the job channel is
/// closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnDrop {
    /// Wait for the thread to end (it is idle or finishing its last job).
    Join,
    /// Leave it: it may be blocked for good (an abandoned RPC call).
    // Only the RPC guard detaches.
    #[cfg_attr(not(feature = "rpc"), allow(dead_code))]
    Detach,
}

/// A thread, kept for repeated calls, that runs the jobs sent to it one
/// at a time, in order, until the [`CallThread`] is dropped.
#[derive(Debug)]
pub(crate) struct CallThread {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CallThread {
    /// Starts the thread, named `name`, with a stack of `stack` bytes (the
    /// standard library's default for `None`).
    ///
    /// # Errors
    /// The thread cannot be created (no address space for its stack, or
    /// the system's thread limit).
    pub(crate) fn spawn(name: &str, stack: Option<usize>, on_drop: OnDrop) -> std::io::Result<CallThread> {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let mut builder = std::thread::Builder::new().name(name.into());
        if let Some(stack) = stack {
            builder = builder.stack_size(stack);
        }
        let thread = builder.spawn(move || {
            for job in job_rx {
                job();
            }
        })?;
        Ok(CallThread { jobs: Some(jobs), thread: (on_drop == OnDrop::Join).then_some(thread) })
    }

    /// Queues `job` on the thread without waiting for it.
    ///
    /// # Errors
    /// The job back, unrun, if the thread is gone.
    pub(crate) fn send(&self, job: Job) -> Result<(), Job> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Runs `f` on the thread and waits for it: its result, or its panic as
    /// `Err`, inside `Some`. Unlike [`CallThread::send`], `f` may borrow from
    /// the caller. `None` if the thread is gone (`f` was dropped unrun).
    pub(crate) fn call<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Option<std::thread::Result<R>> {
        let mut result: Option<std::thread::Result<R>> = None;
        let slot = &mut result;
        let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
            *slot = Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        // SAFETY: only the lifetime is erased. The job borrows `result` and
        // whatever `f` borrows. It is wrapped in a job that owns the only
        // sender of `done` and signals it after the borrowing job has run to
        // its end (and been dropped). This function waits on `done` before
        // it returns, so it does not return before the borrowing job ran, or
        // was dropped unrun (the wrapper dropped unrun on a gone thread, or
        // handed back by `send`: the sender of `done` is dropped with it and
        // the wait ends with an error). The job catches panics of `f`, and
        // nothing between the send and the end of the wait can unwind.
        let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Job>(job) };
        let (done_tx, done) = mpsc::sync_channel::<()>(1);
        let wrapper: Job = Box::new(move || {
            job();
            let _ = done_tx.send(());
        });
        let ran = match self.send(wrapper) {
            Ok(()) => done.recv().is_ok(),
            Err(unrun) => {
                drop(unrun);
                false
            }
        };
        if ran { result } else { None }
    }
}

impl Drop for CallThread {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop (after the job it
        // runs, if any).
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A value holding raw pointers (one pointer, or a tuple of them with what
/// they point into) moved to a thread that uses it only while its owner
/// waits for that thread: a scoped thread of `crate::llama::stack`, a [`CallThread`]
/// call, or a guarded RPC call (which, once abandoned, its owner never
/// touches again); or not moved at all, when the same call runs in place
/// for a local model (`model::Remote`, `context::Calls`). The pointees are
/// used by one thread at a time, as on the owner's thread.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) T);

// SAFETY: see the type's doc: every use hands the value to one other
// thread while the owning thread waits for it (`with_stack` joins its
// scoped thread, `CallThread::call` and the RPC guard wait for the call's
// result), so the pointees are never used by two threads at once; and they
// (llama.cpp models, contexts, samplers, vocabularies, batches, parameter
// structs) have no thread affinity.
unsafe impl<T> Send for SendPtr<T> {}

impl<T: Copy> SendPtr<T> {
    /// Reads the pointer (a method, so closures capture the whole
    /// wrapper, not the raw field).
    pub(crate) fn get(self) -> T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_runs_borrowing_calls_and_queued_jobs_in_order() {
        let worker = CallThread::spawn("test-worker", None, OnDrop::Join).unwrap();
        let me = std::thread::current().id();
        let mut data = vec![1, 2];
        let id = worker.call(|| {
            data.push(3);
            std::thread::current().id()
        });
        let id = id.unwrap().unwrap();
        assert_ne!(id, me);
        assert_eq!(data, [1, 2, 3]);
        let (tx, rx) = mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            assert!(worker.send(Box::new(move || tx.send((i, std::thread::current().id())).unwrap())).is_ok());
        }
        let got: Vec<_> = rx.iter().take(3).collect();
        assert_eq!(got, [(0, id), (1, id), (2, id)]);
        let panic = worker.call(|| panic!("in the worker")).unwrap().unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"in the worker"));
        assert_eq!(worker.call(|| 7).unwrap().unwrap(), 7);
    }

    #[test]
    fn a_detached_worker_is_not_waited_for() {
        let worker = CallThread::spawn("test-detached", None, OnDrop::Detach).unwrap();
        let (release, wait) = mpsc::channel::<()>();
        let job: Job = Box::new(move || {
            let _ = wait.recv();
        });
        assert!(worker.send(job).is_ok());
        // The thread is blocked in its job: dropping does not wait for it.
        drop(worker);
        drop(release);
    }
}
