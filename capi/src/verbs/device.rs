//! The device list: `ibv_get_device_list`, `ibv_get_device_name`, `ibv_get_device_guid`.
//!
//! Devices live for the whole process, as in rdma-core (a program may keep an `ibv_device *`
//! after `ibv_free_device_list` as long as it has a context open on it, and many do).

use std::ffi::c_char;
use std::sync::Mutex;

use softrdma::verbs::{devices, Device};

use crate::abi::*;
use crate::handle::{copy_cstr, fail_null, guard, set_errno};

/// `struct ibv_device` with the softrdma device behind it.
#[repr(C)]
pub(crate) struct Dev {
    pub ibv: ibv_device,
    pub rust: Mutex<Device>,
    pub index: i32,
}

/// Every device ever listed, by name; never freed.
static DEVICES: Mutex<Vec<&'static Dev>> = Mutex::new(Vec::new());

impl Dev {
    fn new(d: Device, index: i32) -> &'static Dev {
        // SAFETY: ibv_device is plain C data (integers, char arrays, NULL-able function
        // pointers), for which all-zero is a valid value.
        let mut ibv: ibv_device = unsafe { std::mem::zeroed() };
        ibv.node_type = IBV_NODE_CA;
        ibv.transport_type = IBV_TRANSPORT_IB;
        copy_cstr(&mut ibv.name, d.name());
        copy_cstr(&mut ibv.dev_name, &format!("uverbs{index}"));
        copy_cstr(
            &mut ibv.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        copy_cstr(
            &mut ibv.ibdev_path,
            &format!("/sys/class/infiniband/{}", d.name()),
        );
        Box::leak(Box::new(Dev {
            ibv,
            rust: Mutex::new(d),
            index,
        }))
    }

    /// The device behind a pointer C passed in, if it is one of ours.
    pub(crate) fn from_c(p: *const ibv_device) -> Option<&'static Dev> {
        DEVICES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .find(|d| std::ptr::eq(&d.ibv, p))
    }

    pub(crate) fn device(&self) -> Device {
        self.rust.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The current devices, refreshed from the interfaces; a device seen before keeps its pointer.
pub(crate) fn current() -> Result<Vec<&'static Dev>, i32> {
    let now = devices().map_err(|e| e.errno())?;
    let mut all = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(now.len());
    for d in now {
        let dev = match all.iter().copied().find(|x| x.device().name() == d.name()) {
            Some(x) => {
                *x.rust.lock().unwrap_or_else(|e| e.into_inner()) = d;
                x
            }
            None => {
                let x = Dev::new(d, all.len() as i32);
                all.push(x);
                x
            }
        };
        out.push(dev);
    }
    Ok(out)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut i32) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let list = match current() {
            Ok(l) => l,
            Err(e) => return fail_null(e),
        };
        // SAFETY: calloc has no preconditions; the result is checked. The array is freed by
        // ibv_free_device_list with free(), as rdma-core's is.
        let arr = unsafe { libc::calloc(list.len() + 1, std::mem::size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if arr.is_null() {
            return fail_null(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: `arr` has list.len() + 1 slots.
            unsafe { *arr.add(i) = &d.ibv as *const ibv_device as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL.
            unsafe { *num_devices = list.len() as i32 };
        }
        arr
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
    unsafe { libc::free(list.cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match Dev::from_c(device) {
        Some(d) => d.ibv.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    }
}

/// The node GUID in network byte order (`__be64`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    match Dev::from_c(device) {
        Some(d) => d.device().guid().to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> i32 {
    match Dev::from_c(device) {
        Some(d) => d.index,
        None => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

versioned!(
    ibv_get_device_list @ "IBVERBS_1.1",
    ibv_free_device_list @ "IBVERBS_1.1",
    ibv_get_device_name @ "IBVERBS_1.1",
    ibv_get_device_guid @ "IBVERBS_1.1",
    ibv_get_device_index @ "IBVERBS_1.9",
);
