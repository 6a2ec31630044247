//! What every entry point needs: errno, no panic across the boundary, and checked handles.
//!
//! Each object handed to C is a `#[repr(C)]` Rust struct whose first field is the C structure,
//! so the pointer a program holds is the pointer to the whole object. Live objects are kept in
//! a registry by address and kind: a destroyed, foreign or mistyped handle is refused with
//! EINVAL instead of being dereferenced (the hot paths, `post_send`/`post_recv`/`poll_cq`,
//! which rdma-core does not check either, only test for NULL).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; a panic becomes `on_panic` with errno EIO (a Rust panic must not unwind into C).
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// NULL with errno `e`: how pointer-returning verbs fail.
pub(crate) fn fail_null<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// The kinds of objects handed to C.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Context,
    Pd,
    Mr,
    Cq,
    Channel,
    Qp,
    Ah,
    Srq,
    EventChannel,
    CmId,
    CmEvent,
}

fn live() -> MutexGuard<'static, HashMap<usize, Kind>> {
    static LIVE: LazyLock<Mutex<HashMap<usize, Kind>>> = LazyLock::new(Default::default);
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A Rust object that C holds by a pointer to its first field.
pub(crate) trait Handle: Sized {
    /// The C structure at the front of `Self`.
    type C;
    const KIND: Kind;

    /// Boxes `self`, records it live and returns the pointer C gets.
    fn into_c(self) -> *mut Self::C {
        let p = Box::into_raw(Box::new(self));
        live().insert(p as usize, Self::KIND);
        p.cast()
    }

    /// The object behind a handle C passed in, if it is a live object of this kind.
    ///
    /// # Safety
    /// The returned reference is valid until the object is destroyed; callers must not keep
    /// it past the call that received the handle.
    unsafe fn from_c<'a>(p: *const Self::C) -> Option<&'a Self> {
        if p.is_null() || live().get(&(p as usize)) != Some(&Self::KIND) {
            return None;
        }
        // SAFETY: the registry holds only pointers made by `into_c` for this kind and not yet
        // taken back by `take`, so `p` points to a live `Self`.
        Some(unsafe { &*(p as *const Self) })
    }

    /// The object behind a handle on a hot path: only NULL is checked, as in rdma-core.
    ///
    /// # Safety
    /// `p` must be NULL or a live handle of this kind.
    unsafe fn from_c_unchecked<'a>(p: *const Self::C) -> Option<&'a Self> {
        // SAFETY: per the contract, a non-NULL `p` came from `into_c` and is live.
        (!p.is_null()).then(|| unsafe { &*(p as *const Self) })
    }

    /// Takes the object back from C (for destruction); `None` if `p` is not a live handle of
    /// this kind (already destroyed, say).
    ///
    /// # Safety
    /// No other thread may be using the object (the C API's rule for destroy calls).
    unsafe fn take(p: *mut Self::C) -> Option<Box<Self>> {
        let mut l = live();
        if p.is_null() || l.get(&(p as usize)) != Some(&Self::KIND) {
            return None;
        }
        l.remove(&(p as usize));
        // SAFETY: as in `from_c`, and it is now out of the registry, so this is the only owner.
        Some(unsafe { Box::from_raw(p as *mut Self) })
    }
}

/// Copies `s` into a fixed C char array, NUL-terminated and truncated to fit.
pub(crate) fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}
