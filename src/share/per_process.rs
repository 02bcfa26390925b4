//! Process-wide state that a forked child starts afresh. A child has only the thread that
//! forked; a lock another thread held at that moment stays held in the child forever, so the
//! child never takes the parent's locks: it swaps in new state, and reads what the parent left
//! only if its lock is free. The parent's state is never freed (a few bytes per fork).

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

pub struct PerProcess<T: 'static> {
    current: AtomicPtr<Mutex<T>>,
    make: fn() -> T,
}

impl<T: 'static> PerProcess<T> {
    pub const fn new(make: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(ptr::null_mut()),
            make,
        }
    }

    /// The state, made on first use, locked (a poisoned lock is taken as it is: every change
    /// to the state is whole before anything can panic).
    pub fn lock(&self) -> MutexGuard<'static, T> {
        self.get().lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self) -> &'static Mutex<T> {
        let mut current = self.current.load(Ordering::Acquire);
        if current.is_null() {
            let made = Box::into_raw(Box::new(Mutex::new((self.make)())));
            current = match self.current.compare_exchange(
                ptr::null_mut(),
                made,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => made,
                Err(theirs) => {
                    // SAFETY: `made` was never published: ours alone, freed once.
                    drop(unsafe { Box::from_raw(made) });
                    theirs
                }
            };
        }
        // SAFETY: a published state is never freed (see the module doc).
        unsafe { &*current }
    }

    /// In a forked child: new state from now on, and the parent's, if there was any and its
    /// lock is free.
    pub fn renew(&self) -> Option<MutexGuard<'static, T>> {
        let fresh = Box::into_raw(Box::new(Mutex::new((self.make)())));
        let old = self.current.swap(fresh, Ordering::AcqRel);
        if old.is_null() {
            return None;
        }
        // SAFETY: a published state is never freed.
        let old: &'static Mutex<T> = unsafe { &*old };
        match old.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static STATE: PerProcess<Vec<u32>> = PerProcess::new(Vec::new);

    #[test]
    fn renewing_starts_afresh_and_hands_back_the_old() {
        STATE.lock().push(1);
        assert_eq!(*STATE.lock(), [1]);
        let old = STATE.renew().unwrap();
        assert_eq!(*old, [1]);
        assert!(STATE.lock().is_empty());
        // The old state stays locked by `old`; renewing again can't read it.
        let held = STATE.renew().unwrap();
        assert!(held.is_empty());
        drop((old, held));
    }
}
