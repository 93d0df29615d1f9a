//! Typed slots on a wrapper for the caches an upper floor builds from it
//! (as `http::Extensions` does for a request): a model's compiled chat
//! format, its vocabulary's table for constrained sampling, the control
//! tokens' texts. The wrapper owns the slots; the type stored is the
//! upper floor's own, so the first floor names none of them.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// One value of each type, built on first use and shared after.
#[derive(Default)]
pub(crate) struct Extensions {
    /// Each type's cell: built under its own lock, so a slow build (the
    /// constraint table takes about a second) holds up only the callers
    /// that wait for the same value.
    slots: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// A type's cell: empty until its first build succeeds.
type Cell<T> = Mutex<Option<Arc<T>>>;

impl Extensions {
    /// The value of type `T`, built by `init` on the first call (once, even
    /// when several threads ask at once); a failed build leaves the slot
    /// empty for the next call to try again.
    pub(crate) fn get_or_try_init<T, E>(&self, init: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E>
    where
        T: Send + Sync + 'static,
    {
        let cell = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = slots.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(Cell::<T>::new(None)));
            Arc::clone(slot)
                .downcast::<Cell<T>>()
                .unwrap_or_else(|_| unreachable!("each slot is keyed by its own cell's type"))
        };
        // A panic in `init` leaves the cell empty (it is set only after a
        // build returns), so a poisoned lock still holds a sound value.
        let mut value = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = &*value {
            return Ok(Arc::clone(value));
        }
        let built = Arc::new(init()?);
        *value = Some(Arc::clone(&built));
        Ok(built)
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.slots.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("Extensions").field("slots", &n).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn each_type_is_built_once_and_shared() {
        let ext = Extensions::default();
        let builds = AtomicUsize::new(0);
        let build = || {
            builds.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(String::from("table"))
        };
        let a = ext.get_or_try_init(build).unwrap();
        let b = ext.get_or_try_init(build).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        // Another type has a slot of its own.
        assert_eq!(*ext.get_or_try_init(|| Ok::<_, ()>(7u32)).unwrap(), 7);
        assert_eq!(*ext.get_or_try_init(|| Ok::<_, ()>(String::from("other"))).unwrap(), "table");
    }

    #[test]
    fn a_failed_build_is_tried_again() {
        let ext = Extensions::default();
        assert_eq!(ext.get_or_try_init(|| Err::<u8, _>("no")).unwrap_err(), "no");
        assert_eq!(*ext.get_or_try_init(|| Ok::<u8, &str>(3)).unwrap(), 3);
    }

    #[test]
    fn concurrent_callers_share_one_build() {
        let ext = Extensions::default();
        let builds = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    ext.get_or_try_init(|| {
                        builds.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok::<_, ()>(vec![1u8; 4])
                    })
                    .unwrap()
                });
            }
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }
}
