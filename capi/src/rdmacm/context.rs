//! The device contexts ids show in `id->verbs`: one `ibv_context` for each softrdma context the
//! connection manager uses, wrapped on first use and kept for the life of the process (as
//! librdmacm keeps each device open), with the default PD librdmacm allocates per device.

use std::sync::Mutex;

use softrdma::verbs::Context;

use crate::abi::*;
use crate::verbs::context::wrap;
use crate::verbs::device;

#[derive(Clone, Copy)]
pub(crate) struct CmDev {
    pub verbs: *mut ibv_context,
    pub pd: *mut ibv_pd,
}

/// By the context's async fd, which identifies the softrdma context (its clones share it) and
/// stays unique while it is open: the connection manager's contexts never close.
static DEVS: Mutex<Vec<(i32, usize, usize)>> = Mutex::new(Vec::new());

/// The `ibv_context` (and default PD) for one of the connection manager's contexts.
pub(crate) fn cm_dev(ctx: &Context) -> Result<CmDev, i32> {
    let key = ctx.async_fd();
    let mut all = DEVS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, v, p)) = all.iter().find(|(k, _, _)| *k == key) {
        return Ok(CmDev {
            verbs: v as *mut ibv_context,
            pd: p as *mut ibv_pd,
        });
    }
    let dev = device::current()?
        .into_iter()
        .find(|d| d.device().name() == ctx.device().name())
        .ok_or(libc::ENODEV)?;
    let verbs = wrap(ctx.clone(), dev);
    // SAFETY: `verbs` is the live context just made.
    let pd = unsafe { crate::verbs::pd::ibv_alloc_pd(verbs) };
    if pd.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    all.push((key, verbs as usize, pd as usize));
    Ok(CmDev { verbs, pd })
}

/// Every device's context, for `rdma_get_devices`.
pub(crate) fn all() -> Result<Vec<CmDev>, i32> {
    let ctxs = softrdma::rdma_cm::device_contexts().map_err(|e| e.errno())?;
    ctxs.iter().map(cm_dev).collect()
}
